package web

import "net/http"

// StatusWriter records the status a handler sends, for the middleware
// that reports it after the handler returns (metrics, audit records):
// the first final status (a 1xx is informational and a final one follows
// it), or 200 once a body or a flush goes without one. Unwrap keeps
// http.ResponseController (flush, deadlines, hijack) working through it.
type StatusWriter struct {
	http.ResponseWriter
	status int
}

// Status is the status sent, 0 while none is (net/http sends 200 for a
// handler that returns without writing).
func (w *StatusWriter) Status() int { return w.status }

func (w *StatusWriter) WriteHeader(code int) {
	if w.status == 0 && code >= 200 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *StatusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

// Flush supports callers that type-assert http.Flusher.
func (w *StatusWriter) Flush() {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	http.NewResponseController(w.ResponseWriter).Flush()
}

func (w *StatusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
