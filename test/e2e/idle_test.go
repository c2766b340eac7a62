package e2e

import (
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestIdlePauseAndWake: a sandbox created with a 2 s idle timeout is
// paused by a real server once nothing reaches it (IdlePaused event), and
// a command through the server proxy wakes it and runs (Woken event), on
// every native runtime class.
func TestIdlePauseAndWake(t *testing.T) {
	srv := newServer(t)
	ref := startRegistry(t)
	srv.start()
	classes := []string{"runc", "crun"}
	if _, err := exec.LookPath("runsc"); err == nil {
		classes = append(classes, "runsc")
	}
	for _, class := range classes {
		t.Run(class, func(t *testing.T) { idleRoundTrip(t, srv, ref, class) })
	}
	n := len(classes)
	code, body, _ := srv.do("GET", "/metrics", nil)
	if code != 200 || !strings.Contains(string(body), fmt.Sprintf(`moat_idle_pauses_total{action="pause"} %d`, 2*n)) ||
		!strings.Contains(string(body), fmt.Sprintf(`moat_idle_wakes_total{result="ok"} %d`, n)) {
		t.Fatalf("metrics: %d\n%s", code, grepLines(string(body), "moat_idle_"))
	}
}

// TestIdlePauseAndWakeDocker is TestIdlePauseAndWake on the docker runtime.
func TestIdlePauseAndWakeDocker(t *testing.T) {
	srv := newServer(t)
	ref := startRegistry(t)
	srv.startDocker()
	idleRoundTrip(t, srv, ref, "")
}

// idleRoundTrip creates a sandbox of class ("": the server's default)
// with a 2 s idle timeout, waits for the idle pause, wakes it with a
// command through the server proxy, and waits for the next idle pause.
func idleRoundTrip(t *testing.T, srv *server, ref, class string) {
	ext := map[string]string{"moat.idle.timeout": "2"}
	if class != "" {
		ext["moat.runtime"] = class
	}
	var sb sandboxResp
	srv.mustJSON(202, "POST", "/v1/sandboxes", map[string]any{
		"image":      map[string]any{"uri": ref},
		"entrypoint": []string{"tail", "-f", "/dev/null"},
		"timeout":    600,
		"extensions": ext,
	}, &sb)
	id := sb.ID
	waitIdleState(t, srv, id, "Paused")
	var got sandboxResp
	srv.mustJSON(200, "GET", "/v1/sandboxes/"+id, nil, &got)
	if got.Status.Reason != "SANDBOX_IDLE_PAUSED" {
		t.Fatalf("idle-paused status: %+v", got.Status)
	}
	if ev := lifecycleEvents(t, srv, id); !strings.Contains(ev, " IdlePaused SANDBOX_IDLE_PAUSED no activity for ") {
		t.Fatalf("no IdlePaused event:\n%s", ev)
	}

	// Straight to the proxy route (an endpoint lookup would wake it
	// first): the request is held while the sandbox resumes.
	proxy := "http://" + srv.addr + "/sandboxes/" + id + "/proxy/44772"
	evs := runCommand(t, proxy, map[string]string{"X-EXECD-ACCESS-TOKEN": srv.key}, "echo awake")
	assertCompleted(t, evs)
	if out := stdoutOf(evs); out != "awake" {
		t.Fatalf("command after the wake: %q", out)
	}
	srv.mustJSON(200, "GET", "/v1/sandboxes/"+id, nil, &got)
	if got.Status.State != "Running" {
		t.Fatalf("after the wake: %+v", got.Status)
	}
	if ev := lifecycleEvents(t, srv, id); !strings.Contains(ev, " Woken SANDBOX_WAKING woken by a request through the server proxy") {
		t.Fatalf("no Woken event:\n%s", ev)
	}

	// Left alone again, it is paused again.
	waitIdleState(t, srv, id, "Paused")
	if code, body, _ := srv.do("DELETE", "/v1/sandboxes/"+id, nil); code != 204 {
		t.Fatalf("delete: %d %s", code, body)
	}
	assertNoLeaks(t, srv, id)
}

func waitIdleState(t *testing.T, srv *server, id, want string) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		var got sandboxResp
		srv.mustJSON(200, "GET", "/v1/sandboxes/"+id, nil, &got)
		if got.Status.State == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("sandbox %s is %+v, want %s", id, got.Status, want)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// lifecycleEvents is the text of a sandbox's lifecycle events.
func lifecycleEvents(t *testing.T, srv *server, id string) string {
	t.Helper()
	var ev diagResp
	srv.mustJSON(200, "GET", "/v1/sandboxes/"+id+"/diagnostics/events?scope=lifecycle", nil, &ev)
	return ev.Content
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
