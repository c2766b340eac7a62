// Package idempotency is the Idempotency-Key of the API's mutating
// routes: a retried request with the same key (in the same scope, a
// tenant) answers what the first answered and does nothing again, across
// server restarts. The answers are kept in the store (bucket
// "idempotency") for a TTL. Keys.Wrap is the one middleware every such
// route goes through.
//
// A key is claimed (persisted as pending) before the request runs, so a
// server that stops during it finds the claim on restart and answers
// IDEMPOTENCY_INTERRUPTED instead of running the request a second time:
// nothing is made twice. Only 2xx answers are kept; any other answer
// frees the key, so a retry runs again (a failed request made nothing).
package idempotency

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/store"
	"github.com/moat-sandbox/moat/internal/web"
)

// Header is the request header carrying the key.
const Header = "Idempotency-Key"

// ReplayedHeader is set on an answer replayed from the store.
const ReplayedHeader = "Idempotent-Replayed"

// Bucket is the store bucket holding the answers.
const Bucket = "idempotency"

// DefaultTTL is how long an answer is kept.
const DefaultTTL = 24 * time.Hour

// MaxKey is the longest key.
const MaxKey = 255

// Error codes.
const (
	CodeInvalid     = "SANDBOX::INVALID_PARAMETER"
	CodeReused      = "SANDBOX::IDEMPOTENCY_KEY_REUSED"
	CodeInProgress  = "SANDBOX::IDEMPOTENCY_IN_PROGRESS"
	CodeInterrupted = "SANDBOX::IDEMPOTENCY_INTERRUPTED"
)

// record is one key's claim or answer.
type record struct {
	// Fingerprint is the request's route and body hash.
	Fingerprint string `json:"fingerprint"`
	// Pending is set while the request runs; Boot is the process that
	// runs it (a pending record of another boot was interrupted).
	Pending bool              `json:"pending,omitempty"`
	Boot    string            `json:"boot,omitempty"`
	Status  int               `json:"status,omitempty"`
	Header  map[string]string `json:"header,omitempty"`
	Body    []byte            `json:"body,omitempty"`
	Created time.Time         `json:"created"`
}

// keptHeaders are the response headers a replay repeats.
var keptHeaders = []string{"Content-Type", "Location"}

// Keys keeps the answers. It is safe for concurrent use.
type Keys struct {
	db   store.Store
	now  func() time.Time
	ttl  time.Duration
	log  *slog.Logger
	boot string

	mu        sync.Mutex
	inflight  map[string]bool
	lastSweep time.Time
}

// New returns the keys kept in db for ttl (0: DefaultTTL).
func New(db store.Store, now func() time.Time, ttl time.Duration, log *slog.Logger) *Keys {
	if ttl <= 0 {
		ttl = DefaultTTL
	}
	if now == nil {
		now = time.Now
	}
	if log == nil {
		log = slog.Default()
	}
	b := make([]byte, 8)
	rand.Read(b)
	return &Keys{db: db, now: now, ttl: ttl, log: log, boot: hex.EncodeToString(b), inflight: map[string]bool{}}
}

// validKey reports whether k is 1-MaxKey visible ASCII characters.
func validKey(k string) bool {
	if len(k) == 0 || len(k) > MaxKey {
		return false
	}
	for i := 0; i < len(k); i++ {
		if k[i] < 0x20 || k[i] > 0x7e {
			return false
		}
	}
	return true
}

// storeKey is the record key of key in scope (hashed: keys are the
// clients' strings).
func storeKey(scope, key string) string {
	h := sha256.Sum256([]byte(scope + "\x00" + key))
	return hex.EncodeToString(h[:])
}

// fingerprint identifies a request: its method, path (without the /v1
// mount) and body.
func fingerprint(r *http.Request, body []byte) string {
	h := sha256.New()
	fmt.Fprintf(h, "%s %s\x00", r.Method, strings.TrimPrefix(r.URL.Path, "/v1"))
	h.Write(body)
	return hex.EncodeToString(h.Sum(nil))
}

