package sidecar

import (
	"context"
	"encoding/json"
	"net/http"
	"net/netip"
	"strconv"
	"sync"
	"time"

	"github.com/moat-sandbox/moat/internal/egress"
	"github.com/moat-sandbox/moat/internal/egress/mitm"
)

// The credentials the pod's proxy withholds (mitm.Withheld, at most one
// report per binding and host in mitm.WithheldInterval) wait in the
// sidecar until the server takes them with a GET of WithheldPath (the
// egress token, on a proved connection, as for /policy): it answers at
// once with those waiting, or holds the request up to its wait
// parameter (seconds, at most MaxWithheldWait) for the next one. Each
// report goes to one GET; the server records them (the sandbox's
// CredentialWithheld event and audit record), as on the native runtime.
const (
	WithheldPath    = "/moat/v1/withheld"
	MaxWithheldWait = 60 * time.Second
	// maxWithheldPending bounds the reports waiting for the server;
	// beyond it the oldest are dropped (and counted).
	maxWithheldPending = 256
)

// WithheldReport is one withheld credential: the binding, the host and
// the address the sandbox chose. It holds no value.
type WithheldReport struct {
	Binding string     `json:"binding"`
	Host    string     `json:"host"`
	Dst     netip.Addr `json:"dst"`
}

// WithheldResponse is the answer to a GET of WithheldPath.
type WithheldResponse struct {
	Withheld []WithheldReport `json:"withheld"`
	// Dropped is how many reports were dropped since the last answer
	// (more than maxWithheldPending waiting).
	Dropped int `json:"dropped,omitempty"`
}

// WithheldQueue holds the withheld reports the server has not taken.
type WithheldQueue struct {
	mu      sync.Mutex
	pending []WithheldReport
	dropped int
	wake    chan struct{} // closed at the next report
}

// NewWithheldQueue returns an empty queue.
func NewWithheldQueue() *WithheldQueue { return &WithheldQueue{wake: make(chan struct{})} }

// Report queues w (the proxy's OnWithheld function).
func (q *WithheldQueue) Report(_ context.Context, w mitm.Withheld) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.pending) >= maxWithheldPending {
		q.pending = q.pending[1:]
		q.dropped++
	}
	q.pending = append(q.pending, WithheldReport{Binding: w.Binding, Host: w.Host, Dst: w.Dst})
	close(q.wake)
	q.wake = make(chan struct{})
}

// take returns the reports waiting, waiting up to wait (or ctx) for one
// when there are none.
func (q *WithheldQueue) take(ctx context.Context, wait time.Duration) WithheldResponse {
	t := time.NewTimer(wait)
	defer t.Stop()
	for {
		q.mu.Lock()
		if len(q.pending) > 0 || q.dropped > 0 || wait <= 0 {
			r := WithheldResponse{Withheld: q.pending, Dropped: q.dropped}
			q.pending, q.dropped = nil, 0
			q.mu.Unlock()
			return r
		}
		wake := q.wake
		q.mu.Unlock()
		select {
		case <-wake:
		case <-t.C:
			wait = 0
		case <-ctx.Done():
			wait = 0
		}
	}
}

// WithheldHandler serves GET WithheldPath from q for a sidecar holding
// token: 401 without the token, else 200 and a WithheldResponse.
func WithheldHandler(token string, q *WithheldQueue) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet {
			w.WriteHeader(http.StatusMethodNotAllowed)
			return
		}
		if !egress.HasToken(r, token) {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		var wait time.Duration
		if s, err := strconv.Atoi(r.URL.Query().Get("wait")); err == nil && s > 0 {
			wait = min(time.Duration(s)*time.Second, MaxWithheldWait)
		}
		resp := q.take(r.Context(), wait)
		if resp.Withheld == nil {
			resp.Withheld = []WithheldReport{}
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(resp)
	})
}
