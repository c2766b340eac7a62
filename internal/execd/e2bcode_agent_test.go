package execd

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/internal/agentproto"
)

func TestParseArgsCodeInterpreter(t *testing.T) {
	getenv := func(string) string { return "" }
	cfg, err := ParseArgs([]string{"--listen", "10.0.0.2:44772"}, getenv)
	if err != nil || cfg.CodeListen != "10.0.0.2:49999" {
		t.Fatalf("default: %+v, %v", cfg, err)
	}
	cfg, err = ParseArgs([]string{"--code-interpreter-listen", "off"}, getenv)
	if err != nil || cfg.CodeListen != "" {
		t.Fatalf("off: %+v, %v", cfg, err)
	}
	cfg, err = ParseArgs([]string{"--code-interpreter-listen", "127.0.0.1:9"}, getenv)
	if err != nil || cfg.CodeListen != "127.0.0.1:9" {
		t.Fatalf("flag: %+v, %v", cfg, err)
	}
	for _, bad := range [][]string{
		{"--code-interpreter-listen", "noport"},
		{"--listen", "127.0.0.1:5", "--code-interpreter-listen", "127.0.0.1:5"},
		{"--envd-listen", "127.0.0.1:6", "--code-interpreter-listen", "127.0.0.1:6"},
	} {
		if _, err := ParseArgs(bad, getenv); err == nil {
			t.Errorf("%v accepted", bad)
		}
	}
}

// TestAgentServesCodeInterpreter starts a real agent with its code
// interpreter and runs a cell through /execute with the agent's token, in
// a context the execd API lists too.
func TestAgentServesCodeInterpreter(t *testing.T) {
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("python3 is not installed")
	}
	port := freePort(t)
	url := fmt.Sprintf("http://127.0.0.1:%d", port)
	const token = "code-agent-token-1"
	a := startAgentArgs(t, false, token, []string{"--envd-listen", "off", "--code-interpreter-listen", net.JoinHostPort("127.0.0.1", fmt.Sprint(port))})
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := http.Get(url + "/health")
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == 200 && string(b) == `"OK"` {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("/health: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	execute := func(tok string) (int, string) {
		req, _ := http.NewRequest("POST", url+"/execute", strings.NewReader(`{"code":"6*7"}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(agentproto.EnvdTokenHeader, tok)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if st, b := execute("wrong"); st != 401 {
		t.Fatalf("wrong token: %d %s", st, b)
	}
	st, b := execute(token)
	if st != 200 || !strings.Contains(b, `"text":"42"`) || !strings.HasSuffix(b, `{"type":"end_of_execution"}`+"\n") {
		t.Fatalf("execute: %d %s", st, b)
	}
	// The default python context is one of the agent's code contexts.
	req, _ := http.NewRequest("GET", a.url+"/code/contexts", nil)
	req.Header.Set(TokenHeader, token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var list []struct{ ID, Language string }
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil || len(list) != 1 || list[0].Language != "python" {
		t.Fatalf("execd contexts: %v %v", list, err)
	}
	if st, b := execute(token); st != 200 || !bytes.Contains([]byte(b), []byte(`"execution_count":2`)) {
		t.Fatalf("second execute: %d %s", st, b)
	}
}
