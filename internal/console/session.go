package console

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/tenant"
)

// Keys resolves API keys (tenant.Registry).
type Keys interface {
	// Authenticate returns the principal of an API key (sign-in).
	Authenticate(key string) (tenant.Principal, error)
	// PrincipalOf returns the current principal of a key id, or an
	// ErrUnauthenticated error once the key is revoked or expired.
	PrincipalOf(keyID string) (tenant.Principal, error)
}

// SessionOptions configure the session table.
type SessionOptions struct {
	// Keys checks keys at sign-in and on every request. Nil means the
	// server runs without authentication (--insecure-no-auth): any
	// non-empty key signs in as tenant.Anonymous.
	Keys Keys
	// IdleTimeout ends a session unused this long. Default 1 h.
	IdleTimeout time.Duration
	// MaxLifetime ends a session this long after sign-in. Default 12 h.
	MaxLifetime time.Duration
	// MaxSessions bounds live sessions; sign-in fails with 503 beyond it.
	// Default 10000.
	MaxSessions int
	// Now is the clock (tests); default time.Now.
	Now func() time.Time
}

// session is one signed-in browser. It remembers the id of the key it was
// opened with, never the key: the principal is looked up again on every
// request, so that revoking the key ends the session at once. The browser
// holds only the session id (HttpOnly cookie) and the CSRF token, neither
// of which is the key nor derived from it.
type session struct {
	keyID    string
	csrf     string
	created  time.Time
	lastSeen time.Time
}

// ticket is a single-use, short-lived credential for one WebSocket
// handshake: browsers cannot put the CSRF header on a WebSocket, and the
// CSRF token itself must not travel in a URL.
type ticket struct {
	sessionKey [32]byte
	expires    time.Time
}

// Sessions is the in-memory session table of the console. It is also the
// API's second credential source (httpapi.SessionResolver): a call the
// console forwards carries its session in the request context, and
// ResolveSession turns it into the key's current principal.
//
// Sessions are keyed by the SHA-256 of their id, so the id is only ever
// compared as a hash (no timing signal on the secret) and a dump of the
// map yields no usable cookie. They are lost on a server restart (users
// sign in again).
type Sessions struct {
	opt SessionOptions

	mu        sync.Mutex
	byID      map[[32]byte]*session
	tickets   map[[32]byte]ticket
	lastSweep time.Time
}

// NewSessions returns an empty session table.
func NewSessions(opt SessionOptions) *Sessions {
	if opt.IdleTimeout <= 0 {
		opt.IdleTimeout = time.Hour
	}
	if opt.MaxLifetime <= 0 {
		opt.MaxLifetime = 12 * time.Hour
	}
	if opt.MaxSessions <= 0 {
		opt.MaxSessions = 10000
	}
	if opt.Now == nil {
		opt.Now = time.Now
	}
	return &Sessions{opt: opt, byID: map[[32]byte]*session{}, tickets: map[[32]byte]ticket{}}
}

// ticketTTL bounds how long a WebSocket ticket may wait for its handshake.
const ticketTTL = 30 * time.Second

// maxTickets bounds the unredeemed tickets of all sessions together.
const maxTickets = 1024

// randomToken returns 32 random bytes, base64url-encoded (43 characters).
func randomToken() string {
	var b [32]byte
	rand.Read(b[:])
	return base64.RawURLEncoding.EncodeToString(b[:])
}

func hashID(id string) [32]byte { return sha256.Sum256([]byte(id)) }

// authenticate checks an API key at sign-in.
func (s *Sessions) authenticate(key string) (tenant.Principal, error) {
	if s.opt.Keys == nil {
		return tenant.Anonymous, nil
	}
	return s.opt.Keys.Authenticate(key)
}

// principalOf is the current principal of a session's key.
func (s *Sessions) principalOf(keyID string) (tenant.Principal, error) {
	if s.opt.Keys == nil {
		return tenant.Anonymous, nil
	}
	return s.opt.Keys.PrincipalOf(keyID)
}

// create starts a session for keyID and returns its id. It fails (ok
// false) when the table is full of live sessions.
func (s *Sessions) create(keyID string) (id string, sess session, ok bool) {
	now := s.opt.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.byID) >= s.opt.MaxSessions || now.Sub(s.lastSweep) > time.Minute {
		s.sweepLocked(now)
	}
	if len(s.byID) >= s.opt.MaxSessions {
		return "", session{}, false
	}
	id = randomToken()
	ns := &session{keyID: keyID, csrf: randomToken(), created: now, lastSeen: now}
	s.byID[hashID(id)] = ns
	return id, *ns, true
}

