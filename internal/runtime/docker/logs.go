package docker

import (
	"bytes"
	"context"
	"io"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/api/pkg/stdcopy"
	"github.com/moby/moby/client"
)

// Logs implements runtime.LogReader through the daemon's container logs
// (the daemon's log driver bounds them; moat does not).
func (r *Runtime) Logs(ctx context.Context, id string, max int64) ([]byte, bool, error) {
	c, err := r.inspect(ctx, id)
	if err != nil {
		return nil, false, err
	}
	rc, err := r.cli.ContainerLogs(ctx, c.ID, client.ContainerLogsOptions{ShowStdout: true, ShowStderr: true})
	if err != nil {
		if cerrdefs.IsNotFound(err) {
			return nil, false, notFound(id)
		}
		return nil, false, classify("logs "+id, err)
	}
	defer rc.Close()
	w := &tailBuffer{max: max}
	if c.Config != nil && c.Config.Tty {
		_, err = io.Copy(w, rc)
	} else {
		_, err = stdcopy.StdCopy(w, w, rc)
	}
	if err != nil {
		return nil, false, classify("logs "+id, err)
	}
	data := w.Bytes()
	return data, w.truncated, nil
}

// tailBuffer keeps the last max bytes written to it (all if max <= 0).
type tailBuffer struct {
	buf       bytes.Buffer
	max       int64
	truncated bool
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	n := len(p)
	t.buf.Write(p)
	if t.max > 0 && int64(t.buf.Len()) > 2*t.max {
		t.compact()
	}
	return n, nil
}

func (t *tailBuffer) compact() {
	if t.max <= 0 || int64(t.buf.Len()) <= t.max {
		return
	}
	keep := append([]byte(nil), t.buf.Bytes()[int64(t.buf.Len())-t.max:]...)
	t.buf.Reset()
	t.buf.Write(keep)
	t.truncated = true
}

// Bytes returns the kept tail.
func (t *tailBuffer) Bytes() []byte { t.compact(); return t.buf.Bytes() }
