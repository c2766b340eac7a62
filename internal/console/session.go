package console

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"sync"
	"time"
)

// session is one signed-in browser. The API key stays here, server-side:
// the browser holds only the session id (in an HttpOnly cookie) and the
// CSRF token (in the page), neither of which is the key nor derived from it.
type session struct {
	apiKey    string
	principal Principal
	csrf      string
	created   time.Time
	lastSeen  time.Time
}

// ticket is a single-use, short-lived credential for one WebSocket
// handshake: browsers cannot put the CSRF header on a WebSocket, and the
// CSRF token itself must not travel in a URL.
type ticket struct {
	sessionKey [32]byte
	expires    time.Time
}

// sessions is the in-memory session table. Sessions are keyed by the
// SHA-256 of their id, so the id is only ever compared as a hash (no
// timing signal on the secret) and a memory dump of the map does not yield
// usable cookies. They are lost on a server restart (users sign in again).
type sessions struct {
	idle, lifetime time.Duration
	max            int
	now            func() time.Time

	mu        sync.Mutex
	byID      map[[32]byte]*session
	tickets   map[[32]byte]ticket
	lastSweep time.Time
}

func newSessions(idle, lifetime time.Duration, max int, now func() time.Time) *sessions {
	return &sessions{idle: idle, lifetime: lifetime, max: max, now: now,
		byID: map[[32]byte]*session{}, tickets: map[[32]byte]ticket{}}
}

// ticketTTL bounds how long a WebSocket ticket may wait for its handshake.
const ticketTTL = 30 * time.Second

// randomToken returns 32 random bytes, base64url-encoded (43 characters).
func randomToken() string {
	var b [32]byte
	rand.Read(b[:])
	return base64.RawURLEncoding.EncodeToString(b[:])
}

func hashID(id string) [32]byte { return sha256.Sum256([]byte(id)) }

// create starts a session for key and returns its id. It fails (ok false)
// when the table is full of live sessions.
func (s *sessions) create(key string, p Principal) (id string, sess session, ok bool) {
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.byID) >= s.max || now.Sub(s.lastSweep) > time.Minute {
		s.sweepLocked(now)
	}
	if len(s.byID) >= s.max {
		return "", session{}, false
	}
	id = randomToken()
	ns := &session{apiKey: key, principal: p, csrf: randomToken(), created: now, lastSeen: now}
	s.byID[hashID(id)] = ns
	return id, *ns, true
}

// get returns the live session of id and marks it used. An expired session
// is removed.
func (s *sessions) get(id string) (session, bool) {
	if id == "" {
		return session{}, false
	}
	h := hashID(id)
	now := s.now()
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
func (s *sessions) remove(id string) {
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

// maxTickets bounds the unredeemed tickets of all sessions together.
const maxTickets = 1024

// newTicket issues a WebSocket ticket for the session of id ("" when too
// many are outstanding).
func (s *sessions) newTicket(id string) string {
	now := s.now()
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
func (s *sessions) redeem(t, id string) (session, bool) {
	th, ih := hashID(t), hashID(id)
	now := s.now()
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

func (s *sessions) expiredLocked(sess *session, now time.Time) bool {
	return now.Sub(sess.lastSeen) > s.idle || now.Sub(sess.created) > s.lifetime
}

// sweepLocked drops expired sessions and tickets.
func (s *sessions) sweepLocked(now time.Time) {
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

// len counts sessions in the table (live or not yet swept).
func (s *sessions) len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.byID)
}

// csrfEqual compares a presented CSRF token with the session's in
// constant time.
func csrfEqual(got, want string) bool {
	return got != "" && len(got) == len(want) && subtle.ConstantTimeCompare([]byte(got), []byte(want)) == 1
}
