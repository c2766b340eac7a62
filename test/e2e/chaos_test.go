package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/internal/testutil"
)

// Chaos knobs (environment): MOAT_CHAOS_SEED (default: the clock),
// MOAT_CHAOS_ROUNDS (default 5), MOAT_CHAOS_CREATES (creates per round,
// default 120), MOAT_CHAOS_CONCURRENCY (default 8), MOAT_CHAOS_HOG (CPU hog
// workers, stress-ng --cpu, run for the whole test; default 2, 0 for none),
// MOAT_CHAOS_KEEP_LOG (a directory to copy the server log to).
func envInt(t *testing.T, name string, def int) int {
	return envIntMin(t, name, def, 1)
}

func envIntMin(t *testing.T, name string, def, min int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < min {
		t.Fatalf("%s=%q: want an integer of at least %d", name, v, min)
	}
	return n
}

// startHog runs n stress-ng CPU workers until the test ends: the crash
// guarantees must hold on a loaded machine, not only a quiet one.
func startHog(t *testing.T, srv *server, n int) {
	t.Helper()
	if n == 0 {
		return
	}
	cmd := exec.Command(testutil.RequireBinary(t, "stress-ng"), "--cpu", strconv.Itoa(n), "--quiet")
	cmd.Env = append(os.Environ(), srv.net.Env())
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// stress-ng's workers are its children: SIGTERM lets it stop them.
		cmd.Process.Signal(syscall.SIGTERM)
		cmd.Wait()
	})
}

// loadAvg is the 1-minute load average.
func loadAvg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return "?"
	}
	return f[0]
}

// chaosClient is a non-fatal API client: transport errors are expected
// while the server is being killed.
type chaosClient struct {
	base, key string
	hc        *http.Client
}

func (c *chaosClient) do(method, path string, body any) (int, []byte, error) {
	var r io.Reader
	if body != nil {
		j, _ := json.Marshal(body)
		r = bytes.NewReader(j)
	}
	req, _ := http.NewRequest(method, c.base+path, r)
	req.Header.Set("OPEN-SANDBOX-API-KEY", c.key)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, nil, err
	}
	return resp.StatusCode, b, nil
}

// chaosBook is what the client knows about every sandbox it touched.
type chaosBook struct {
	mu sync.Mutex
	// alive: create answered 202, no delete attempted (value: expiry or zero).
	alive map[string]time.Time
	// deleted: delete answered 204 (or 404 after an uncertain delete).
	deleted map[string]bool
	// uncertain: a delete whose answer was lost (server killed).
	uncertain map[string]bool
	// createdAt: when each create's 202 arrived.
	createdAt map[string]time.Time
	// interrupted counts creates whose answer was lost.
	interrupted int
	// errors are unexpected API answers (not transport errors).
	errors []string
}

func (b *chaosBook) pickAlive(rng *rand.Rand) (string, time.Time, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.alive) == 0 {
		return "", time.Time{}, false
	}
	i, n := rng.IntN(len(b.alive)), 0
	for id, exp := range b.alive {
		if n == i {
			delete(b.alive, id) // the deleter owns it now
			return id, exp, true
		}
		n++
	}
	return "", time.Time{}, false
}

func (b *chaosBook) aliveCount() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.alive)
}

func (b *chaosBook) errorf(format string, args ...any) {
	b.mu.Lock()
	b.errors = append(b.errors, fmt.Sprintf(format, args...))
	b.mu.Unlock()
}

