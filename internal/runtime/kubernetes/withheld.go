package kubernetes

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/moat-sandbox/moat/internal/egress/mitm"
	"github.com/moat-sandbox/moat/internal/egress/sidecar"
	"github.com/moat-sandbox/moat/internal/errdefs"
)

// The credentials a pod's proxy withholds wait in its sidecar
// (sidecar.WithheldPath); for each sandbox whose proxy it attached, the
// server holds a long poll open to the sidecar with the sandbox's egress
// token and hands each report to the lifecycle's withheld function (the
// sandbox's CredentialWithheld event and audit record), as the native
// runtime's proxy does in process. The watch ends with Detach (the
// sandbox's deletion), when the sandbox is gone, or with the runtime.

// Bounds of a withheld watch.
const (
	// withheldWait is how long one poll waits for a report.
	withheldWait = 30 * time.Second
	// withheldRetry is the first pause after a failed poll (a sidecar
	// restarting, a paused pod), doubled up to withheldWait.
	withheldRetry = time.Second
)

// withheldWatch is one sandbox's watch: its withheld function (replaced
// when the proxy is attached again) and its stop.
type withheldWatch struct {
	fn   atomic.Pointer[func(context.Context, mitm.Withheld)]
	stop context.CancelFunc
}

// watchWithheld has fn told of the credentials sandbox id's proxy
// withholds, from now until the watch ends.
func (e *Egress) watchWithheld(id string, fn func(context.Context, mitm.Withheld)) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.stopped {
		return
	}
	if w, ok := e.watching[id]; ok {
		w.fn.Store(&fn)
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	w := &withheldWatch{stop: cancel}
	w.fn.Store(&fn)
	e.watching[id] = w
	e.wg.Go(func() {
		e.pollWithheld(ctx, id, w)
		e.mu.Lock()
		if e.watching[id] == w {
			delete(e.watching, id)
		}
		e.mu.Unlock()
		cancel()
	})
}

// unwatch ends sandbox id's watch, if any.
func (e *Egress) unwatch(id string) {
	e.mu.Lock()
	w, ok := e.watching[id]
	delete(e.watching, id)
	e.mu.Unlock()
	if ok {
		w.stop()
	}
}

// close ends every watch and waits for them.
func (e *Egress) close() {
	if e == nil {
		return
	}
	e.mu.Lock()
	e.stopped = true
	for id, w := range e.watching {
		w.stop()
		delete(e.watching, id)
	}
	e.mu.Unlock()
	e.wg.Wait()
}

// pollWithheld takes sandbox id's withheld reports from its sidecar until
// ctx ends or the sandbox is gone.
func (e *Egress) pollWithheld(ctx context.Context, id string, w *withheldWatch) {
	log := e.rt.cfg.Logger
	retry := withheldRetry
	var tok string
	for ctx.Err() == nil {
		reports, err := func() ([]sidecar.WithheldReport, error) {
			if tok == "" {
				t, err := e.token(ctx, id)
				if err != nil {
					return nil, err
				}
				tok = t
			}
			code, data, err := e.sendWithin(ctx, id, tok, http.MethodGet, sidecar.WithheldPath+"?wait="+strconv.Itoa(int(withheldWait/time.Second)), nil,
				withheldWait+e.rt.cfg.EgressTimeout)
			if err != nil {
				return nil, err
			}
			switch code {
			case http.StatusOK:
			case http.StatusNotFound:
				// A sidecar of an older moat: it keeps no reports.
				return nil, errdefs.Newf(errdefs.ErrNotImplemented, "sandbox %s: its egress sidecar keeps no withheld credentials", id)
			default:
				tok = "" // read again: the pod may have been made again
				return nil, errdefs.Newf(errdefs.ErrUnavailable, "sandbox %s: egress sidecar answered %d to %s", id, code, sidecar.WithheldPath)
			}
			var resp sidecar.WithheldResponse
			if err := json.Unmarshal(data, &resp); err != nil {
				return nil, errdefs.Newf(errdefs.ErrUnavailable, "sandbox %s: egress sidecar answer to %s: %v", id, sidecar.WithheldPath, err)
			}
			if resp.Dropped > 0 {
				log.Warn("egress sidecar dropped withheld-credential reports", "id", id, "dropped", resp.Dropped)
			}
			return resp.Withheld, nil
		}()
		switch {
		case ctx.Err() != nil:
			return
		case errdefs.IsNotFound(err) || errdefs.IsNotImplemented(err):
			log.Debug("withheld credentials: watch ends", "id", id, "err", err)
			return
		case err != nil:
			log.Debug("withheld credentials: poll", "id", id, "err", err)
			select {
			case <-ctx.Done():
				return
			case <-time.After(retry):
			}
			retry = min(2*retry, withheldWait)
			continue
		}
		retry = withheldRetry
		fn := *w.fn.Load()
		for _, r := range reports {
			fn(ctx, mitm.Withheld{Binding: r.Binding, Host: r.Host, Dst: r.Dst})
		}
	}
}
