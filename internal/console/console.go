// Package console serves moat's web console under /console on the API's
// own port: the single-page app (built from web/console and embedded in
// the binary), browser sessions, and a same-origin gateway that forwards
// the app's calls to the Lifecycle API as the session's principal.
//
// Security model (docs/SECURITY.md, "Web console"):
//   - The API key is posted once, at sign-in; the server-side session
//     keeps only the key's id. The browser holds a random session id in an HttpOnly,
//     SameSite=Strict cookie scoped to /console (Secure over TLS or when
//     configured), and a separate random CSRF token.
//   - Every call under /console except sign-in needs the CSRF token in the
//     X-Moat-CSRF header, reads included: the server proxy route serves
//     sandbox content on this same origin, so a page a sandbox serves could
//     otherwise ride the session cookie. The token reaches the app only in
//     the sign-in answer and in index.html on a top-level navigation
//     (Sec-Fetch-Dest: document), which a same-origin script cannot
//     perform and read; the page is framing-proof and opener-isolated
//     (frame-ancestors 'none', Cross-Origin-Opener-Policy: same-origin).
//   - WebSockets (the terminal) cannot carry headers: they present a
//     single-use ticket, valid 30 s and bound to the session, and an Origin
//     of this host.
//   - The forwarded call goes through the API's own authentication and
//     authorization as the session's principal (Sessions is the API's
//     session resolver), so the console can do exactly what the key can
//     (a viewer's mutations are refused by the API), and a key revoked
//     since sign-in ends the session on its next call.
package console

import (
	"errors"
	"io/fs"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/moat-sandbox/moat/internal/audit"
	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/tenant"
	"github.com/moat-sandbox/moat/internal/web"
)

// Options configure a Console. API and Sessions are required.
type Options struct {
	// API is the Lifecycle API root handler, built with Sessions as its
	// session resolver (httpapi.Config.Sessions). Calls to
	// /console/api/<path> are served by it as /<path>.
	API http.Handler
	// Sessions is the session table, shared with the API.
	Sessions *Sessions
	// Assets is the built app (index.html and assets/). Default: the copy
	// embedded at build time (see Embedded).
	Assets fs.FS
	// SecureCookie marks the session cookie Secure even on plain-HTTP
	// requests (a TLS-terminating proxy in front). Requests that arrive
	// over TLS always get a Secure cookie.
	SecureCookie bool
	// Log receives errors; default slog.Default().
	Log *slog.Logger
	// Audit, if set, records every sign-in (refused ones too) and
	// sign-out, like the API's own mutating calls.
	Audit AuditSink
}

// AuditSink receives audit records (internal/audit.Log).
type AuditSink interface {
	Write(audit.Record) error
}

// Console is the /console handler.
type Console struct {
	opt      Options
	sessions *Sessions
	assets   *assets
	web      *web.Adapter
}

// CookieName is the session cookie.
const CookieName = "moat_console"

// CSRFHeader carries the session's CSRF token.
const CSRFHeader = "X-Moat-CSRF"

// Prefix is where the console is mounted.
const Prefix = "/console"

// New returns the console handler.
func New(opt Options) (*Console, error) {
	if opt.API == nil || opt.Sessions == nil {
		return nil, errors.New("console: API and Sessions are required")
	}
	if opt.Log == nil {
		opt.Log = slog.Default()
	}
	if opt.Assets == nil {
		opt.Assets = Embedded()
	}
	a, err := loadAssets(opt.Assets)
	if err != nil {
		return nil, err
	}
	c := &Console{opt: opt, assets: a, sessions: opt.Sessions, web: &web.Adapter{Log: opt.Log, Codes: codeOf}}
	return c, nil
}

// Built reports whether the binary carries the built app (false: /console
// answers a page saying how to build it).
func (c *Console) Built() bool { return c.assets.built }

// codeOf maps error classes to CONSOLE:: codes.
func codeOf(err error) (int, string) {
	status, code := web.StatusOf(err)
	if status == http.StatusInternalServerError {
		return status, "CONSOLE::UNKNOWN_ERROR"
	}
	return status, "CONSOLE::" + code
}

var (
	errSignedOut = errdefs.WithPublic(errdefs.ErrUnauthenticated, "CONSOLE::SIGNED_OUT", "not signed in (or the session expired): sign in again")
	errCSRF      = errdefs.WithPublic(errdefs.ErrPermissionDenied, "CONSOLE::CSRF_TOKEN_INVALID", "missing or invalid "+CSRFHeader+" header")
	errOrigin    = errdefs.WithPublic(errdefs.ErrPermissionDenied, "CONSOLE::ORIGIN_REFUSED", "cross-origin request refused")
	errTicket    = errdefs.WithPublic(errdefs.ErrPermissionDenied, "CONSOLE::TICKET_INVALID", "missing, used or expired WebSocket ticket")
)