// Wrap makes next idempotent. scope is the tenant of a request (keys of
// two scopes never meet); fail writes an error in the API's shape.
func (k *Keys) Wrap(next http.Handler, scope func(*http.Request) string, fail func(http.ResponseWriter, *http.Request, error)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get(Header)
		if key == "" {
			next.ServeHTTP(w, r)
			return
		}
		if !validKey(key) {
			fail(w, r, errdefs.Invalid(CodeInvalid, fmt.Sprintf("%s must be 1 to %d visible ASCII characters", Header, MaxKey)))
			return
		}
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, web.MaxBodyBytes))
		if err != nil {
			fail(w, r, errdefs.Invalid(CodeInvalid, "request body too large"))
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		sk := storeKey(scope(r), key)
		fp := fingerprint(r, body)
		prev, err := k.claim(sk, fp)
		if err != nil {
			fail(w, r, err)
			return
		}
		if prev != nil {
			replay(w, prev)
			return
		}
		rec := &recorder{ResponseWriter: w}
		kept := false
		defer func() {
			k.finish(sk, fp, rec, kept)
		}()
		next.ServeHTTP(rec, r)
		kept = rec.status >= 200 && rec.status < 300
	})
}

// claim returns the kept answer of sk, or claims sk for a request with
// fingerprint fp (nil, nil); an error answers the request.
func (k *Keys) claim(sk, fp string) (*record, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.sweepLocked()
	if k.inflight[sk] {
		return nil, errdefs.WithPublic(fmt.Errorf("idempotency key in use: %w", errdefs.ErrConflict),
			CodeInProgress, "a request with this Idempotency-Key is still running; retry later")
	}
	var prev record
	err := k.db.Get(Bucket, sk, &prev)
	switch {
	case err == nil && k.now().Sub(prev.Created) <= k.ttl:
		if prev.Fingerprint != fp {
			return nil, errdefs.WithPublic(fmt.Errorf("idempotency key reused: %w", errdefs.ErrConflict),
				CodeReused, "this Idempotency-Key was used for another request (a different route or body)")
		}
		if prev.Pending {
			return nil, errdefs.WithPublic(fmt.Errorf("idempotency key of an interrupted request: %w", errdefs.ErrConflict),
				CodeInterrupted, "the first request with this Idempotency-Key was interrupted by a server restart and was not completed; check for its result, then retry with a new key")
		}
		return &prev, nil
	case err != nil && !errdefs.IsNotFound(err):
		return nil, fmt.Errorf("read idempotency key: %w", err)
	}
	claim := record{Fingerprint: fp, Pending: true, Boot: k.boot, Created: k.now().UTC()}
	if err := k.db.Put(Bucket, sk, &claim); err != nil {
		return nil, fmt.Errorf("claim idempotency key: %w", err)
	}
	k.inflight[sk] = true
	return nil, nil
}

// finish keeps the answer rec recorded (keep) or frees the key.
func (k *Keys) finish(sk, fp string, rec *recorder, keep bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	delete(k.inflight, sk)
	var err error
	if keep {
		h := map[string]string{}
		for _, name := range keptHeaders {
			if v := rec.Header().Get(name); v != "" {
				h[name] = v
			}
		}
		err = k.db.Put(Bucket, sk, &record{Fingerprint: fp, Status: rec.status, Header: h, Body: rec.body.Bytes(), Created: k.now().UTC()})
	} else {
		err = k.db.Delete(Bucket, sk)
	}
	if err != nil {
		k.log.Error("idempotency: record the answer", "err", err)
	}
}

// sweepLocked forgets expired answers, at most once an hour.
func (k *Keys) sweepLocked() {
	now := k.now()
	if now.Sub(k.lastSweep) < time.Hour {
		return
	}
	k.lastSweep = now
	var old []string
	err := k.db.ForEach(Bucket, func(key string, raw []byte) error {
		var r struct {
			Created time.Time `json:"created"`
		}
		if json.Unmarshal(raw, &r) == nil && now.Sub(r.Created) > k.ttl {
			old = append(old, key)
		}
		return nil
	})
	if err != nil {
		k.log.Error("idempotency: sweep", "err", err)
		return
	}
	for _, key := range old {
		if err := k.db.Delete(Bucket, key); err != nil {
			k.log.Error("idempotency: sweep", "err", err)
		}
	}
}

// Sweep forgets expired answers now.
func (k *Keys) Sweep(ctx context.Context) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.lastSweep = time.Time{}
	k.sweepLocked()
}

func replay(w http.ResponseWriter, rec *record) {
	for name, v := range rec.Header {
		w.Header().Set(name, v)
	}
	w.Header().Set(ReplayedHeader, "true")
	w.WriteHeader(rec.Status)
	w.Write(rec.Body)
}

// recorder passes a response through and keeps its status and body.
type recorder struct {
	http.ResponseWriter
	status int
	body   bytes.Buffer
}

func (r *recorder) WriteHeader(code int) {
	if r.status == 0 && code >= 200 {
		r.status = code
	}
	r.ResponseWriter.WriteHeader(code)
}

func (r *recorder) Write(b []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	r.body.Write(b)
	return r.ResponseWriter.Write(b)
}

func (r *recorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }
