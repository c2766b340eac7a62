package web_test

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/moat-sandbox/moat/internal/web"
)

// TestStatusWriter: the status recorded is the first final one; a 1xx is
// passed on but not recorded; a body or a flush without a status is a
// 200; nothing written is 0.
func TestStatusWriter(t *testing.T) {
	for _, c := range []struct {
		name  string
		write func(w http.ResponseWriter)
		want  int
	}{
		{"nothing", func(w http.ResponseWriter) {}, 0},
		{"status", func(w http.ResponseWriter) { w.WriteHeader(404); w.WriteHeader(500) }, 404},
		{"informational first", func(w http.ResponseWriter) { w.WriteHeader(103); w.WriteHeader(201) }, 201},
		{"body", func(w http.ResponseWriter) { w.Write([]byte("x")); w.WriteHeader(500) }, 200},
		{"flush", func(w http.ResponseWriter) { w.(http.Flusher).Flush() }, 200},
		{"controller flush", func(w http.ResponseWriter) { http.NewResponseController(w).Flush() }, 200},
	} {
		rec := httptest.NewRecorder()
		sw := &web.StatusWriter{ResponseWriter: rec}
		c.write(sw)
		if got := sw.Status(); got != c.want {
			t.Errorf("%s: Status() = %d, want %d", c.name, got, c.want)
		}
		// (httptest's recorder keeps the code of a 1xx.)
		if c.want != 0 && c.name != "informational first" && rec.Code != c.want {
			t.Errorf("%s: the response's status is %d, want %d", c.name, rec.Code, c.want)
		}
	}
}
