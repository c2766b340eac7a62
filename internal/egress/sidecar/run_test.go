//go:build linux

package sidecar_test

import (
	"context"
	"encoding/hex"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"
	"go.uber.org/goleak"

	"github.com/moat-sandbox/moat/internal/egress"
	"github.com/moat-sandbox/moat/internal/egress/nettest"
	"github.com/moat-sandbox/moat/internal/egress/sidecar"
	"github.com/moat-sandbox/moat/internal/testutil"
)

// helperEnv makes the test binary the sidecar (TestSidecarProcess).
const helperEnv = "MOAT_SIDECAR_TEST_HELPER"

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) != "" {
		os.Exit(helper())
	}
	goleak.VerifyTestMain(m)
}

// helper runs the sidecar as `moat controller egress-sidecar` does, in
// the network namespace the test started it in.
func helper() int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	var key []byte
	if k := os.Getenv(sidecar.EnvVaultKey); k != "" {
		key, _ = hex.DecodeString(k)
	}
	err := sidecar.Run(ctx, sidecar.Options{
		VaultKey:  key,
		Token:     os.Getenv(sidecar.EnvToken),
		Policy:    []byte(os.Getenv(sidecar.EnvPolicy)),
		Upstreams: strings.Split(os.Getenv(sidecar.EnvDNS), ","),
		StateDir:  os.Getenv(helperEnv),
	})
	if err != nil {
		os.Stderr.WriteString(err.Error() + "\n")
		return 1
	}
	return 0
}

const (
	allowedHost = "10.250.2.10" // allowed.test
	deniedHost  = "10.250.2.20" // denied.test
	upstreamDNS = "10.250.2.53" // the pod's cluster DNS stand-in
	token       = "sidecar-test-token"
)

