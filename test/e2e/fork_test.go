package e2e

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

type operationResp struct {
	ID, Kind, State, SourceID, SnapshotID string
	Count                                 int
	Children                              []struct{ ID, Hostname, MachineID string }
	Error                                 *struct{ Code, Message string }
}

// waitOperation polls operation id until it is no longer Running.
func (s *server) waitOperation(id string) operationResp {
	s.t.Helper()
	deadline := time.Now().Add(3 * time.Minute)
	for {
		var op operationResp
		s.mustJSON(200, "GET", "/v1/operations/"+id, nil, &op)
		if op.State != "Running" {
			return op
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("operation %s still Running", id)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// wantError checks a {code, message} error answer.
func wantError(t *testing.T, what string, code int, body []byte, wantStatus int, wantCode string) {
	t.Helper()
	var e struct{ Code, Message string }
	if code != wantStatus || json.Unmarshal(body, &e) != nil || e.Code != wantCode || e.Message == "" {
		t.Errorf("%s: %d %s, want %d %s", what, code, body, wantStatus, wantCode)
	}
}

// TestForkAPI forks a running sandbox into three children in one call:
// each sees the source's files but not its siblings' writes, has its own
// token, hostname and machine-id and the overrides; an idempotent retry
// (also after a restart) answers the same operation; bad input is
// refused; a server killed mid-fork leaves no half-made child.
func TestForkAPI(t *testing.T) {
	srv := newServer(t)
	ref := startRegistry(t)
	srv.start()

	var src sandboxResp
	srv.mustJSON(202, "POST", "/v1/sandboxes", map[string]any{
		"image": map[string]any{"uri": ref}, "entrypoint": []string{"tail", "-f", "/dev/null"},
		"timeout": 900, "env": map[string]string{"ROLE": "source"}, "metadata": map[string]string{"app": "e2e"},
	}, &src)
	if out, ok := shell(t, srv, src.ID, "mkdir -p /work && echo source-state > /work/state.txt && cat /etc/machine-id 2>/dev/null; hostname"); !ok {
		t.Fatalf("prepare source: %q", out)
	}
	srcIdentity, _ := shell(t, srv, src.ID, "cat /etc/machine-id 2>/dev/null; hostname")

	body := map[string]any{"count": 3, "metadata": map[string]string{"role": "child"},
		"children": []map[string]any{{"env": map[string]string{"ROLE": "first"}}}}
	key := []string{"Idempotency-Key", "e2e-fork-" + src.ID}
	code, raw, hdr := srv.do("POST", "/v1/sandboxes/"+src.ID+"/fork", body, key...)
	var op operationResp
	if code != 202 || json.Unmarshal(raw, &op) != nil || op.ID == "" || op.Kind != "fork" || op.SourceID != src.ID || op.Count != 3 {
		t.Fatalf("fork: %d %s", code, raw)
	}
	if hdr.Get("Location") != "/v1/operations/"+op.ID {
		t.Errorf("Location %q", hdr.Get("Location"))
	}
	// A retry with the same key answers the same operation, makes nothing.
	code, again, hdr := srv.do("POST", "/v1/sandboxes/"+src.ID+"/fork", body, key...)
	if code != 202 || string(again) != string(raw) || hdr.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry: %d %s %v", code, again, hdr)
	}
	// The same key with another body is refused.
	code, b, _ := srv.do("POST", "/v1/sandboxes/"+src.ID+"/fork", map[string]any{"count": 2}, key...)
	wantError(t, "reused key", code, b, 409, "SANDBOX::IDEMPOTENCY_KEY_REUSED")

	done := srv.waitOperation(op.ID)
	if done.State != "Succeeded" || len(done.Children) != 3 || done.SnapshotID == "" {
		t.Fatalf("operation: %+v", done)
	}
	// The source keeps running, its files unchanged.
	if out, _ := shell(t, srv, src.ID, "cat /work/state.txt"); out != "source-state" {
		t.Fatalf("source after fork: %q", out)
	}
	tokens := map[string]string{}
	_, h := srv.agent(src.ID)
	tokens[h["X-EXECD-ACCESS-TOKEN"]] = src.ID
	identities := map[string]string{srcIdentity: src.ID}
	for i, c := range done.Children {
		var sb sandboxResp
		srv.mustJSON(200, "GET", "/v1/sandboxes/"+c.ID, nil, &sb)
		if sb.Status.State != "Running" || sb.Metadata["app"] != "e2e" || sb.Metadata["role"] != "child" {
			t.Errorf("child %d: %+v", i, sb)
		}
		out, ok := shell(t, srv, c.ID, "cat /work/state.txt; echo $ROLE; cat /etc/machine-id; hostname")
		lines := strings.Split(out, "\n")
		wantRole := "source"
		if i == 0 {
			wantRole = "first"
		}
		if !ok || len(lines) != 4 || lines[0] != "source-state" || lines[1] != wantRole {
			t.Fatalf("child %d sees %q", i, out)
		}
		if lines[2] != c.MachineID || lines[3] != c.Hostname || len(c.MachineID) != 32 {
			t.Errorf("child %d: identity %q, operation says %+v", i, out, c)
		}
		id := strings.Join(lines[2:], "\n")
		if other, dup := identities[id]; dup {
			t.Errorf("child %s has the identity of %s: %q", c.ID, other, id)
		}
		for _, l := range lines[2:] {
			if strings.Contains(srcIdentity, l) {
				t.Errorf("child %s shares %q with the source", c.ID, l)
			}
		}
		identities[id] = c.ID
		_, h := srv.agent(c.ID)
		if other, dup := tokens[h["X-EXECD-ACCESS-TOKEN"]]; dup || h["X-EXECD-ACCESS-TOKEN"] == "" {
			t.Errorf("child %s has the agent token of %q", c.ID, other)
		}
		tokens[h["X-EXECD-ACCESS-TOKEN"]] = c.ID
	}
	// Children are independent: a write in one is seen nowhere else.
	first := done.Children[0].ID
	if _, ok := shell(t, srv, first, "echo mine > /work/state.txt && echo only-here > /work/new.txt"); !ok {
		t.Fatal("write in child")
	}
	for _, id := range []string{src.ID, done.Children[1].ID, done.Children[2].ID} {
		if out, _ := shell(t, srv, id, "cat /work/state.txt; test -e /work/new.txt && echo leaked"); out != "source-state" {
			t.Errorf("%s sees %q after a write in %s", id, out, first)
		}
	}

	// Bad input answers {code, message}.
	for _, tc := range []struct {
		what, path string
		body       any
		status     int
		code       string
	}{
		{"count 0", "/v1/sandboxes/" + src.ID + "/fork", map[string]any{"count": 0}, 400, "SANDBOX::INVALID_PARAMETER"},
		{"count 101", "/v1/sandboxes/" + src.ID + "/fork", map[string]any{"count": 101}, 400, "SANDBOX::INVALID_PARAMETER"},
		{"bad env", "/v1/sandboxes/" + src.ID + "/fork", map[string]any{"count": 1, "env": map[string]string{"A=B": "x"}}, 400, "SANDBOX::INVALID_PARAMETER"},
		{"unknown source", "/v1/sandboxes/nosuchsandbox/fork", map[string]any{"count": 1}, 404, "SANDBOX::NOT_FOUND"},
		{"unknown operation", "/v1/operations/nosuchop", nil, 404, "OPERATION::NOT_FOUND"},
	} {
		method := "POST"
		if tc.body == nil {
			method = "GET"
		}
		code, b, _ := srv.do(method, tc.path, tc.body)
		wantError(t, tc.what, code, b, tc.status, tc.code)
	}
	var paused sandboxResp
	srv.mustJSON(202, "POST", "/v1/sandboxes", map[string]any{"image": map[string]any{"uri": ref}, "entrypoint": []string{"tail", "-f", "/dev/null"}, "timeout": 600}, &paused)
	srv.mustJSON(202, "POST", "/v1/sandboxes/"+paused.ID+"/pause", nil, nil)
	code, b, _ = srv.do("POST", "/v1/sandboxes/"+paused.ID+"/fork", map[string]any{"count": 1})
	wantError(t, "paused source", code, b, 409, "SANDBOX::INVALID_STATE")

	// The CLI forks and waits: it prints the children's ids.
	r := mustCLI(t, srv, 0, "sandbox", "fork", src.ID, "--count", "2", "--metadata", "via=cli", "--wait")
	ids := strings.Fields(r.stdout)
	if len(ids) != 2 {
		t.Fatalf("moat sandbox fork: %q", r.stdout)
	}
	for _, id := range ids {
		var sb sandboxResp
		srv.mustJSON(200, "GET", "/v1/sandboxes/"+id, nil, &sb)
		if sb.Status.State != "Running" || sb.Metadata["via"] != "cli" {
			t.Errorf("CLI child %s: %+v", id, sb)
		}
		srv.mustJSON(204, "DELETE", "/v1/sandboxes/"+id, nil, nil)
	}

	// An idempotent create, then a restart: both retries answer the first.
	ckey := []string{"Idempotency-Key", "e2e-create-" + src.ID}
	create := map[string]any{"image": map[string]any{"uri": ref}, "entrypoint": []string{"tail", "-f", "/dev/null"}, "timeout": 600}
	code, created, _ := srv.do("POST", "/v1/sandboxes", create, ckey...)
	if code != 202 {
		t.Fatalf("idempotent create: %d %s", code, created)
	}
	srv.stop()
	srv.start()
	if code, b, _ := srv.do("POST", "/v1/sandboxes/"+src.ID+"/fork", body, key...); code != 202 || string(b) != string(raw) {
		t.Errorf("fork retry after a restart: %d %s", code, b)
	}
	if code, b, _ := srv.do("POST", "/v1/sandboxes", create, ckey...); code != 202 || string(b) != string(created) {
		t.Errorf("create retry after a restart: %d %s, first %s", code, b, created)
	}
	if got := srv.waitOperation(op.ID); got.State != "Succeeded" || len(got.Children) != 3 {
		t.Errorf("operation after a restart: %+v", got)
	}
	before := countSandboxes(srv)

	// A server killed mid-fork: after the restart the operation is
	// honest and no child is half-made (all or nothing).
	code, raw, _ = srv.do("POST", "/v1/sandboxes/"+src.ID+"/fork", map[string]any{"count": 6})
	var cut operationResp
	if code != 202 || json.Unmarshal(raw, &cut) != nil {
		t.Fatalf("fork to cut: %d %s", code, raw)
	}
	srv.kill9()
	srv.start()
	got := srv.waitOperation(cut.ID)
	t.Logf("the fork cut by the kill: %s %+v", got.State, got.Error)
	switch got.State {
	case "Failed":
		if got.Error == nil || got.Error.Code != "OPERATION::INTERRUPTED" || len(got.Children) != 0 {
			t.Errorf("interrupted fork: %+v", got)
		}
		if n := countSandboxes(srv); n != before {
			t.Errorf("%d sandboxes after an interrupted fork, %d before", n, before)
		}
	case "Succeeded":
		// It finished before the kill: all six are there.
		if n := countSandboxes(srv); n != before+6 || len(got.Children) != 6 {
			t.Errorf("fork done before the kill: %d sandboxes (%d before), %+v", n, before, got)
		}
	default:
		t.Errorf("after the kill: %+v", got)
	}
	var s sandboxResp
	srv.mustJSON(200, "GET", "/v1/sandboxes/"+src.ID, nil, &s)
	if s.Status.State != "Running" {
		t.Errorf("source after the kill: %+v", s.Status)
	}
}

// countSandboxes counts the live (not Failed or Terminated) sandboxes.
func countSandboxes(srv *server) int {
	srv.t.Helper()
	var list struct {
		Items []sandboxResp
	}
	srv.mustJSON(200, "GET", "/v1/sandboxes?pageSize=1000", nil, &list)
	n := 0
	for _, sb := range list.Items {
		if sb.Status.State != "Failed" && sb.Status.State != "Terminated" {
			n++
		}
	}
	return n
}

// TestForkMemory forks a running gVisor sandbox with its memory: the
// children continue the source's background process, and each has its
// own hostname, machine-id and token. It needs a runsc that can
// checkpoint (scripts/build-runsc.sh; `make test` puts it first on PATH).
func TestForkMemory(t *testing.T) {
	srv := newServer(t)
	ref := startRegistry(t)
	srv.start("--runtime-class", "runsc")
	var src sandboxResp
	srv.mustJSON(202, "POST", "/v1/sandboxes", map[string]any{
		"image": map[string]any{"uri": ref}, "entrypoint": []string{"sleep", "3600"}, "timeout": 600,
	}, &src)
	if out, ok := shell(t, srv, src.ID, "echo src > /tmp/state; (sleep 3333 </dev/null >/dev/null 2>&1 &); echo started"); !ok || out != "started" {
		t.Fatalf("start background process: %q", out)
	}
	srcIdentity, _ := shell(t, srv, src.ID, "cat /etc/machine-id 2>/dev/null; hostname")
	var op operationResp
	srv.mustJSON(202, "POST", "/v1/sandboxes/"+src.ID+"/fork", map[string]any{"count": 2, "env": map[string]string{"ROLE": "child"}}, &op)
	done := srv.waitOperation(op.ID)
	if done.State != "Succeeded" || len(done.Children) != 2 {
		t.Fatalf("operation: %+v", done)
	}
	seen := map[string]bool{srcIdentity: true}
	for _, c := range done.Children {
		out, ok := shell(t, srv, c.ID, "cat /tmp/state; ps -o args | grep -c '^sleep 3333'; echo $ROLE; cat /etc/machine-id; hostname")
		lines := strings.Split(out, "\n")
		if !ok || len(lines) != 5 || lines[0] != "src" || lines[1] != "1" || lines[2] != "child" {
			t.Fatalf("child %s: %q", c.ID, out)
		}
		id := strings.Join(lines[3:], "\n")
		if seen[id] || lines[3] != c.MachineID || lines[4] != c.Hostname || strings.Contains(srcIdentity, lines[4]) {
			t.Errorf("child %s identity %q (operation %+v, source %q)", c.ID, id, c, srcIdentity)
		}
		seen[id] = true
	}
	// A write in one child is seen nowhere else.
	shell(t, srv, done.Children[0].ID, "echo mine > /tmp/state")
	for _, id := range []string{src.ID, done.Children[1].ID} {
		if out, _ := shell(t, srv, id, "cat /tmp/state"); out != "src" {
			t.Errorf("%s sees %q", id, out)
		}
	}
}

// TestForkCredentialVault: a fork's children have their own Credential
// Vault, empty unless the fork asks for a copy of the source's.
func TestForkCredentialVault(t *testing.T) {
	srv := newServer(t)
	ref := startRegistry(t)
	env := newVaultEnv(t, srv)
	srv.start(env.flags...)
	v := newVaultSandbox(t, t, srv, ref, "runc", env.probe)
	v.mustVault(201, "POST", "/credential-vault", vaultCreate)
	srcView := v.mustVault(200, "GET", "/credential-vault", "")

	child := func(body map[string]any) *vaultSandbox {
		t.Helper()
		var op operationResp
		srv.mustJSON(202, "POST", "/v1/sandboxes/"+v.id+"/fork", body, &op)
		done := srv.waitOperation(op.ID)
		if done.State != "Succeeded" || len(done.Children) != 1 {
			t.Fatalf("fork %v: %+v", body, done)
		}
		c := &vaultSandbox{t: t, srv: srv, id: done.Children[0].ID}
		var ep endpointResp
		srv.mustJSON(200, "GET", "/v1/sandboxes/"+c.id+"/endpoints/18080", nil, &ep)
		c.egress, c.tok = "http://"+ep.Endpoint, ep.Headers["OPENSANDBOX-EGRESS-AUTH"]
		if c.tok == "" || c.tok == v.tok {
			t.Fatalf("child egress token %q (source %q)", c.tok, v.tok)
		}
		return c
	}
	plain := child(map[string]any{"count": 1})
	plain.mustVault(404, "GET", "/credential-vault", "")
	copied := child(map[string]any{"count": 1, "copyCredentialVault": true})
	got := copied.mustVault(200, "GET", "/credential-vault", "")
	for _, name := range []string{`"bearer"`, `"api-v1"`, `"basic"`} {
		if !strings.Contains(got, name) || !strings.Contains(srcView, name) {
			t.Errorf("copied vault lacks %s: %s", name, got)
		}
	}
	// The copy is the child's own: deleting it leaves the source's.
	copied.mustVault(204, "DELETE", "/credential-vault", "")
	v.mustVault(200, "GET", "/credential-vault", "")
	// A source without a credential proxy cannot copy one.
	var bare sandboxResp
	srv.mustJSON(202, "POST", "/v1/sandboxes", map[string]any{"image": map[string]any{"uri": ref}, "entrypoint": []string{"tail", "-f", "/dev/null"}, "timeout": 600}, &bare)
	code, b, _ := srv.do("POST", "/v1/sandboxes/"+bare.ID+"/fork", map[string]any{"count": 1, "copyCredentialVault": true})
	wantError(t, "copy without a vault", code, b, 400, "SANDBOX::INVALID_PARAMETER")
}