// ServeHTTP serves /console and everything below it.
func (c *Console) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	setSecurityHeaders(w.Header())
	rest, ok := strings.CutPrefix(r.URL.Path, Prefix)
	if !ok {
		c.web.WriteError(w, r, errdefs.WithPublic(errdefs.ErrNotFound, "CONSOLE::NOT_FOUND", "not found"))
		return
	}
	switch {
	case rest == "":
		http.Redirect(w, r, Prefix+"/", http.StatusMovedPermanently)
	case rest == "/session":
		var who tenant.Principal
		c.audited(w, r, &who, c.web.Handle(func(w http.ResponseWriter, r *http.Request) error { return c.session(w, r, &who) }))
	case rest == "/session/ticket":
		c.web.Handle(c.ticket).ServeHTTP(w, r)
	case rest == "/api" || strings.HasPrefix(rest, "/api/"):
		c.web.Handle(c.forward).ServeHTTP(w, r)
	default:
		c.web.Handle(c.static).ServeHTTP(w, r)
	}
}

// setSecurityHeaders sets the headers every console response carries. The
// CSP allows scripts only from this origin (the app has no inline script);
// inline styles are allowed because xterm.js sizes its DOM renderer with
// <style> elements it creates at run time.
func setSecurityHeaders(h http.Header) {
	h.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; "+
		"img-src 'self' data:; font-src 'self'; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cross-Origin-Opener-Policy", "same-origin")
	h.Set("Cross-Origin-Resource-Policy", "same-origin")
	h.Set("Permissions-Policy", "camera=(), microphone=(), geolocation=(), clipboard-read=()")
	h.Set("Cache-Control", "no-store")
}

// sessionInfo is what the app learns about its session.
type sessionInfo struct {
	CSRFToken string           `json:"csrfToken,omitempty"`
	Principal tenant.Principal `json:"principal"`
	ExpiresAt time.Time        `json:"expiresAt"`
}

// session serves /console/session: POST signs in, GET describes the
// session, DELETE signs out. who is set to the principal signing in or
// out, for the audit record.
func (c *Console) session(w http.ResponseWriter, r *http.Request, who *tenant.Principal) error {
	switch r.Method {
	case http.MethodPost:
		return c.signIn(w, r, who)
	case http.MethodGet:
		id, sess, err := c.authorize(r)
		if err != nil {
			return err
		}
		p, err := c.sessions.principalOf(sess.keyID)
		if err != nil {
			c.sessions.remove(id)
			return errSignedOut
		}
		web.WriteJSON(w, http.StatusOK, sessionInfo{Principal: p, ExpiresAt: c.expiry(sess)})
		return nil
	case http.MethodDelete:
		id, sess, err := c.authorize(r)
		if err != nil {
			return err
		}
		who.KeyID = sess.keyID
		if p, err := c.sessions.principalOf(sess.keyID); err == nil {
			*who = p
		}
		c.sessions.remove(id)
		c.clearCookie(w, r)
		w.WriteHeader(http.StatusNoContent)
		return nil
	default:
		return methodNotAllowed(w, "GET, POST, DELETE")
	}
}

// signIn checks the posted key and starts a session. It must come from this
// origin (login CSRF: a foreign page must not sign a victim into another
// key), and the body must be JSON, which a cross-origin form cannot send
// without a preflight this server never grants.
func (c *Console) signIn(w http.ResponseWriter, r *http.Request, who *tenant.Principal) error {
	if !sameOrigin(r) {
		return errOrigin
	}
	if ct := r.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		return errdefs.Invalid("CONSOLE::INVALID_PARAMETER", "sign-in takes a JSON body {\"apiKey\": \"...\"}")
	}
	var body struct {
		APIKey string `json:"apiKey"`
	}
	if err := web.DecodeJSON(r, &body, false); err != nil {
		return errdefs.Invalid("CONSOLE::INVALID_PARAMETER", publicMessage(err))
	}
	key := strings.TrimSpace(body.APIKey)
	if key == "" {
		return errdefs.Invalid("CONSOLE::INVALID_PARAMETER", "apiKey is required")
	}
	p, err := c.sessions.authenticate(key)
	*who = p
	if err != nil {
		if errors.Is(err, errdefs.ErrUnauthenticated) || errors.Is(err, errdefs.ErrPermissionDenied) {
			return errdefs.WithPublic(errdefs.ErrUnauthenticated, "CONSOLE::INVALID_API_KEY", "invalid API key")
		}
		return err
	}
	// A session id the browser already had is replaced (no fixation).
	if old, err := r.Cookie(CookieName); err == nil {
		c.sessions.remove(old.Value)
	}
	id, sess, ok := c.sessions.create(p.KeyID)
	if !ok {
		return errdefs.WithPublic(errdefs.ErrUnavailable, "CONSOLE::TOO_MANY_SESSIONS", "too many console sessions: try again later")
	}
	http.SetCookie(w, &http.Cookie{Name: CookieName, Value: id, Path: Prefix, HttpOnly: true,
		Secure: c.secure(r), SameSite: http.SameSiteStrictMode, MaxAge: int(c.sessions.opt.MaxLifetime / time.Second)})
	web.WriteJSON(w, http.StatusOK, sessionInfo{CSRFToken: sess.csrf, Principal: p, ExpiresAt: c.expiry(sess)})
	return nil
}

