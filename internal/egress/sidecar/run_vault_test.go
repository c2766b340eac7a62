//go:build linux

package sidecar_test

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/moat-sandbox/moat/internal/egress"
	"github.com/moat-sandbox/moat/internal/egress/nettest"
	"github.com/moat-sandbox/moat/internal/egress/sidecar"
	"github.com/moat-sandbox/moat/internal/testutil"
)

// TestSidecarVault runs the sidecar with a vault key in a "pod" namespace:
// once the server's sealed vault is pushed, the pod's plain HTTP to a
// bound host (an outside host of the test's gateway namespace, reached by
// the name the sidecar resolved) arrives with the credential, which the
// pod never held; an unbound host gets nothing.
func TestSidecarVault(t *testing.T) {
	testutil.RequiresRoot(t)
	tp := nettest.New(t)
	for _, h := range []string{allowedHost, upstreamDNS} {
		tp.AddHost(t, netip.MustParseAddr(h))
	}
	// The outside host echoes the Authorization header it got (the proxy
	// scrubs the value from the answer) and records it.
	seen := make(chan string, 4)
	var ln net.Listener
	if err := nettest.Do(tp.GatewayPath, func() (err error) { ln, err = net.Listen("tcp", allowedHost+":80"); return err }); err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen <- r.Header.Get("Authorization")
		fmt.Fprintf(w, "auth=%q", r.Header.Get("Authorization"))
	}), ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	nettest.ServeDNS(t, tp.GatewayPath, net.JoinHostPort(upstreamDNS, "53"), map[string][]string{
		"allowed.test.": {"allowed.test. 300 IN A " + allowedHost},
		"other.test.":   {"other.test. 300 IN A " + allowedHost},
	})
	keyB := bytes.Repeat([]byte{1}, 32)
	cmd := exec.Command("ip", "netns", "exec", tp.Sandbox, os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"="+t.TempDir(), sidecar.EnvToken+"="+token,
		sidecar.EnvPolicy+`={"defaultAction":"deny","egress":[{"action":"allow","target":"allowed.test"},{"action":"allow","target":"other.test"}]}`,
		sidecar.EnvDNS+"="+upstreamDNS+":53", sidecar.EnvVaultKey+"="+hex.EncodeToString(keyB))
	cmd.Stdout, cmd.Stderr = t.Output(), t.Output()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })

	body, _ := vaultBody(t, sealer(t, 1), `{"hosts":["allowed.test"],"schemes":["http"],"ports":[80]}`)
	put := func() (int, error) {
		var c net.Conn
		if err := nettest.Do(tp.SandboxPath, func() (err error) { c, err = net.DialTimeout("tcp", "127.0.0.1:18080", time.Second); return err }); err != nil {
			return 0, err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		req, _ := http.NewRequest(http.MethodPut, "http://127.0.0.1:18080"+sidecar.VaultPath, bytes.NewReader(body))
		req.Header.Set(egress.AuthHeader, token)
		if err := req.Write(c); err != nil {
			return 0, err
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), req)
		if err != nil {
			return 0, err
		}
		resp.Body.Close()
		return resp.StatusCode, nil
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		code, err := put()
		if err == nil && code == http.StatusNoContent {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("PUT vault: %d %v", code, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	get := func(host string) string {
		t.Helper()
		r, err := nettest.Query(tp.SandboxPath, "udp", "127.0.0.1:53", host, dns.TypeA, 2*time.Second)
		if err != nil || len(nettest.Addrs(r)) != 1 {
			t.Fatalf("resolve %s: %v", host, err)
		}
		var c net.Conn
		if err := nettest.Do(tp.SandboxPath, func() (err error) {
			c, err = net.DialTimeout("tcp", net.JoinHostPort(nettest.Addrs(r)[0].String(), "80"), 2*time.Second)
			return err
		}); err != nil {
			out, _ := exec.Command("ip", "netns", "exec", tp.Sandbox, "nft", "list", "ruleset").CombinedOutput()
			t.Fatalf("%v\n%s", err, out)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", host)
		b, _ := io.ReadAll(c)
		return string(b)
	}
	if got := get("allowed.test"); !strings.Contains(got, "200 OK") || strings.Contains(got, vaultSecret) {
		t.Errorf("bound host answered the pod %q", got)
	}
	if got := <-seen; got != "Bearer "+vaultSecret {
		t.Errorf("bound host got Authorization %q", got)
	}
	if got := get("other.test"); !strings.Contains(got, `auth=""`) {
		t.Errorf("unbound host: %q", got)
	}
	if got := <-seen; got != "" {
		t.Errorf("unbound host got Authorization %q", got)
	}
}