// get returns the live session of id and marks it used. An expired session
// is removed.
func (s *Sessions) get(id string) (session, bool) {
	if id == "" {
		return session{}, false
	}
	h := hashID(id)
	now := s.opt.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	sess, ok := s.byID[h]
	if !ok {
		return session{}, false
	}
	if s.expiredLocked(sess, now) {
		delete(s.byID, h)
		return session{}, false
	}
	sess.lastSeen = now
	return *sess, true
}

// remove ends the session of id (sign-out, or its key was refused).
func (s *Sessions) remove(id string) {
	h := hashID(id)
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.byID, h)
	for k, t := range s.tickets {
		if t.sessionKey == h {
			delete(s.tickets, k)
		}
	}
}

// newTicket issues a WebSocket ticket for the session of id ("" when too
// many are outstanding).
func (s *Sessions) newTicket(id string) string {
	now := s.opt.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.tickets) >= maxTickets {
		s.sweepLocked(now)
		if len(s.tickets) >= maxTickets {
			return ""
		}
	}
	t := randomToken()
	s.tickets[hashID(t)] = ticket{sessionKey: hashID(id), expires: now.Add(ticketTTL)}
	return t
}

// redeem consumes a ticket and returns its session, which must be the one
// of the cookie (id): a ticket is bound to the browser that asked for it.
func (s *Sessions) redeem(t, id string) (session, bool) {
	th, ih := hashID(t), hashID(id)
	now := s.opt.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	tk, ok := s.tickets[th]
	if !ok {
		return session{}, false
	}
	delete(s.tickets, th) // single use, even when it does not match
	if now.After(tk.expires) || subtle.ConstantTimeCompare(tk.sessionKey[:], ih[:]) != 1 {
		return session{}, false
	}
	sess, ok := s.byID[ih]
	if !ok || s.expiredLocked(sess, now) {
		return session{}, false
	}
	sess.lastSeen = now
	return *sess, true
}

func (s *Sessions) expiredLocked(sess *session, now time.Time) bool {
	return now.Sub(sess.lastSeen) > s.opt.IdleTimeout || now.Sub(sess.created) > s.opt.MaxLifetime
}

// sweepLocked drops expired sessions and tickets.
func (s *Sessions) sweepLocked(now time.Time) {
	s.lastSweep = now
	for h, sess := range s.byID {
		if s.expiredLocked(sess, now) {
			delete(s.byID, h)
		}
	}
	for h, t := range s.tickets {
		if now.After(t.expires) {
			delete(s.tickets, h)
		}
	}
}

// forwarded is the session of a call the console forwards to the API,
// carried in the request context (which only this process can set).
type forwarded struct {
	id    string
	keyID string
}

type forwardedKey struct{}

func withForwarded(ctx context.Context, f forwarded) context.Context {
	return context.WithValue(ctx, forwardedKey{}, f)
}

// ResolveSession implements httpapi.SessionResolver. Only calls forwarded
// by the console carry a session (ok false for any other request); the
// console has already checked their cookie and CSRF token. The principal
// is the key's current one: a revoked or expired key ends the session and
// answers 401.
func (s *Sessions) ResolveSession(r *http.Request) (tenant.Principal, bool, error) {
	f, ok := r.Context().Value(forwardedKey{}).(forwarded)
	if !ok {
		return tenant.Principal{}, false, nil
	}
	p, err := s.principalOf(f.keyID)
	if err != nil {
		s.remove(f.id)
		if _, public := errdefs.PublicOf(err); !public {
			err = errdefs.WithPublic(fmt.Errorf("console session key %s: %w", f.keyID, err), "INVALID_API_KEY", "the API key of this session is no longer valid")
		}
		return tenant.Principal{}, false, err
	}
	return p, true, nil
}

// csrfEqual compares a presented CSRF token with the session's in
// constant time.
func csrfEqual(got, want string) bool {
	return got != "" && len(got) == len(want) && subtle.ConstantTimeCompare([]byte(got), []byte(want)) == 1
}
