package console

import (
	"net/http"
	"strings"

	"github.com/moat-sandbox/moat/internal/web"
)

// forward serves /console/api/<path> as the API's /<path>, as the
// session. The browser's own credentials (cookie, CSRF token, any key or
// agent token it sent) are removed first, so the API sees exactly one
// credential: the session in the request context, which it resolves
// through Sessions.ResolveSession to the key's current principal. Through
// the server proxy route an operator's or admin's session gets the
// sandbox's agent token swapped in, as an API key does (internal/httpapi
// proxy).
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

	out := r.Clone(withForwarded(r.Context(), forwarded{id: id, keyID: sess.keyID}))
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

	if id := web.RequestID(r.Context()); id != "" && out.Header.Get("X-Request-ID") == "" {
		out.Header.Set("X-Request-ID", id) // one id in the console's and the API's logs
	}

	// What the API answers is data for the app, never a document of the
	// console's origin (a sandbox file downloaded here could be HTML).
	w.Header().Set("Content-Security-Policy", "default-src 'none'; sandbox")
	c.opt.API.ServeHTTP(w, out)
	return nil
}

// isWebSocket reports a WebSocket handshake.
func isWebSocket(r *http.Request) bool {
	return strings.EqualFold(r.Header.Get("Upgrade"), "websocket")
}
