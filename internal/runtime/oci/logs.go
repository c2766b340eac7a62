package oci

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/runtime"
)

// The agent's stdout and stderr go straight to sandboxes/<id>/agent.log:
// the container inherits the descriptor (opened O_APPEND), so moat never
// copies the output and the file is bounded by TrimLogs, not by a pipe.

func (r *Runtime) logPath(id string) string { return filepath.Join(r.sandboxDir(id), "agent.log") }

// Logs implements runtime.LogReader: the end of agent.log.
func (r *Runtime) Logs(ctx context.Context, id string, max int64) ([]byte, bool, error) {
	if !runtime.ValidID(id) {
		return nil, false, fmt.Errorf("sandbox %q: %w", id, errdefs.ErrNotFound)
	}
	f, err := os.Open(r.logPath(id))
	if errors.Is(err, fs.ErrNotExist) {
		if exists(r.sandboxDir(id)) {
			return nil, false, nil
		}
		return nil, false, fmt.Errorf("sandbox %q: %w", id, errdefs.ErrNotFound)
	}
	if err != nil {
		return nil, false, fmt.Errorf("oci: open log: %w", err)
	}
	defer f.Close()
	return readTail(f, max)
}

// readTail reads at most max bytes from the end of f.
func readTail(f *os.File, max int64) ([]byte, bool, error) {
	fi, err := f.Stat()
	if err != nil {
		return nil, false, fmt.Errorf("oci: stat log: %w", err)
	}
	size := fi.Size()
	off, truncated := int64(0), false
	if max > 0 && size > max {
		off, truncated = size-max, true
	}
	data, err := io.ReadAll(io.NewSectionReader(f, off, size-off))
	if err != nil {
		return nil, false, fmt.Errorf("oci: read log: %w", err)
	}
	return data, truncated, nil
}

// TrimLogs implements runtime.LogTrimmer. A log over max keeps its last
// max/2 bytes. The container writes with O_APPEND, so after the truncate
// its next write lands at the new end; output written between the read
// and the truncate (microseconds) is lost, which a console log tolerates.
func (r *Runtime) TrimLogs(ctx context.Context, max int64) error {
	if max <= 0 {
		return nil
	}
	ents, err := os.ReadDir(r.sandboxesDir())
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("oci: %w", err)
	}
	var errs []error
	for _, e := range ents {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err := trimLog(r.logPath(e.Name()), max); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func trimLog(path string, max int64) error {
	fi, err := os.Stat(path)
	if err != nil || fi.Size() <= max {
		return nil
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("oci: trim %s: %w", path, err)
	}
	defer f.Close()
	keep, _, err := readTail(f, max/2)
	if err != nil {
		return err
	}
	if err := f.Truncate(0); err != nil {
		return fmt.Errorf("oci: trim %s: %w", path, err)
	}
	if _, err := f.WriteAt(keep, 0); err != nil {
		return fmt.Errorf("oci: trim %s: %w", path, err)
	}
	return nil
}