// TestChaosKillDuringChurn churns sandboxes with concurrent creates and
// deletes, SIGKILLs the server at a random moment of each round, restarts
// it, and checks that no sandbox is lost or resurrected, and (at the end)
// that nothing leaks.
func TestChaosKillDuringChurn(t *testing.T) {
	srv := newServer(t)
	ref := startRegistry(t)
	seed := uint64(time.Now().UnixNano())
	if v := os.Getenv("MOAT_CHAOS_SEED"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("MOAT_CHAOS_SEED=%q", v)
		}
		seed = n
	}
	rounds := envInt(t, "MOAT_CHAOS_ROUNDS", 5)
	perRound := envInt(t, "MOAT_CHAOS_CREATES", 120)
	conc := envInt(t, "MOAT_CHAOS_CONCURRENCY", 8)
	hog := envIntMin(t, "MOAT_CHAOS_HOG", 2, 0)
	startHog(t, srv, hog)
	t.Logf("chaos seed %d (rerun with MOAT_CHAOS_SEED=%d), %d rounds x %d creates, concurrency %d, %d CPU hog workers, load %s",
		seed, seed, rounds, perRound, conc, hog, loadAvg())
	rng := rand.New(rand.NewPCG(seed, 0x6d6f6174))

	t.Cleanup(func() {
		// Runs before newServer's cleanup, whose requests fail fatally if
		// the server is down: show why first.
		b, _ := os.ReadFile(srv.logf.Name())
		if dir := os.Getenv("MOAT_CHAOS_KEEP_LOG"); dir != "" {
			p := filepath.Join(dir, fmt.Sprintf("chaos-server-%d.log", seed))
			os.WriteFile(p, b, 0o600)
			t.Logf("server log kept in %s", p)
		}
		if !t.Failed() {
			return
		}
		var notable []string
		for _, l := range strings.Split(string(b), "\n") {
			if !strings.Contains(l, "level=DEBUG") && !strings.Contains(l, "level=INFO") {
				notable = append(notable, l)
			}
		}
		t.Logf("server log, non-info lines:\n%s", tail(strings.Join(notable, "\n"), 8000))
	})
	srv.start()
	c := &chaosClient{base: "http://" + srv.addr, key: srv.key, hc: &http.Client{Timeout: 90 * time.Second}}
	book := &chaosBook{alive: map[string]time.Time{}, deleted: map[string]bool{}, uncertain: map[string]bool{}, createdAt: map[string]time.Time{}}
	everSeen := map[string]bool{} // every sandbox ID seen anywhere, for the leak check
	totalCreates := 0

	for round := range rounds {
		// Kill after a random share of the round's creates (20%..90%), so
		// the kill lands during churn, not after it.
		killAfter := perRound/5 + rng.IntN(perRound*7/10+1)
		var (
			mu      sync.Mutex
			started int
			killed  = make(chan struct{})
			once    sync.Once
			killAt  time.Time // when the kill was sent (read after the round)
		)
		kill := func() {
			once.Do(func() {
				mu.Lock()
				killAt = time.Now()
				mu.Unlock()
				close(killed)
				srv.kill9()
			})
		}
		seeds := make([]uint64, conc)
		for i := range seeds {
			seeds[i] = rng.Uint64()
		}
		var wg sync.WaitGroup
		for w := range conc {
			wg.Add(1)
			go func() {
				defer wg.Done()
				wr := rand.New(rand.NewPCG(seeds[w], uint64(w)))
				for {
					select {
					case <-killed:
						return
					default:
					}
					// 60% create, 40% delete (if there is anything to delete).
					if wr.IntN(10) < 6 || book.aliveCount() == 0 {
						mu.Lock()
						if started >= perRound {
							mu.Unlock()
							return
						}
						started++
						if started == killAfter {
							// Kill while this and other requests are in flight.
							go func() {
								time.Sleep(time.Duration(wr.IntN(300)) * time.Millisecond)
								kill()
							}()
						}
						mu.Unlock()
						body := map[string]any{"image": map[string]any{"uri": ref}, "entrypoint": []string{"tail", "-f", "/dev/null"},
							"metadata": map[string]string{"chaos": "yes"}}
						var exp time.Time
						if wr.IntN(10) == 0 {
							body["timeout"] = 60
						}
						code, out, err := c.do("POST", "/v1/sandboxes", body)
						if err != nil {
							book.mu.Lock()
							book.interrupted++
							book.mu.Unlock()
							return
						}
						if code != 202 {
							book.errorf("create: %d %s", code, out)
							continue
						}
						var sb sandboxResp
						json.Unmarshal(out, &sb)
						if sb.ExpiresAt != "" {
							exp, _ = time.Parse(time.RFC3339Nano, sb.ExpiresAt)
						}
						if sb.Status.State != "Running" || sb.ID == "" {
							book.errorf("create returned %s", out)
							continue
						}
						book.mu.Lock()
						book.alive[sb.ID] = exp
						book.createdAt[sb.ID] = time.Now()
						book.mu.Unlock()
					} else {
						id, exp, ok := book.pickAlive(wr)
						if !ok {
							continue
						}
						code, out, err := c.do("DELETE", "/v1/sandboxes/"+id, nil)
						book.mu.Lock()
						switch {
						case err != nil:
							book.uncertain[id] = true
						case code == 204:
							book.deleted[id] = true
						case code == 404 && !exp.IsZero() && time.Now().After(exp.Add(-5*time.Second)):
							// Expired (timeout 60) and reaped first: fine.
							book.deleted[id] = true
						default:
							book.errors = append(book.errors, fmt.Sprintf("delete %s: %d %s", id, code, out))
							book.uncertain[id] = true
						}
						book.mu.Unlock()
						if err != nil {
							return
						}
					}
				}
			}()
		}
		wg.Wait()
		kill() // in case the round ended first
		totalCreates += started
		// What the crash left on disk, for the leak check.
		if ents, err := os.ReadDir(filepath.Join(srv.root, "oci", "sandboxes")); err == nil {
			for _, e := range ents {
				everSeen[e.Name()] = true
			}
		}
		srv.start()

		// Verify: compare the server's view with the client's.
		var list struct {
			Items []sandboxResp `json:"items"`
		}
		srv.mustJSON(200, "GET", "/v1/sandboxes?pageSize=1000", nil, &list)
		onServer := map[string]sandboxResp{}
		for _, sb := range list.Items {
			onServer[sb.ID] = sb
			everSeen[sb.ID] = true
		}
		book.mu.Lock()
		now := time.Now()
		for id, exp := range book.alive {
			everSeen[id] = true
			sb, ok := onServer[id]
			expired := !exp.IsZero() && now.After(exp.Add(-5*time.Second))
			switch {
			case !ok && expired:
				delete(book.alive, id) // legitimately expired
			case !ok:
				t.Errorf("round %d: sandbox %s was created (202) and never deleted, but is gone after the restart", round, id)
			case sb.Status.State != "Running":
				logSandboxFiles(t, srv, id)
				t.Errorf("round %d: sandbox %s created %s before the kill is %s (%s: %s) after the restart, want Running", round, id,
					killAt.Sub(book.createdAt[id]).Round(time.Millisecond), sb.Status.State, sb.Status.Reason, sb.Status.Message)
			}
		}
		for id := range book.deleted {
			everSeen[id] = true
			if _, ok := onServer[id]; ok {
				t.Errorf("round %d: sandbox %s was deleted (204) but is back after the restart", round, id)
			}
		}
		// An interrupted delete may or may not have happened; finish it.
		for id := range book.uncertain {
			everSeen[id] = true
			if sb, ok := onServer[id]; ok && sb.Status.State != "Running" && sb.Status.State != "Failed" {
				t.Errorf("round %d: half-deleted sandbox %s is %s", round, id, sb.Status.State)
			}
			code, body, _ := srv.do("DELETE", "/v1/sandboxes/"+id, nil)
			if code != 204 && code != 404 {
				t.Errorf("round %d: re-delete of %s: %d %s", round, id, code, body)
			}
			book.deleted[id] = true
			delete(book.uncertain, id)
		}
		// Sandboxes the client never heard of: interrupted creates that
		// completed. At most one per interrupted create, and whole.
		extra := 0
		for id, sb := range onServer {
			if _, known := book.alive[id]; known || book.deleted[id] {
				continue
			}
			extra++
			if sb.Status.State != "Running" {
				t.Errorf("round %d: unknown sandbox %s is %s (%s)", round, id, sb.Status.State, sb.Status.Message)
			}
			book.alive[id] = time.Time{}
		}
		if extra > book.interrupted {
			t.Errorf("round %d: %d sandboxes nobody created (only %d creates were interrupted)", round, extra, book.interrupted)
		}
		book.interrupted = 0
		for _, e := range book.errors {
			t.Errorf("round %d: %s", round, e)
		}
		book.errors = nil
		nAlive := len(book.alive)
		aliveIDs := make([]string, 0, nAlive)
		for id := range book.alive {
			aliveIDs = append(aliveIDs, id)
		}
		// Re-adopted sandboxes must work, not just be listed: run a
		// command in a few of them.
		var sample []string
		for id := range book.alive {
			if len(sample) == 3 {
				break
			}
			sample = append(sample, id)
		}
		book.mu.Unlock()
		// No address may be handed out twice across a crash (IPAM).
		byAddr := map[string]string{}
		for _, id := range aliveIDs {
			var ep endpointResp
			if code, body, _ := srv.do("GET", "/v1/sandboxes/"+id+"/endpoints/44772", nil); code == 200 {
				json.Unmarshal(body, &ep)
				if other, dup := byAddr[ep.Endpoint]; dup {
					t.Errorf("round %d: sandboxes %s and %s share the address %s", round, other, id, ep.Endpoint)
				}
				byAddr[ep.Endpoint] = id
			}
		}
		for _, id := range sample {
			var ep endpointResp
			srv.mustJSON(200, "GET", "/v1/sandboxes/"+id+"/endpoints/44772", nil, &ep)
			if out := stdoutOf(runCommand(t, "http://"+ep.Endpoint, ep.Headers, "echo alive")); out != "alive" {
				t.Errorf("round %d: re-adopted sandbox %s answered %q", round, id, out)
			}
		}
		t.Logf("round %d: %d creates started, killed after #%d; %d alive, %d deleted so far", round, started, killAfter, nAlive, len(book.deleted))
		if t.Failed() {
			break
		}
	}

	// Delete everything and check that nothing leaked.
	book.mu.Lock()
	ids := make([]string, 0, len(book.alive))
	for id := range book.alive {
		ids = append(ids, id)
	}
	book.mu.Unlock()
	for _, id := range ids {
		if code, body, _ := srv.do("DELETE", "/v1/sandboxes/"+id, nil); code != 204 && code != 404 {
			t.Errorf("final delete %s: %d %s", id, code, body)
		}
	}
	var list struct {
		Items []sandboxResp `json:"items"`
	}
	srv.mustJSON(200, "GET", "/v1/sandboxes?pageSize=1000", nil, &list)
	for _, sb := range list.Items {
		t.Errorf("left after deleting all: %s %s", sb.ID, sb.Status.State)
		srv.do("DELETE", "/v1/sandboxes/"+sb.ID, nil)
	}
	t.Logf("%d creates in total, %d sandbox IDs checked for leaks, load %s", totalCreates, len(everSeen), loadAvg())
	for id := range everSeen {
		assertNoLeaks(t, srv, id)
	}
	assertServerClean(t, srv)
}