// TestSidecar runs the sidecar in a throw-away "pod" network namespace
// whose outside hosts and upstream resolver live in a gateway namespace
// of the test's own: the policy holds for the pod's other processes
// (only allowed names answered, only their addresses reachable, no other
// resolver), the sidecar's own upstream queries pass, the egress API
// wants the token and changes the policy live, and a restarted sidecar
// resumes the policy last set; a dead one leaves the pod filtered.
func TestSidecar(t *testing.T) {
	testutil.RequiresRoot(t)
	tp := nettest.New(t)
	for _, h := range []string{allowedHost, deniedHost, upstreamDNS} {
		tp.AddHost(t, netip.MustParseAddr(h))
	}
	for _, h := range []string{allowedHost, deniedHost} {
		nettest.ServeTCP(t, tp.GatewayPath, net.JoinHostPort(h, "80"))
	}
	records := map[string][]string{
		"allowed.test.": {"allowed.test. 300 IN A " + allowedHost},
		"denied.test.":  {"denied.test. 300 IN A " + deniedHost},
	}
	nettest.ServeDNS(t, tp.GatewayPath, net.JoinHostPort(upstreamDNS, "53"), records)
	state := t.TempDir()
	start := func() *exec.Cmd {
		t.Helper()
		cmd := exec.Command("ip", "netns", "exec", tp.Sandbox, os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), helperEnv+"="+state, sidecar.EnvToken+"="+token,
			sidecar.EnvPolicy+`={"defaultAction":"deny","egress":[{"action":"allow","target":"allowed.test"}]}`,
			sidecar.EnvDNS+"="+upstreamDNS+":53")
		cmd.Stdout, cmd.Stderr = t.Output(), t.Output()
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		return cmd
	}
	api := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (c net.Conn, err error) {
			err = nettest.Do(tp.SandboxPath, func() error { c, err = (&net.Dialer{}).DialContext(ctx, network, addr); return err })
			return c, err
		},
		DisableKeepAlives: true,
	}}
	call := func(method, body, tok string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(method, "http://127.0.0.1:18080/policy", strings.NewReader(body))
		if tok != "" {
			req.Header.Set(egress.AuthHeader, tok)
		}
		resp, err := api.Do(req)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	waitUp := func() {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for {
			if code, _ := call("GET", "", token); code == http.StatusOK {
				return
			}
			if time.Now().After(deadline) {
				t.Fatal("the sidecar's egress API did not come up")
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	resolve := func(server, name string) (int, []string) {
		t.Helper()
		r, err := nettest.Query(tp.SandboxPath, "udp", server, name, dns.TypeA, 2*time.Second)
		if err != nil {
			return -1, nil
		}
		var got []string
		for _, a := range nettest.Addrs(r) {
			got = append(got, a.String())
		}
		return r.Rcode, got
	}
	reach := func(host string, want bool) {
		t.Helper()
		wait := 2 * time.Second
		if !want {
			wait = 300 * time.Millisecond
		}
		err := nettest.DialTCP(tp.SandboxPath, net.JoinHostPort(host, "80"), wait)
		if want && err != nil {
			t.Errorf("%s should be reachable: %v", host, err)
		} else if !want && err == nil {
			t.Errorf("%s should be blocked", host)
		}
	}

	cmd := start()
	waitUp()
	// It proves it holds the token, without being sent it.
	nonce := "0123456789abcdef0123"
	if resp, err := api.Get("http://127.0.0.1:18080" + sidecar.ProofPath + "?nonce=" + nonce); err != nil {
		t.Error(err)
	} else {
		resp.Body.Close()
		if got := resp.Header.Get(sidecar.ProofHeader); got != sidecar.Proof(token, nonce) {
			t.Errorf("proof %q, want %q", got, sidecar.Proof(token, nonce))
		}
	}
	if rc, got := resolve("127.0.0.1:53", "allowed.test"); rc != dns.RcodeSuccess || len(got) != 1 || got[0] != allowedHost {
		t.Errorf("allowed.test through the sidecar: rcode %d %v", rc, got)
	}
	if rc, _ := resolve("127.0.0.1:53", "denied.test"); rc != dns.RcodeNameError {
		t.Errorf("denied.test through the sidecar: rcode %d, want NXDOMAIN", rc)
	}
	if rc, _ := resolve(upstreamDNS+":53", "denied.test"); rc != -1 {
		t.Errorf("the upstream resolver answered the pod directly (rcode %d)", rc)
	}
	reach(allowedHost, true)
	reach(deniedHost, false)

	if code, _ := call("PATCH", `[{"action":"allow","target":"denied.test"}]`, "wrong"); code != http.StatusUnauthorized {
		t.Errorf("PATCH with a wrong token: %d, want 401", code)
	}
	if code, body := call("PATCH", `[{"action":"allow","target":"denied.test"}]`, token); code != http.StatusOK {
		t.Fatalf("PATCH: %d %s", code, body)
	}
	if rc, _ := resolve("127.0.0.1:53", "denied.test"); rc != dns.RcodeSuccess {
		t.Errorf("denied.test after the PATCH allowed it: rcode %d", rc)
	}
	reach(deniedHost, true)

	// A dead sidecar leaves the ruleset: nothing new opens.
	cmd.Process.Kill()
	cmd.Wait()
	if code, _ := call("POST", `{"defaultAction":"allow"}`, token); code == http.StatusOK {
		t.Fatal("a killed sidecar answered")
	}
	if rc, _ := resolve(upstreamDNS+":53", "allowed.test"); rc != -1 {
		t.Error("with the sidecar dead, the pod reached the upstream resolver")
	}
	// A restarted one resumes the policy last set.
	start()
	waitUp()
	if code, body := call("GET", "", token); code != http.StatusOK || !strings.Contains(body, `"denied.test"`) {
		t.Errorf("restarted sidecar's policy: %d %s", code, body)
	}
	if code, body := call("POST", `{"defaultAction":"deny"}`, token); code != http.StatusOK || !strings.Contains(body, `"deny_all"`) {
		t.Errorf("POST deny-all: %d %s", code, body)
	}
	if rc, _ := resolve("127.0.0.1:53", "allowed.test"); rc != dns.RcodeNameError {
		t.Errorf("allowed.test under deny-all: rcode %d, want NXDOMAIN", rc)
	}
}
