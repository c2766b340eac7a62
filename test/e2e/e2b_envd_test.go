package e2e

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/moat-sandbox/moat/internal/agentproto"
	ppb "github.com/moat-sandbox/moat/internal/execd/envd/gen/process"
	"github.com/moat-sandbox/moat/internal/execd/envd/gen/process/processconnect"
)

// TestEnvdInSandbox drives the agent's E2B envd face inside a real
// sandbox: processes with in-sandbox pids that outlive their stream, and
// /files, with the sandbox's agent token.
func TestEnvdInSandbox(t *testing.T) {
	srv := newServer(t)
	ref := startRegistry(t)
	srv.start()
	var created sandboxResp
	srv.mustJSON(202, "POST", "/v1/sandboxes", map[string]any{
		"image": map[string]any{"uri": ref}, "entrypoint": []string{"tail", "-f", "/dev/null"}, "timeout": 600,
	}, &created)
	var ep endpointResp
	srv.mustJSON(200, "GET", fmt.Sprintf("/v1/sandboxes/%s/endpoints/44772", created.ID), nil, &ep)
	token := ep.Headers["X-EXECD-ACCESS-TOKEN"]
	host, _, err := net.SplitHostPort(ep.Endpoint)
	if err != nil || token == "" {
		t.Fatalf("endpoint %+v: %v", ep, err)
	}
	envdURL := "http://" + net.JoinHostPort(host, fmt.Sprint(agentproto.EnvdPort))
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(envdURL + "/health")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusNoContent {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("envd /health in the sandbox: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pc := processconnect.NewProcessClient(http.DefaultClient, envdURL, connect.WithProtoJSON())
	start := func(tok, script string) (*connect.ServerStreamForClient[ppb.StartResponse], error) {
		req := connect.NewRequest(&ppb.StartRequest{Process: &ppb.ProcessConfig{Cmd: "/bin/sh", Args: []string{"-c", script}}})
		req.Header().Set(agentproto.EnvdTokenHeader, tok)
		req.Header().Set("Keepalive-Ping-Interval", "50")
		return pc.Start(ctx, req)
	}
	run := func(script string) (pid uint32, out string, exit int32) {
		t.Helper()
		s, err := start(token, script)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		var b bytes.Buffer
		exit = -100
		for s.Receive() {
			ev := s.Msg().GetEvent()
			if st := ev.GetStart(); st != nil {
				pid = st.GetPid()
			}
			b.Write(ev.GetData().GetStdout())
			if end := ev.GetEnd(); end != nil {
				exit = end.GetExitCode()
			}
		}
		if err := s.Err(); err != nil {
			t.Fatalf("%s: %v", script, err)
		}
		return pid, b.String(), exit
	}

	// The pid is the shell's own pid inside the sandbox, gone after exit.
	pid, out, exit := run("echo $$; echo $FROM_IMAGE")
	if out != fmt.Sprintf("%d\nyes\n", pid) || exit != 0 {
		t.Fatalf("start: pid %d, out %q, exit %d", pid, out, exit)
	}
	if _, _, exit := run(fmt.Sprintf("kill -0 %d", pid)); exit == 0 {
		t.Fatalf("kill -0 %d succeeded after the process exited", pid)
	}

	// A process outlives the stream that started it and can be reattached.
	sctx, drop := context.WithCancel(ctx)
	req := connect.NewRequest(&ppb.StartRequest{Process: &ppb.ProcessConfig{Cmd: "/bin/sh", Args: []string{"-c", "sleep 2; echo late"}}})
	req.Header().Set(agentproto.EnvdTokenHeader, token)
	s, err := pc.Start(sctx, req)
	if err != nil || !s.Receive() {
		t.Fatalf("start: %v %v", err, s.Err())
	}
	bg := s.Msg().GetEvent().GetStart().GetPid()
	drop()
	s.Close()
	creq := connect.NewRequest(&ppb.ConnectRequest{Process: &ppb.ProcessSelector{Selector: &ppb.ProcessSelector_Pid{Pid: bg}}})
	creq.Header().Set(agentproto.EnvdTokenHeader, token)
	c, err := pc.Connect(ctx, creq)
	if err != nil {
		t.Fatal(err)
	}
	var late bytes.Buffer
	for c.Receive() {
		late.Write(c.Msg().GetEvent().GetData().GetStdout())
	}
	if late.String() != "late\n" || c.Err() != nil {
		t.Fatalf("reattached output %q, %v", late.String(), c.Err())
	}

	// Files written through /files are what the sandbox sees.
	q := url.Values{"path": {"/tmp/e2b/hello.txt"}}
	up, _ := http.NewRequest("POST", envdURL+"/files?"+q.Encode(), strings.NewReader("from envd"))
	up.Header.Set("Content-Type", "application/octet-stream")
	up.Header.Set(agentproto.EnvdTokenHeader, token)
	resp, err := http.DefaultClient.Do(up)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(body) != `[{"name":"hello.txt","path":"/tmp/e2b/hello.txt","type":"file"}]`+"\n" {
		t.Fatalf("upload: %d %s", resp.StatusCode, body)
	}
	if _, out, _ := run("cat /tmp/e2b/hello.txt"); out != "from envd" {
		t.Fatalf("the sandbox sees %q", out)
	}
	evs := runCommand(t, "http://"+ep.Endpoint, ep.Headers, "cat /tmp/e2b/hello.txt")
	if stdoutOf(evs) != "from envd" {
		t.Fatalf("execd sees %+v", evs)
	}

	// The wrong token is refused.
	if s, err := start("wrong", "true"); err == nil {
		for s.Receive() {
		}
		err = s.Err()
		if connect.CodeOf(err) != connect.CodeUnauthenticated {
			t.Fatalf("wrong token: %v", err)
		}
	} else if connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Fatalf("wrong token: %v", err)
	}
}