// assertServerClean checks the per-server state that any sandbox, even
// one whose ID the client never learnt, would leave: sandbox dirs, IPAM
// records, attachments, netns files, runtime state dirs, bridge ports,
// mounts under the server's roots.
func assertServerClean(t *testing.T, srv *server) {
	t.Helper()
	for _, dir := range []string{
		filepath.Join(srv.root, "oci", "sandboxes"),
		filepath.Join(srv.root, "oci", "network", "ips"),
		filepath.Join(srv.root, "oci", "network", "attachments"),
		filepath.Join(srv.runRoot, "netns"),
		filepath.Join(srv.runRoot, "runc"),
		filepath.Join(srv.runRoot, "crun"),
	} {
		ents, err := os.ReadDir(dir)
		if err != nil && !os.IsNotExist(err) {
			t.Errorf("read %s: %v", dir, err)
		}
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		if len(names) > 0 {
			t.Errorf("%s not empty: %v", dir, names)
		}
	}
	if ports := sandboxPorts(t, srv); len(ports) != 0 {
		t.Errorf("bridge %s still has sandbox ports: %v", srv.bridge, ports)
	}
	mi, _ := os.ReadFile("/proc/self/mountinfo")
	for _, line := range strings.Split(string(mi), "\n") {
		f := strings.Fields(line)
		if len(f) < 5 {
			continue
		}
		mp := f[4]
		if strings.HasPrefix(mp, srv.root+"/") || (strings.HasPrefix(mp, srv.runRoot+"/") && !strings.HasPrefix(mp, filepath.Join(srv.runRoot, "bin")+"/")) {
			t.Errorf("mount left under the server roots: %s", mp)
		}
	}
}

// logSandboxFiles logs what the oci backend kept of sandbox id (its
// console log, record and exit file), which the test's temporary server
// root takes away when the test ends.
func logSandboxFiles(t *testing.T, srv *server, id string) {
	t.Helper()
	// The events say which server marked it, and when.
	if code, body, _ := srv.do("GET", "/v1/sandboxes/"+id+"/diagnostics/events?scope=all", nil); code == 200 {
		t.Logf("sandbox %s events: %s", id, body)
	}
	dir := filepath.Join(srv.root, "oci", "sandboxes", id)
	for _, name := range []string{"agent.log", "state.json", "exit", "pid"} {
		data, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Logf("sandbox %s %s: %v", id, name, err)
			continue
		}
		t.Logf("sandbox %s %s:\n%s", id, name, data)
	}
}
