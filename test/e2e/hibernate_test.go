package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestHibernateAndWake: a sandbox whose idle policy hibernates is Paused
// (SANDBOX_IDLE_HIBERNATED, event Hibernated) with no process left in its
// cgroup once nothing reaches it; eight commands at once through the
// server proxy wake it with one restore and all run, with its files; on
// gVisor a loop started before continues from its in-memory count, on
// runc and crun it does not (the processes start afresh). It stays
// hibernated across a server restart and wakes after it, on every
// native class.
func TestHibernateAndWake(t *testing.T) {
	srv := newServer(t)
	ref := startRegistry(t)
	srv.start()
	classes := []string{"runc", "crun"}
	if _, err := exec.LookPath("runsc"); err == nil {
		classes = append(classes, "runsc")
	}
	for _, class := range classes {
		t.Run(class, func(t *testing.T) { hibernateRoundTrip(t, srv, ref, class) })
	}
}

func hibernateRoundTrip(t *testing.T, srv *server, ref, class string) {
	var sb sandboxResp
	srv.mustJSON(202, "POST", "/v1/sandboxes", map[string]any{
		"image":      map[string]any{"uri": ref},
		"entrypoint": []string{"tail", "-f", "/dev/null"},
		"timeout":    600,
		"extensions": map[string]string{"moat.runtime": class, "moat.idle.timeout": "4", "moat.idle.action": "hibernate"},
	}, &sb)
	id := sb.ID
	proxy := "http://" + srv.addr + "/sandboxes/" + id + "/proxy/44772"
	hdr := map[string]string{"X-EXECD-ACCESS-TOKEN": srv.key}
	run := func(cmd string) string {
		t.Helper()
		evs := runCommand(t, proxy, hdr, cmd)
		assertCompleted(t, evs)
		return stdoutOf(evs)
	}
	counter := func() int {
		t.Helper()
		out := run("cat /tmp/counter")
		n, err := strconv.Atoi(out)
		if err != nil {
			t.Fatalf("counter: %q", out)
		}
		return n
	}
	// The loop's count lives in the shell's memory; the file only shows it.
	if out := run("mkdir -p /work && echo kept-" + id + " > /work/state.txt && " +
		"(i=0; while :; do i=$((i+1)); echo $i > /tmp/counter; sleep 0.1; done) </dev/null >/dev/null 2>&1 & echo started"); out != "started" {
		t.Fatalf("start loop: %q", out)
	}
	time.Sleep(500 * time.Millisecond)
	waitIdleState(t, srv, id, "Paused")
	var got sandboxResp
	srv.mustJSON(200, "GET", "/v1/sandboxes/"+id, nil, &got)
	if got.Status.Reason != "SANDBOX_IDLE_HIBERNATED" || !strings.Contains(got.Status.Message, "MiB freed") {
		t.Fatalf("hibernated status: %+v", got.Status)
	}
	if ev := lifecycleEvents(t, srv, id); !strings.Contains(ev, " Hibernated SANDBOX_IDLE_HIBERNATED no activity for ") {
		t.Fatalf("no Hibernated event:\n%s", ev)
	}
	if procs := cgroupProcs(id); procs != "" {
		t.Fatalf("processes left in the cgroup of a hibernated sandbox: %s", procs)
	}

	wakeAll := func() {
		t.Helper()
		var wg sync.WaitGroup
		outs := make([]string, 8)
		for i := range outs {
			wg.Go(func() {
				evs := runCommand(t, proxy, hdr, "cat /work/state.txt")
				if len(evs) > 0 && evs[len(evs)-1].Type == "execution_complete" {
					outs[i] = stdoutOf(evs)
				}
			})
		}
		wg.Wait()
		for i, out := range outs {
			if out != "kept-"+id {
				t.Fatalf("request %d after the wake: %q", i, out)
			}
		}
	}
	wakeAll()
	srv.mustJSON(200, "GET", "/v1/sandboxes/"+id, nil, &got)
	if got.Status.State != "Running" {
		t.Fatalf("after the wake: %+v", got.Status)
	}
	if n := strings.Count(lifecycleEvents(t, srv, id), " Woken SANDBOX_WAKING "); n != 1 {
		t.Fatalf("%d wakes for 8 requests at once, want 1", n)
	}
	a := counter()
	time.Sleep(time.Second)
	b := counter()
	if class == "runsc" {
		if b <= a {
			t.Fatalf("the loop does not continue after the wake: %d then %d", a, b)
		}
	} else if a != b {
		t.Fatalf("a loop runs after the wake of a restarted sandbox: %d then %d", a, b)
	}

	// Hibernated again, it stays so across a server restart and wakes
	// after it.
	waitIdleState(t, srv, id, "Paused")
	srv.stop()
	srv.start()
	srv.mustJSON(200, "GET", "/v1/sandboxes/"+id, nil, &got)
	if got.Status.State != "Paused" || got.Status.Reason != "SANDBOX_IDLE_HIBERNATED" {
		t.Fatalf("after a restart: %+v", got.Status)
	}
	if out := run("cat /work/state.txt"); out != "kept-"+id {
		t.Fatalf("after a restart and a wake: %q", out)
	}
	if code, body, _ := srv.do("DELETE", "/v1/sandboxes/"+id, nil); code != 204 {
		t.Fatalf("delete: %d %s", code, body)
	}
	assertNoLeaks(t, srv, id)
}

