package agentproto_test

import (
	"context"
	"errors"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/internal/agentproto"
	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/execd"
	"github.com/moat-sandbox/moat/internal/gen/execdapi"
	"github.com/moat-sandbox/moat/internal/gen/wirecheck"
	"github.com/moat-sandbox/moat/internal/runtime/fake/fakeagent"
)

const token = "0123456789abcdef-token"

func endpoint(srv *httptest.Server) string { return strings.TrimPrefix(srv.URL, "http://") }

// TestClientDrivesEveryVersion drives an agent of each protocol version
// this server supports, from agents that predate versioning (1) to a
// future one, through every call the server makes.
func TestClientDrivesEveryVersion(t *testing.T) {
	for _, v := range []int{1, agentproto.Version, agentproto.Version + 1} {
		a := fakeagent.New(token)
		a.Version = v
		srv := httptest.NewServer(a)
		ctx := context.Background()
		var c agentproto.Client
		info, err := c.Ping(ctx, endpoint(srv), token)
		if err != nil || info.Version != v {
			t.Fatalf("v%d: Ping = %+v, %v", v, info, err)
		}
		if !info.Supports(agentproto.MinVersion) || info.Supports(v+1) {
			t.Errorf("v%d: Supports is wrong: %+v", v, info)
		}
		if err := c.SetEnv(ctx, endpoint(srv), token, map[string]string{"A": "1"}); err != nil {
			t.Fatalf("v%d: SetEnv: %v", v, err)
		}
		if got := a.Env()["A"]; got != "1" {
			t.Errorf("v%d: env A = %q", v, got)
		}
		const next = "fedcba9876543210-token"
		if err := c.RotateToken(ctx, endpoint(srv), token, next); err != nil {
			t.Fatalf("v%d: RotateToken: %v", v, err)
		}
		if _, err := c.Ping(ctx, endpoint(srv), token); !errors.Is(err, errdefs.ErrUnavailable) {
			t.Errorf("v%d: Ping with the old token = %v, want unavailable", v, err)
		}
		if _, err := c.Ping(ctx, endpoint(srv), next); err != nil {
			t.Errorf("v%d: Ping with the new token: %v", v, err)
		}
		srv.Close()
	}
}

// TestClientAgainstExecd checks the real agent (internal/execd) against
// the protocol: it reports the current version and serves the extensions.
func TestClientAgainstExecd(t *testing.T) {
	s, err := execd.NewServer(execd.Options{Token: token, StateDir: t.TempDir(), Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(s)
	defer func() {
		srv.Close()
		s.Close(context.Background())
	}()
	ctx := context.Background()
	var c agentproto.Client
	info, err := c.Ping(ctx, endpoint(srv), token)
	if err != nil || info.Version != agentproto.Version {
		t.Fatalf("Ping = %+v, %v; want version %d", info, err, agentproto.Version)
	}
	if _, err := c.Ping(ctx, endpoint(srv), "wrong-token-wrong-token"); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("Ping with a wrong token = %v", err)
	}
	if err := c.SetEnv(ctx, endpoint(srv), token, map[string]string{"K": "V"}); err != nil {
		t.Fatal(err)
	}
	if err := c.SetEnv(ctx, endpoint(srv), token, map[string]string{"BAD=": "V"}); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("SetEnv of a bad name = %v, want an error", err)
	}
	const next = "fedcba9876543210-token"
	if err := c.RotateToken(ctx, endpoint(srv), token, next); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Ping(ctx, endpoint(srv), next); err != nil {
		t.Errorf("Ping with the rotated token: %v", err)
	}
}

func TestParseVersion(t *testing.T) {
	for i, tc := range []struct {
		in   string
		want int
		ok   bool
	}{
		{"", 1, true}, {"1", 1, true}, {"2", 2, true}, {"17", 17, true},
		{"0", 0, false}, {"-1", 0, false}, {"v2", 0, false}, {"2.0", 0, false},
	} {
		got, ok := agentproto.ParseVersion(tc.in)
		if got != tc.want || ok != tc.ok {
			t.Errorf("%d: ParseVersion(%q) = %d, %v; want %d, %v", i, tc.in, got, ok, tc.want, tc.ok)
		}
	}
}

func TestWaitReady(t *testing.T) {
	// Refuses connections until the agent starts serving.
	a := fakeagent.New(token)
	srv := httptest.NewUnstartedServer(a)
	ep := srv.Listener.Addr().String()
	go func() {
		time.Sleep(20 * time.Millisecond)
		srv.Start()
	}()
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var c agentproto.Client
	if info, err := c.WaitReady(ctx, ep, token); err != nil || info.Version != agentproto.Version {
		t.Fatalf("WaitReady = %+v, %v", info, err)
	}
	// An agent that never accepts the token: the deadline is reported.
	short, cancel2 := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel2()
	if _, err := c.WaitReady(short, ep, "not-the-token-at-all"); !errors.Is(err, errdefs.ErrDeadlineExceeded) || !strings.Contains(err.Error(), "401") {
		t.Errorf("WaitReady with a wrong token = %v", err)
	}
}

// TestBodiesMatchSpec holds the extension bodies to the models generated
// from api/openapi/execd.yaml.
func TestBodiesMatchSpec(t *testing.T) {
	wirecheck.Request[agentproto.SetEnvRequest, execdapi.MoatSetEnvRequest](t, "MoatSetEnvRequest")
	wirecheck.Request[agentproto.SetTokenRequest, execdapi.MoatSetTokenRequest](t, "MoatSetTokenRequest")
}
