package sidecar_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/internal/egress"
	"github.com/moat-sandbox/moat/internal/egress/mitm"
	"github.com/moat-sandbox/moat/internal/egress/sidecar"
)

// TestWithheldHandler: the withheld reports wait for the server's GET,
// which needs the token, holds until a report comes (up to its wait),
// and takes each report once.
func TestWithheldHandler(t *testing.T) {
	q := sidecar.NewWithheldQueue()
	srv := httptest.NewServer(sidecar.WithheldHandler(token, q))
	t.Cleanup(srv.Close)
	get := func(tok, wait string) (int, sidecar.WithheldResponse) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, srv.URL+sidecar.WithheldPath+"?wait="+wait, nil)
		if tok != "" {
			req.Header.Set(egress.AuthHeader, tok)
		}
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var r sidecar.WithheldResponse
		if resp.StatusCode == http.StatusOK {
			if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
				t.Fatal(err)
			}
		}
		return resp.StatusCode, r
	}
	w := mitm.Withheld{Binding: "api", Host: "api.test", Dst: netip.MustParseAddr("192.0.2.1")}
	q.Report(context.Background(), w)
	if code, _ := get("", "0"); code != http.StatusUnauthorized {
		t.Fatalf("without the token: %d", code)
	}
	if code, _ := get("wrong", "0"); code != http.StatusUnauthorized {
		t.Fatalf("with another token: %d", code)
	}
	code, r := get(token, "0")
	if code != http.StatusOK || len(r.Withheld) != 1 || r.Withheld[0] != (sidecar.WithheldReport{Binding: w.Binding, Host: w.Host, Dst: w.Dst}) {
		t.Fatalf("GET: %d %+v", code, r)
	}
	if _, r := get(token, "0"); len(r.Withheld) != 0 {
		t.Fatalf("a report was taken twice: %+v", r)
	}
	// A waiting GET answers at the next report.
	go func() {
		time.Sleep(100 * time.Millisecond)
		q.Report(context.Background(), mitm.Withheld{Binding: "b", Host: "b.test", Dst: netip.MustParseAddr("192.0.2.2")})
	}()
	start := time.Now()
	if _, r := get(token, "30"); len(r.Withheld) != 1 || r.Withheld[0].Binding != "b" || time.Since(start) > 20*time.Second {
		t.Fatalf("long poll: %+v after %v", r, time.Since(start))
	}
}