// TestHibernateAPI: pause?mode=hibernate hibernates a sandbox without an
// idle policy (SANDBOX_HIBERNATED) and resume wakes it with its files; a
// bad mode is 400; a hibernated sandbox's delete leaves nothing behind.
func TestHibernateAPI(t *testing.T) {
	srv := newServer(t)
	ref := startRegistry(t)
	srv.start()
	var sb sandboxResp
	srv.mustJSON(202, "POST", "/v1/sandboxes", map[string]any{
		"image":      map[string]any{"uri": ref},
		"entrypoint": []string{"tail", "-f", "/dev/null"},
		"timeout":    600,
	}, &sb)
	id := sb.ID
	if out, ok := shell(t, srv, id, "echo kept > /state.txt && echo ok"); !ok || out != "ok" {
		t.Fatalf("write: %v %q", ok, out)
	}
	if code, body, _ := srv.do("POST", "/v1/sandboxes/"+id+"/pause?mode=nap", nil); code != 400 {
		t.Fatalf("bad mode: %d %s", code, body)
	}
	srv.mustJSON(202, "POST", "/v1/sandboxes/"+id+"/pause?mode=hibernate", nil, nil)
	var got sandboxResp
	srv.mustJSON(200, "GET", "/v1/sandboxes/"+id, nil, &got)
	if got.Status.State != "Paused" || got.Status.Reason != "SANDBOX_HIBERNATED" {
		t.Fatalf("hibernated: %+v", got.Status)
	}
	if procs := cgroupProcs(id); procs != "" {
		t.Fatalf("processes left: %s", procs)
	}
	srv.mustJSON(202, "POST", "/v1/sandboxes/"+id+"/resume", nil, nil)
	if out, ok := shell(t, srv, id, "cat /state.txt"); !ok || out != "kept" {
		t.Fatalf("after resume: %v %q", ok, out)
	}
	// A hibernated sandbox's delete frees everything too.
	srv.mustJSON(202, "POST", "/v1/sandboxes/"+id+"/pause?mode=hibernate", nil, nil)
	srv.mustJSON(204, "DELETE", "/v1/sandboxes/"+id, nil, nil)
	assertNoLeaks(t, srv, id)
}

// cgroupProcs lists the processes of every cgroup named id (any
// hierarchy, up to four levels down).
func cgroupProcs(id string) string {
	var out []string
	for _, pat := range []string{"/sys/fs/cgroup/*/", "/sys/fs/cgroup/*/*/", "/sys/fs/cgroup/*/*/*/", "/sys/fs/cgroup/*/*/*/*/"} {
		files, _ := filepath.Glob(pat + id + "/cgroup.procs")
		for _, f := range files {
			if data, err := os.ReadFile(f); err == nil && strings.TrimSpace(string(data)) != "" {
				out = append(out, f+": "+strings.Join(strings.Fields(string(data)), " "))
			}
		}
	}
	return strings.Join(out, "; ")
}

// TestHibernateKilledMidway: a server SIGKILLed while it checkpoints a
// gVisor sandbox for hibernation (its record says so) leaves it running
// or hibernated, never lost: after a restart it answers a command with
// its files and memory state, and its delete leaves nothing behind.
func TestHibernateKilledMidway(t *testing.T) {
	if _, err := exec.LookPath("runsc"); err != nil {
		t.Skip("needs runsc (make test puts a current one on PATH)")
	}
	srv := newServer(t)
	ref := startRegistry(t)
	srv.start("--runtime-class", "runsc")
	var sb sandboxResp
	srv.mustJSON(202, "POST", "/v1/sandboxes", map[string]any{
		"image":      map[string]any{"uri": ref},
		"entrypoint": []string{"tail", "-f", "/dev/null"},
		"timeout":    600,
		"extensions": map[string]string{"moat.idle.timeout": "2", "moat.idle.action": "hibernate"},
	}, &sb)
	id := sb.ID
	// Through the server proxy, so that a command under way is activity.
	run := func(cmd string) string {
		t.Helper()
		evs := runCommand(t, "http://"+srv.addr+"/sandboxes/"+id+"/proxy/44772", map[string]string{"X-EXECD-ACCESS-TOKEN": srv.key}, cmd)
		assertCompleted(t, evs)
		return stdoutOf(evs)
	}
	// Memory to write makes the checkpoint last long enough to be caught.
	if out := run("echo kept > /state.txt && dd if=/dev/urandom of=/dev/shm/fill bs=1M count=48 2>/dev/null && md5sum < /dev/shm/fill"); len(out) < 32 {
		t.Fatalf("fill: %q", out)
	}
	sum := run("md5sum < /dev/shm/fill")
	deadline := time.Now().Add(60 * time.Second)
	for {
		recs, _ := filepath.Glob(filepath.Join(srv.root, "*", "sandboxes", id, "state.json"))
		more, _ := filepath.Glob(filepath.Join(srv.root, "sandboxes", id, "state.json"))
		saving := false
		for _, p := range append(recs, more...) {
			data, err := os.ReadFile(p)
			saving = saving || err == nil && strings.Contains(string(data), `"hibernated":"saving"`)
		}
		if saving {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the hibernate checkpoint was never seen under way")
		}
		time.Sleep(2 * time.Millisecond)
	}
	srv.kill9()
	srv.start("--runtime-class", "runsc")
	var got sandboxResp
	srv.mustJSON(200, "GET", "/v1/sandboxes/"+id, nil, &got)
	if got.Status.State != "Running" && got.Status.State != "Paused" {
		t.Fatalf("after a kill mid-hibernate and a restart: %+v", got.Status)
	}
	if out := run("cat /state.txt; md5sum < /dev/shm/fill"); out != "kept\n"+sum {
		t.Fatalf("after the restart (%s): %q, want kept and %s", got.Status.State, out, sum)
	}
	srv.mustJSON(204, "DELETE", "/v1/sandboxes/"+id, nil, nil)
	assertNoLeaks(t, srv, id)
}
