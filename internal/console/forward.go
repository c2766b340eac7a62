package console

import (
	"net/http"
	"strings"
)

// forward serves /console/api/<path> as the API's /<path>, with the
// session's API key. The browser's own credentials (cookie, CSRF token,
// any key or agent token it sent) are removed first, so the API sees
// exactly one credential: the session's key. Through the server proxy
// route that key is swapped for the sandbox's agent token as for any API
// client (internal/httpapi proxy).
func (c *Console) forward(w http.ResponseWriter, r *http.Request) error {
	var (
		id   string
		sess session
		err  error
	)
	query := r.URL.RawQuery
	if isWebSocket(r) {
		// Browsers always send Origin on a WebSocket handshake, and do not
		// apply the same-origin policy to it: check it here.
		if r.Header.Get("Origin") == "" || !sameOrigin(r) {
			return errOrigin
		}
		q := r.URL.Query()
		ck, cerr := r.Cookie(CookieName)
		if cerr != nil {
			return errSignedOut
		}
		var ok bool
		if sess, ok = c.sessions.redeem(q.Get("ticket"), ck.Value); !ok {
			return errTicket
		}
		id = ck.Value
		q.Del("ticket")
		query = q.Encode()
	} else if id, sess, err = c.authorize(r); err != nil {
		return err
	}

	out := r.Clone(r.Context())
	u := *r.URL
	u.Path = strings.TrimPrefix(r.URL.Path, Prefix+"/api")
	u.RawPath = strings.TrimPrefix(r.URL.RawPath, Prefix+"/api")
	if u.Path == "" {
		u.Path = "/"
	}
	u.RawQuery = query
	out.URL = &u
	out.RequestURI = u.RequestURI()
	for _, h := range []string{"Cookie", CSRFHeader, "Authorization", "X-API-Key", "OPEN-SANDBOX-API-KEY", "X-EXECD-ACCESS-TOKEN"} {
		out.Header.Del(h)
	}
	out.Header.Set("OPEN-SANDBOX-API-KEY", sess.apiKey)

	// What the API answers is data for the app, never a document of the
	// console's origin (a sandbox file downloaded here could be HTML).
	w.Header().Set("Content-Security-Policy", "default-src 'none'; sandbox")
	rec := &statusWriter{ResponseWriter: w}
	c.opt.API.ServeHTTP(rec, out)
	if rec.status == http.StatusUnauthorized && !isProxyPath(u.Path) {
		// The key was refused (revoked, or the server's key changed):
		// the session is over. A 401 through the server proxy is the
		// sandbox's own answer and says nothing about the key.
		c.sessions.remove(id)
	}
	return nil
}

// isWebSocket reports a WebSocket handshake.
func isWebSocket(r *http.Request) bool {
	return strings.EqualFold(r.Header.Get("Upgrade"), "websocket")
}

// isProxyPath reports the API's server proxy route,
// [/v1]/sandboxes/{id}/proxy/{port}/...
func isProxyPath(p string) bool {
	p = strings.TrimPrefix(p, "/v1")
	rest, ok := strings.CutPrefix(p, "/sandboxes/")
	if !ok {
		return false
	}
	parts := strings.SplitN(rest, "/", 3)
	return len(parts) >= 2 && parts[1] == "proxy"
}

// statusWriter records the status the API wrote. Unwrap lets
// http.ResponseController (flush, hijack for WebSockets) reach the
// connection.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (s *statusWriter) WriteHeader(code int) {
	if s.status == 0 {
		s.status = code
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusWriter) Write(b []byte) (int, error) {
	if s.status == 0 {
		s.status = http.StatusOK
	}
	return s.ResponseWriter.Write(b)
}

func (s *statusWriter) Unwrap() http.ResponseWriter { return s.ResponseWriter }
