package e2e

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/internal/testutil"
)

// oomCommand fills 100 MiB in five dd, with the agent (PID 1) the OOM
// killer's first choice on a kernel sandbox: the whole sandbox dies, as a
// gVisor sandbox (its Sentry is one host process) does in any case.
const oomCommand = "echo 1000 >/proc/1/oom_score_adj; echo allocating; " +
	"for i in 1 2 3 4 5; do dd if=/dev/zero of=/dev/null bs=20M count=1000 & done; wait"

// TestSandboxDeathReported: a sandbox that runs out of memory is Failed at
// once, with the reason and an event; a `moat exec` running in it ends
// promptly with an error that says why, whether it reaches the agent
// directly or through the server's proxy; the server log names the
// sandbox and the reason. For every installed native runtime class.
func TestSandboxDeathReported(t *testing.T) {
	ref := startRegistry(t)
	for _, class := range []string{"runc", "crun", "runsc"} {
		t.Run(class, func(t *testing.T) {
			testutil.LookRuntime(t, class)
			srv := newServer(t)
			srv.start("--runtime-class", class)
			for _, via := range []string{"direct", "server-proxy"} {
				t.Run(via, func(t *testing.T) {
					var sb sandboxResp
					srv.mustJSON(202, "POST", "/v1/sandboxes", map[string]any{"image": map[string]any{"uri": ref},
						"entrypoint": []string{"tail", "-f", "/dev/null"}, "timeout": 600,
						"resourceLimits": map[string]string{"memory": "64Mi"}}, &sb)
					t.Cleanup(func() { srv.do("DELETE", "/v1/sandboxes/"+sb.ID, nil) })
					args := []string{"exec", sb.ID, "--", oomCommand}
					if via == "server-proxy" {
						args = []string{"exec", "--server-proxy", sb.ID, "--", oomCommand}
					}
					start := time.Now()
					r := cli(t, srv, nil, args...)
					took := time.Since(start)
					// Far below the minutes a dead gVisor sandbox's
					// connection takes to time out; generous for a busy host.
					if took > 20*time.Second {
						t.Errorf("moat exec ended %v after the start, want within 20s", took.Round(time.Second))
					}
					if r.code == 0 || !strings.Contains(r.stderr, "OOM killer") || !strings.Contains(r.stdout, "allocating") {
						t.Fatalf("moat exec: exit %d\nstdout: %s\nstderr: %s", r.code, r.stdout, r.stderr)
					}

					var got sandboxResp
					srv.mustJSON(200, "GET", "/v1/sandboxes/"+sb.ID, nil, &got)
					if got.Status.State != "Failed" || got.Status.Reason != "SANDBOX_OOM_KILLED" || !strings.Contains(got.Status.Message, "OOM killer") {
						t.Fatalf("status %+v, want Failed, SANDBOX_OOM_KILLED", got.Status)
					}
					var ev diagResp
					srv.mustJSON(200, "GET", "/v1/sandboxes/"+sb.ID+"/diagnostics/events?scope=all", nil, &ev)
					if !strings.Contains(ev.Content, " runtime Exited SANDBOX_OOM_KILLED the sandbox agent was killed by the OOM killer") {
						t.Fatalf("events:\n%s", ev.Content)
					}
					// A new request is refused at once, with the reason.
					code, body, _ := srv.do("GET", "/v1/sandboxes/"+sb.ID+"/proxy/44772/ping", nil)
					if code != 409 || !strings.Contains(string(body), "SANDBOX::NOT_RUNNING") || !strings.Contains(string(body), "OOM killer") {
						t.Fatalf("proxy to the dead sandbox: %d %s", code, body)
					}
					logText, _ := os.ReadFile(srv.logf.Name())
					found := false
					for _, line := range strings.Split(string(logText), "\n") {
						if strings.Contains(line, "sandbox died") && strings.Contains(line, sb.ID) && strings.Contains(line, "OOMKilled") {
							found = true
						}
					}
					if !found {
						t.Fatalf("the server log has no line saying %s died of OOM", sb.ID)
					}
				})
			}
		})
	}
}
