package execd

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/moat-sandbox/moat/internal/agentproto"
	ppb "github.com/moat-sandbox/moat/internal/execd/envd/gen/process"
	"github.com/moat-sandbox/moat/internal/execd/envd/gen/process/processconnect"
)

func TestParseArgsEnvd(t *testing.T) {
	getenv := func(string) string { return "" }
	cfg, err := ParseArgs([]string{"--listen", "10.0.0.2:44772"}, getenv)
	if err != nil || cfg.EnvdListen != "10.0.0.2:49983" || cfg.EnvdUser != "root" || cfg.EnvdWorkdir != "" {
		t.Fatalf("default envd: %+v, %v", cfg, err)
	}
	cfg, err = ParseArgs([]string{"--envd-listen", "off"}, getenv)
	if err != nil || cfg.EnvdListen != "" {
		t.Fatalf("envd off: %+v, %v", cfg, err)
	}
	cfg, err = ParseArgs([]string{"--envd-listen", "127.0.0.1:7", "--envd-user", "user", "--envd-workdir", "/home/user"}, getenv)
	if err != nil || cfg.EnvdListen != "127.0.0.1:7" || cfg.EnvdUser != "user" || cfg.EnvdWorkdir != "/home/user" {
		t.Fatalf("envd flags: %+v, %v", cfg, err)
	}
	// A template's user and workdir arrive as env; the flags win over it.
	tmplEnv := func(k string) string {
		return map[string]string{agentproto.EnvdUserEnv: "user", agentproto.EnvdWorkdirEnv: "/home/user"}[k]
	}
	cfg, err = ParseArgs(nil, tmplEnv)
	if err != nil || cfg.EnvdUser != "user" || cfg.EnvdWorkdir != "/home/user" {
		t.Fatalf("envd from the template's env: %+v, %v", cfg, err)
	}
	cfg, err = ParseArgs([]string{"--envd-user", "root", "--envd-workdir", "/tmp"}, tmplEnv)
	if err != nil || cfg.EnvdUser != "root" || cfg.EnvdWorkdir != "/tmp" {
		t.Fatalf("envd flags over env: %+v, %v", cfg, err)
	}
	for _, bad := range [][]string{{"--envd-listen", "noport"}, {"--listen", "127.0.0.1:5", "--envd-listen", "127.0.0.1:5"}, {"--envd-workdir", "rel"}} {
		if _, err := ParseArgs(bad, getenv); err == nil {
			t.Errorf("%v accepted", bad)
		}
	}
}

// h2cClient speaks HTTP/2 without TLS, as envd's Go and Python clients can.
func h2cClient() *http.Client {
	p := new(http.Protocols)
	p.SetUnencryptedHTTP2(true)
	return &http.Client{Transport: &http.Transport{Protocols: p, TLSClientConfig: &tls.Config{}}}
}

// TestAgentServesEnvd starts a real agent with its envd face and drives it
// over HTTP/1.1 and h2c, including after the token is replaced.
func TestAgentServesEnvd(t *testing.T) {
	envdPort := freePort(t)
	envdURL := fmt.Sprintf("http://127.0.0.1:%d", envdPort)
	const token = "envd-agent-token-1"
	a := startAgentArgs(t, false, token, []string{"--envd-listen", net.JoinHostPort("127.0.0.1", fmt.Sprint(envdPort)), "--code-interpreter-listen", "off"})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// /health over HTTP/1.1, once the listener is up.
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := http.Get(envdURL + "/health")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusNoContent {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("envd /health: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	run := func(c *http.Client, tok string) (string, error) {
		pc := processconnect.NewProcessClient(c, envdURL, connect.WithProtoJSON())
		req := connect.NewRequest(&ppb.StartRequest{Process: &ppb.ProcessConfig{Cmd: "/bin/sh", Args: []string{"-c", "echo $((6*7))"}}})
		req.Header().Set(agentproto.EnvdTokenHeader, tok)
		s, err := pc.Start(ctx, req)
		if err != nil {
			return "", err
		}
		defer s.Close()
		var out bytes.Buffer
		for s.Receive() {
			out.Write(s.Msg().GetEvent().GetData().GetStdout())
		}
		return out.String(), s.Err()
	}
	if resp, err := h2cClient().Get(envdURL + "/health"); err != nil || resp.ProtoMajor != 2 {
		t.Fatalf("h2c /health: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}
	for name, c := range map[string]*http.Client{"http1": http.DefaultClient, "h2c": h2cClient()} {
		out, err := run(c, token)
		if err != nil || out != "42\n" {
			t.Fatalf("%s: %q %v", name, out, err)
		}
	}
	// envd follows the agent's token.
	const next = "envd-agent-token-2"
	req, _ := http.NewRequest("POST", a.url+agentproto.TokenPath, bytes.NewReader([]byte(`{"token":"`+next+`"}`)))
	req.Header.Set(TokenHeader, token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("set token: %v %v", resp, err)
	}
	resp.Body.Close()
	if _, err := run(http.DefaultClient, token); connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Fatalf("old token: %v", err)
	}
	if out, err := run(h2cClient(), next); err != nil || out != "42\n" {
		t.Fatalf("new token: %q %v", out, err)
	}
}