func publicMessage(err error) string {
	if p, ok := errdefs.PublicOf(err); ok {
		return p.Message
	}
	return "invalid request"
}

// expiry is when sess ends if it stays in use.
func (c *Console) expiry(sess session) time.Time {
	return sess.created.Add(c.sessions.opt.MaxLifetime).UTC()
}

func (c *Console) secure(r *http.Request) bool { return c.opt.SecureCookie || r.TLS != nil }

func (c *Console) clearCookie(w http.ResponseWriter, r *http.Request) {
	http.SetCookie(w, &http.Cookie{Name: CookieName, Value: "", Path: Prefix, HttpOnly: true,
		Secure: c.secure(r), SameSite: http.SameSiteStrictMode, MaxAge: -1})
}

// sessionOf returns the cookie's session id and live session.
func (c *Console) sessionOf(r *http.Request) (string, session, bool) {
	ck, err := r.Cookie(CookieName)
	if err != nil {
		return "", session{}, false
	}
	sess, ok := c.sessions.get(ck.Value)
	return ck.Value, sess, ok
}

// authorize checks the session cookie and the CSRF header.
func (c *Console) authorize(r *http.Request) (string, session, error) {
	id, sess, ok := c.sessionOf(r)
	if !ok {
		return "", session{}, errSignedOut
	}
	if !csrfEqual(r.Header.Get(CSRFHeader), sess.csrf) {
		return "", session{}, errCSRF
	}
	return id, sess, nil
}

// ticket serves POST /console/session/ticket: a single-use ticket for one
// WebSocket handshake under /console/api.
func (c *Console) ticket(w http.ResponseWriter, r *http.Request) error {
	if r.Method != http.MethodPost {
		return methodNotAllowed(w, "POST")
	}
	id, _, err := c.authorize(r)
	if err != nil {
		return err
	}
	t := c.sessions.newTicket(id)
	if t == "" {
		return errdefs.WithPublic(errdefs.ErrUnavailable, "CONSOLE::TOO_MANY_TICKETS", "too many pending WebSocket tickets: try again later")
	}
	web.WriteJSON(w, http.StatusOK, map[string]string{"ticket": t})
	return nil
}

// sameOrigin reports whether a request comes from a page of this server:
// its Origin (when the browser sent one) names this host, and the fetch
// metadata, when present, does not say cross-site.
func sameOrigin(r *http.Request) bool {
	if s := r.Header.Get("Sec-Fetch-Site"); s != "" && s != "same-origin" && s != "none" {
		return false
	}
	o := r.Header.Get("Origin")
	if o == "" {
		return true // not a browser's cross-origin request (curl, tests)
	}
	u, err := url.Parse(o)
	if err != nil || u.Host == "" {
		return false
	}
	return strings.EqualFold(u.Host, r.Host)
}

// audited serves h and, for a mutating method, writes an audit record
// with the principal h left in who.
func (c *Console) audited(w http.ResponseWriter, r *http.Request, who *tenant.Principal, h http.Handler) {
	switch r.Method {
	case http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete:
	default:
		h.ServeHTTP(w, r)
		return
	}
	if c.opt.Audit == nil {
		h.ServeHTTP(w, r)
		return
	}
	start := time.Now()
	rec := &web.StatusWriter{ResponseWriter: w}
	h.ServeHTTP(rec, r)
	status := rec.Status()
	if status == 0 {
		status = http.StatusOK
	}
	err := c.opt.Audit.Write(audit.Record{
		Time: start.UTC(), RequestID: web.RequestID(r.Context()), RemoteAddr: r.RemoteAddr,
		Method: r.Method, Path: r.URL.Path, Route: r.Method + " " + r.URL.Path,
		KeyID: who.KeyID, Tenant: who.Tenant, Role: string(who.Role),
		Status: status, DurationMS: float64(time.Since(start).Microseconds()) / 1000,
	})
	if err != nil {
		c.opt.Log.Error("audit log write failed", "err", err, "method", r.Method, "path", r.URL.Path)
	}
}

// methodNotAllowed answers 405 with the allowed methods.
func methodNotAllowed(w http.ResponseWriter, allow string) error {
	w.Header().Set("Allow", allow)
	web.WriteJSON(w, http.StatusMethodNotAllowed, web.ErrorBody{Code: "CONSOLE::METHOD_NOT_ALLOWED", Message: "use " + allow})
	return nil
}
