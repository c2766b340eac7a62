package e2e

import (
	"bufio"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

type diagResp struct {
	SandboxID, Kind, Scope, Delivery, ContentType, Content string
	Truncated                                              bool
	Warnings                                               []string
}

// withheldEvents are the CredentialWithheld lines of sandbox id's runtime
// events.
func (s *server) withheldEvents(t *testing.T, id string) []string {
	t.Helper()
	var ev diagResp
	s.mustJSON(200, "GET", "/v1/sandboxes/"+id+"/diagnostics/events?scope=runtime", nil, &ev)
	var out []string
	for _, line := range strings.Split(ev.Content, "\n") {
		if strings.Contains(line, " CredentialWithheld ") {
			out = append(out, line)
		}
	}
	return out
}

// waitWithheld is withheldEvents once there is one (the proxy records
// the event off the request's path), or what there is after 30 s.
func (s *server) waitWithheld(t *testing.T, id string) []string {
	t.Helper()
	got := s.withheldEvents(t, id)
	for deadline := time.Now().Add(30 * time.Second); len(got) == 0 && time.Now().Before(deadline); got = s.withheldEvents(t, id) {
		time.Sleep(100 * time.Millisecond)
	}
	return got
}

// TestDiagnosticsAndAudit checks the Diagnostics API and the audit log
// against a real server and runc: console output reaches logs, events
// survive a SIGKILL of the server, and every mutating call is audited.
func TestDiagnosticsAndAudit(t *testing.T) {
	srv := newServer(t)
	ref := startRegistry(t)
	srv.start()
	var sb sandboxResp
	srv.mustJSON(202, "POST", "/v1/sandboxes", map[string]any{
		"image":      map[string]any{"uri": ref},
		"entrypoint": []string{"sh", "-c", "echo diag-marker-out; echo diag-marker-err >&2; exec tail -f /dev/null"},
	}, &sb)
	id := sb.ID

	var logs diagResp
	deadline := time.Now().Add(10 * time.Second)
	for {
		srv.mustJSON(200, "GET", "/v1/sandboxes/"+id+"/diagnostics/logs?scope=container", nil, &logs)
		if strings.Contains(logs.Content, "diag-marker-out") && strings.Contains(logs.Content, "diag-marker-err") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("console output not in logs: %+v", logs)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if logs.Kind != "logs" || logs.Delivery != "inline" || logs.SandboxID != id {
		t.Fatalf("logs descriptor %+v", logs)
	}
	code, text, hdr := srv.do("GET", "/v1/sandboxes/"+id+"/diagnostics/logs", nil)
	if code != 200 || hdr.Get("Deprecation") != "true" || !strings.Contains(string(text), "diag-marker-out") {
		t.Fatalf("legacy logs: %d %v %s", code, hdr, text)
	}

	srv.mustJSON(202, "POST", "/v1/sandboxes/"+id+"/pause", nil, nil)
	srv.mustJSON(202, "POST", "/v1/sandboxes/"+id+"/resume", nil, nil)
	time.Sleep(1500 * time.Millisecond) // one reaper tick writes the events
	srv.kill9()
	srv.start()

	var ev diagResp
	srv.mustJSON(200, "GET", "/v1/sandboxes/"+id+"/diagnostics/events?scope=all", nil, &ev)
	var types []string
	for _, line := range strings.Split(strings.TrimSpace(ev.Content), "\n") {
		if f := strings.Fields(line); len(f) >= 3 {
			types = append(types, f[2])
		}
	}
	if got, want := strings.Join(types, ","), "Created,Started,Paused,Resumed,Recovered"; got != want {
		t.Fatalf("events after restart: %s, want %s\n%s", got, want, ev.Content)
	}
	if code, _, _ := srv.do("DELETE", "/v1/sandboxes/"+id, nil); code != 204 {
		t.Fatal("delete")
	}
	srv.mustJSON(200, "GET", "/v1/sandboxes/"+id+"/diagnostics/events?scope=lifecycle", nil, &ev)
	if !strings.Contains(ev.Content, " Deleted ") {
		t.Fatalf("no Deleted event: %s", ev.Content)
	}
	assertNoLeaks(t, srv, id)

	// The audit log (default <root>/audit.log) has every mutating call.
	f, err := os.Open(filepath.Join(srv.root, "audit.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var got []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var r struct {
			Method, Path, SandboxID string
			Status                  int
		}
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("bad audit line %q", sc.Text())
		}
		if r.SandboxID != id {
			t.Errorf("audit line without the sandbox id: %s", sc.Text())
		}
		if strings.Contains(sc.Text(), srv.key) {
			t.Errorf("audit log holds the API key: %s", sc.Text())
		}
		got = append(got, r.Method+" "+strings.TrimPrefix(r.Path, "/v1/sandboxes/"+id)+" "+itoa(r.Status))
	}
	want := []string{"POST /v1/sandboxes 202", "POST /pause 202", "POST /resume 202", "DELETE  204"}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("audit log:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func itoa(n int) string {
	b, _ := json.Marshal(n)
	return string(b)
}
