package e2bcode

import (
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/moat-sandbox/moat/internal/execd/wire"
)

// keepaliveInterval is how long a stream stays silent before a keepalive
// line (the server's KEEPALIVE_INTERVAL).
const keepaliveInterval = 5 * time.Second

// unauthorizedBody is the server's 401 body.
const unauthorizedBody = "Unauthorized"

// execute serves POST /execute: it runs code in a context and streams
// NDJSON: number_of_executions, stdout/stderr chunks, results, at most one
// error, and always end_of_execution last.
func (s *Service) execute(w http.ResponseWriter, r *http.Request) {
	if !s.authorized(r) {
		writeText(w, http.StatusUnauthorized, unauthorizedBody)
		return
	}
	var req struct {
		Code      *string           `json:"code"`
		ContextID string            `json:"context_id"`
		Language  string            `json:"language"`
		EnvVars   map[string]string `json:"env_vars"`
	}
	if err := decodeBody(r, &req, false); err != nil {
		writeText(w, http.StatusUnprocessableEntity, err.Error())
		return
	}
	if req.Code == nil {
		writeText(w, http.StatusUnprocessableEntity, "code is required")
		return
	}
	if req.ContextID != "" && req.Language != "" {
		writeText(w, http.StatusBadRequest, "Only one of context_id or language can be provided")
		return
	}
	if err := checkEnv(req.EnvVars); err != nil {
		writeText(w, http.StatusBadRequest, err.Error())
		return
	}
	id := req.ContextID
	if id == "" {
		var err error
		if id, err = s.defaultContext(r.Context(), normalizeLanguage(req.Language)); err != nil {
			writeError(w, err)
			return
		}
	}
	c, err := s.code.Lookup(id)
	if err != nil {
		writeContextError(w, id, err)
		return
	}
	cell, cleanup, err := withEnv(normalizeLanguage(c.Language), *req.Code, req.EnvVars)
	if err != nil {
		writeText(w, http.StatusBadRequest, err.Error())
		return
	}

	out := newNDJSON(w)
	defer out.stop()
	final, err := s.code.Exec(r.Context(), id, cell, out)
	switch {
	case err != nil && !out.started():
		writeContextError(w, id, err)
		return
	case err != nil:
		final = &wire.EventError{EName: "UnexpectedEndOfExecution", EValue: err.Error()}
	}
	if final != nil {
		out.send(errorItem(final))
	}
	if cleanup != "" && err == nil {
		// Put the environment back, as the server's background
		// execution does; its output is nobody's.
		s.code.Exec(r.Context(), id, cleanup, discard{})
	}
	out.send(map[string]any{"type": "end_of_execution"})
}

// errorItem is E2B's error item: the traceback is one string.
func errorItem(e *wire.EventError) map[string]any {
	return map[string]any{"type": "error", "name": e.EName, "value": e.EValue, "traceback": strings.Join(e.Traceback, "")}
}

// discard is a sink that drops every event.
type discard struct{}

func (discard) Send(wire.Event) error { return nil }

// ndjson writes a stream of E2B output items, one JSON object a line,
// flushed each, with keepalives while the cell is silent. It is the sink
// of code's events: it maps them to E2B's items.
type ndjson struct {
	w  http.ResponseWriter
	rc *http.ResponseController

	mu      sync.Mutex
	begun   bool // headers are sent (guarded by mu)
	err     error
	last    time.Time // of the last line (guarded by mu)
	mainRes bool      // the next result is the cell's value (guarded by mu)

	stopOnce sync.Once
	quit     chan struct{}
	done     chan struct{}
}

func newNDJSON(w http.ResponseWriter) *ndjson {
	n := &ndjson{w: w, rc: http.NewResponseController(w), quit: make(chan struct{}), done: make(chan struct{})}
	go n.keepalive()
	return n
}

// keepalive sends a keepalive line after every keepaliveInterval without
// output, once the stream has begun.
func (n *ndjson) keepalive() {
	defer close(n.done)
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-n.quit:
			return
		case <-t.C:
			n.mu.Lock()
			due := n.begun && time.Since(n.last) >= keepaliveInterval
			n.mu.Unlock()
			if due {
				n.send(map[string]any{"type": "keepalive"})
			}
		}
	}
}

// stop ends the keepalives and waits for them.
func (n *ndjson) stop() {
	n.stopOnce.Do(func() { close(n.quit) })
	<-n.done
}

func (n *ndjson) started() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.begun
}

// send writes one item and flushes it.
func (n *ndjson) send(item map[string]any) error {
	b, err := json.Marshal(item)
	if err != nil {
		return err
	}
	b = append(b, '\n')
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.err != nil {
		return n.err
	}
	if !n.begun {
		h := n.w.Header()
		h.Set("Content-Type", "application/x-ndjson")
		h.Set("Cache-Control", "no-cache")
		h.Set("X-Accel-Buffering", "no")
		n.w.WriteHeader(http.StatusOK)
		n.begun = true
	}
	n.rc.SetWriteDeadline(time.Now().Add(wire.WriteWindow))
	if _, err := n.w.Write(b); err != nil {
		n.err = err
		return err
	}
	if err := n.rc.Flush(); err != nil {
		n.err = err
		return err
	}
	n.last = time.Now()
	return nil
}

// Send maps one of code's events to E2B's item.
func (n *ndjson) Send(ev wire.Event) error {
	switch ev.Type {
	case wire.EvInit:
		return n.send(map[string]any{"type": "number_of_executions", "execution_count": ev.ExecutionCount})
	case wire.EvStdout, wire.EvStderr:
		return n.send(map[string]any{"type": ev.Type, "text": ev.Text, "timestamp": time.Now().UTC().Format(time.RFC3339Nano)})
	case wire.EvExecutionCount:
		// An execute_result follows: the cell's value.
		n.mu.Lock()
		n.mainRes = true
		n.mu.Unlock()
		return nil
	case wire.EvResult:
		n.mu.Lock()
		main := n.mainRes
		n.mainRes = false
		n.mu.Unlock()
		return n.send(resultItem(ev.Results, main))
	}
	return nil
}

// mimeKeys are the MIME types E2B gives a short key of their own.
var mimeKeys = map[string]string{
	"text":                   "text", // code renamed text/plain already
	"text/plain":             "text",
	"text/html":              "html",
	"text/markdown":          "markdown",
	"image/svg+xml":          "svg",
	"image/png":              "png",
	"image/jpeg":             "jpeg",
	"application/pdf":        "pdf",
	"text/latex":             "latex",
	"application/json":       "json",
	"application/javascript": "javascript",
	"e2b/data":               "data",
	"e2b/chart":              "chart",
}

// resultItem is a Jupyter MIME bundle as E2B's result item: the known
// types under their short keys, the rest under extra, and a text in
// quotes (a string's repr) unquoted.
func resultItem(data map[string]any, main bool) map[string]any {
	item := map[string]any{"type": "result", "is_main_result": main}
	extra := map[string]any{}
	for mime, v := range data {
		k, ok := mimeKeys[mime]
		if !ok {
			extra[mime] = v
			continue
		}
		if t, isText := v.(string); k == "text" && isText {
			v = unquote(t)
		}
		item[k] = v
	}
	if len(extra) > 0 {
		item["extra"] = extra
	}
	return item
}

// unquote drops the quotes of a string's repr ('x' or "x").
func unquote(t string) string {
	if len(t) >= 2 && (t[0] == '\'' || t[0] == '"') && t[len(t)-1] == t[0] {
		return t[1 : len(t)-1]
	}
	return t
}
