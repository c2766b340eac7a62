package kubernetes

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/moat-sandbox/moat/internal/egress"
	"github.com/moat-sandbox/moat/internal/egress/sidecar"
)

// TestDialSidecar: the token goes only to a peer that proved it holds it;
// an impostor on the port (a sandbox process that bound it while its
// sidecar restarted) never sees the token and is not believed.
func TestDialSidecar(t *testing.T) {
	const token = "egress-token"
	var sawToken atomic.Int32
	serve := func(proofToken string) *httptest.Server {
		mux := http.NewServeMux()
		mux.HandleFunc("GET "+sidecar.ProofPath, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set(sidecar.ProofHeader, sidecar.Proof(proofToken, r.URL.Query().Get("nonce")))
			w.WriteHeader(http.StatusNoContent)
		})
		mux.HandleFunc("/policy", func(w http.ResponseWriter, r *http.Request) {
			if r.Header.Get(egress.AuthHeader) != "" {
				sawToken.Add(1)
			}
		})
		s := httptest.NewServer(mux)
		t.Cleanup(s.Close)
		return s
	}
	get := func(url string) error {
		req, _ := http.NewRequest("GET", url+"/policy", nil)
		req.Header.Set(egress.AuthHeader, token)
		tr := &http.Transport{DialContext: dialSidecar(token), DisableKeepAlives: true}
		defer tr.CloseIdleConnections()
		resp, err := (&http.Client{Transport: tr}).Do(req)
		if err == nil {
			resp.Body.Close()
		}
		return err
	}
	if err := get(serve(token).URL); err != nil || sawToken.Load() != 1 {
		t.Fatalf("the sidecar: %v (token seen %d times)", err, sawToken.Load())
	}
	if err := get(serve("another").URL); !errors.Is(err, errNotSidecar) {
		t.Errorf("an impostor: %v, want errNotSidecar", err)
	}
	if sawToken.Load() != 1 {
		t.Error("the impostor was sent the token")
	}
}
