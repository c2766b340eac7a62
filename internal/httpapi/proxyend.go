package httpapi

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"

	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/execd/wire"
	"github.com/moat-sandbox/moat/internal/lifecycle"
	"github.com/moat-sandbox/moat/internal/web"
)

// Proxied exchanges with a sandbox that ends. A dead sandbox cannot always
// reset its connections (a gVisor sandbox's network stack dies with it),
// so a proxied request would wait for a TCP timeout, minutes. The proxy
// ends it the moment the sandbox ends instead: an event stream of the
// agent gets a last "error" event naming the reason (the agent's own
// framing, so SDKs report it as the command's failure) and ends cleanly;
// any other response already under way is cut (the client sees the
// connection abort); a request still waiting for its answer gets the
// API error of an ended sandbox (409 SANDBOX::NOT_RUNNING with the
// reason).

// errSandboxEnded fails the proxy's writes once the sandbox has ended.
var errSandboxEnded = errors.New("the sandbox has ended")

// serveUntilEnded serves r through the reverse proxy until the exchange
// ends or the sandbox does (ep.Ended). agent tells the request goes to
// the agent port.
func (p *proxy) serveUntilEnded(w http.ResponseWriter, r *http.Request, id string, ep lifecycle.Endpoint, agent bool) {
	if ep.Ended == nil {
		web.ServeProxy(p.rp, w, r)
		return
	}
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	ew := &endingWriter{ResponseWriter: w}
	stop, watched := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(watched)
		select {
		case <-stop:
			return
		case <-ep.Ended:
		}
		ew.end(agent, id, ep.EndStatus())
		cancel()
	}()
	defer func() {
		close(stop)
		<-watched
		v := recover()
		if v != nil && (v != http.ErrAbortHandler || !ew.endedClean()) {
			panic(v) // a cut response aborts the connection
		}
		if ew.endedBeforeAnswer() {
			// The answer never started: say why, in the API's shape.
			for k := range w.Header() {
				delete(w.Header(), k)
			}
			st := ep.EndStatus()
			p.web.WriteError(w, r, errdefs.WithPublic(fmt.Errorf("sandbox %s ended: %w", id, errdefs.ErrFailedPrecondition),
				"SANDBOX::NOT_RUNNING", endedMessage(id, st)))
		}
	}()
	web.ServeProxy(p.rp, ew, r.WithContext(ctx))
}

// endedMessage says why sandbox id ended, from its last status.
func endedMessage(id string, st lifecycle.Status) string {
	msg := fmt.Sprintf("sandbox %s is %s", id, st.State)
	if st.Message != "" {
		msg += ": " + st.Message
	}
	return msg
}

// endingWriter is the proxy's ResponseWriter for a sandbox that may end
// mid-exchange: end stops every later write of the proxy, after writing
// the last event of an agent event stream.
type endingWriter struct {
	http.ResponseWriter
	mu          sync.Mutex
	wroteHeader bool
	sse         bool // the response is an event stream
	hijacked    bool // a protocol upgrade (WebSocket) took the connection
	ended       bool
	finalEvent  bool // end wrote the last event
}

// end marks the exchange ended; for an event stream of the agent it
// writes an error event with the reason first.
func (w *endingWriter) end(agent bool, id string, st lifecycle.Status) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.ended || w.hijacked {
		w.ended = true
		return
	}
	w.ended = true
	if !w.wroteHeader || !w.sse || !agent {
		return
	}
	name := st.Reason
	if name == "" {
		name = "SANDBOX_ENDED"
	}
	frame := wire.AppendEvent(nil, wire.Event{Type: wire.EvError, Error: &wire.EventError{
		EName: name, EValue: endedMessage(id, st), Traceback: []string{},
	}})
	if _, err := w.ResponseWriter.Write(frame); err == nil {
		http.NewResponseController(w.ResponseWriter).Flush()
		w.finalEvent = true
	}
}

// endedClean reports that end closed the exchange with a last event, so
// it may finish normally.
func (w *endingWriter) endedClean() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.finalEvent
}

// endedBeforeAnswer reports that the sandbox ended before the answer
// started.
func (w *endingWriter) endedBeforeAnswer() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.ended && !w.wroteHeader && !w.hijacked
}

func (w *endingWriter) WriteHeader(code int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.ended {
		return
	}
	w.writeHeaderLocked(code)
}

func (w *endingWriter) writeHeaderLocked(code int) {
	if code >= 200 && !w.wroteHeader {
		w.wroteHeader = true
		w.sse = strings.HasPrefix(w.Header().Get("Content-Type"), "text/event-stream")
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *endingWriter) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.ended {
		return 0, errSandboxEnded
	}
	if !w.wroteHeader {
		w.writeHeaderLocked(http.StatusOK)
	}
	return w.ResponseWriter.Write(b)
}

// FlushError flushes (http.ResponseController finds it).
func (w *endingWriter) FlushError() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.ended {
		return errSandboxEnded
	}
	return http.NewResponseController(w.ResponseWriter).Flush()
}

// Hijack hands the connection to a protocol upgrade (WebSocket); the
// proxy closes it when the request's context ends.
func (w *endingWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.ended {
		return nil, nil, errSandboxEnded
	}
	c, rw, err := http.NewResponseController(w.ResponseWriter).Hijack()
	if err == nil {
		w.hijacked = true
	}
	return c, rw, err
}

// Unwrap lets http.ResponseController reach the server's writer (full
// duplex, deadlines).
func (w *endingWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
