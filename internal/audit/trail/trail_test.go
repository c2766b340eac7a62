package trail

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func newStore(t *testing.T, opt Options) (*Store, *clock) {
	t.Helper()
	c := &clock{t: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
	if opt.Dir == "" {
		opt.Dir = filepath.Join(t.TempDir(), "audit")
	}
	opt.Now = c.now
	s, err := Open(opt)
	if err != nil {
		t.Fatal(err)
	}
	return s, c
}

func TestAppendReadPageFilter(t *testing.T) {
	s, c := newStore(t, Options{})
	for i := range 25 {
		k := KindCommand
		if i%5 == 0 {
			k = KindLifecycle
		}
		if err := s.Append(Record{Kind: k, Action: "run", SandboxID: "sb1", Tenant: "acme"}); err != nil {
			t.Fatal(err)
		}
		c.add(time.Second)
	}
	s.Append(Record{Kind: KindFile, Action: "write", SandboxID: "other"})
	var all []Record
	after := uint64(0)
	for pages := 0; ; pages++ {
		recs, next, err := s.Read("sb1", Query{Limit: 10, After: after})
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, recs...)
		if next == 0 {
			if pages != 2 {
				t.Fatalf("%d pages of 10 for 25 records", pages+1)
			}
			break
		}
		after = next
	}
	if len(all) != 25 {
		t.Fatalf("read %d records, want 25", len(all))
	}
	for i, r := range all {
		if r.Seq != uint64(i+1) || r.SandboxID != "sb1" {
			t.Fatalf("record %d: %+v", i, r)
		}
	}
	life, next, _ := s.Read("sb1", Query{Kinds: []Kind{KindLifecycle}})
	if len(life) != 5 || next != 0 {
		t.Fatalf("lifecycle filter: %d records, next %d", len(life), next)
	}
	since := all[10].Time
	recs, _, _ := s.Read("sb1", Query{Since: since, Until: since.Add(3 * time.Second)})
	if len(recs) != 3 || recs[0].Seq != 11 {
		t.Fatalf("time filter: %+v", recs)
	}
	if recs, _, _ := s.Read("nope", Query{}); len(recs) != 0 {
		t.Fatalf("unknown sandbox: %+v", recs)
	}
	if owner, ok := s.Owner("sb1"); !ok || owner != "acme" {
		t.Fatalf("owner %q %v", owner, ok)
	}
	// Ids that could name another path are refused.
	for _, id := range []string{"", "../x", "a/b", strings.Repeat("x", 200)} {
		if err := s.Append(Record{Kind: KindFile, SandboxID: id}); err == nil {
			t.Fatalf("id %q accepted", id)
		}
	}
}

func TestReopenContinuesSequence(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "a")
	s, _ := newStore(t, Options{Dir: dir})
	s.Append(Record{Kind: KindLifecycle, Action: "create", SandboxID: "sb", Tenant: "t1"})
	s.Append(Record{Kind: KindLifecycle, Action: "pause", SandboxID: "sb"})
	s2, _ := newStore(t, Options{Dir: dir})
	s2.Append(Record{Kind: KindLifecycle, Action: "resume", SandboxID: "sb"})
	recs, _, _ := s2.Read("sb", Query{})
	if len(recs) != 3 || recs[2].Seq != 3 || recs[2].Tenant != "t1" {
		t.Fatalf("after reopen: %+v", recs)
	}
	if s2.Size() <= s.Size() {
		t.Fatal("size not loaded")
	}
}

func TestPerSandboxBound(t *testing.T) {
	s, _ := newStore(t, Options{PerSandbox: 4 << 10})
	for i := range 200 {
		s.Append(Record{Kind: KindCommand, Action: "run", SandboxID: "sb", Command: &Command{Line: fmt.Sprintf("echo %d", i)}})
	}
	if s.Size() > 4<<10 {
		t.Fatalf("trail holds %d bytes, bound 4096", s.Size())
	}
	recs, _, _ := s.Read("sb", Query{Limit: 1000})
	if len(recs) == 0 || recs[len(recs)-1].Seq != 200 || recs[0].Seq == 1 {
		t.Fatalf("kept seq %d..%d of 200: the newest must stay, the oldest go", recs[0].Seq, recs[len(recs)-1].Seq)
	}
	for i := 1; i < len(recs); i++ {
		if recs[i].Seq != recs[i-1].Seq+1 {
			t.Fatalf("gap in the kept records at %d", recs[i].Seq)
		}
	}
}

func TestTotalBoundEvictsDeletedFirst(t *testing.T) {
	live := map[string]bool{"live": true}
	var mu sync.Mutex
	s, c := newStore(t, Options{PerSandbox: 4 << 10, Total: 8 << 10, Exists: func(id string) bool {
		mu.Lock()
		defer mu.Unlock()
		return live[id]
	}})
	rec := func(id string) Record {
		return Record{Kind: KindCommand, Action: "run", SandboxID: id, Command: &Command{Line: strings.Repeat("x", 100)}}
	}
	for range 15 {
		s.Append(rec("gone-old"))
	}
	c.add(time.Minute)
	for range 15 {
		s.Append(rec("live"))
	}
	c.add(time.Minute)
	for range 30 {
		s.Append(rec("gone-new"))
	}
	if s.Size() > 8<<10 {
		t.Fatalf("total %d over the bound", s.Size())
	}
	if _, ok := s.Owner("gone-old"); ok {
		t.Fatal("the oldest deleted sandbox's trail was kept over the bound")
	}
	if recs, _, _ := s.Read("live", Query{}); len(recs) == 0 {
		t.Fatal("a live sandbox's trail was evicted before deleted ones")
	}
}

func TestExpireOnlyDeleted(t *testing.T) {
	live := map[string]bool{"live": true}
	s, c := newStore(t, Options{Retention: time.Hour, Exists: func(id string) bool { return live[id] }})
	s.Append(Record{Kind: KindLifecycle, Action: "create", SandboxID: "live"})
	s.Append(Record{Kind: KindLifecycle, Action: "delete", SandboxID: "gone"})
	c.add(30 * time.Minute)
	if n := s.Expire(); n != 0 {
		t.Fatalf("expired %d within the retention", n)
	}
	c.add(31 * time.Minute)
	if n := s.Expire(); n != 1 {
		t.Fatalf("expired %d, want the deleted sandbox's only", n)
	}
	if _, ok := s.Owner("gone"); ok {
		t.Fatal("expired trail still known")
	}
	if recs, _, _ := s.Read("live", Query{}); len(recs) != 1 {
		t.Fatal("a live sandbox's trail expired")
	}
	if _, err := os.Stat(filepath.Join(s.opt.Dir, "gone.log")); !os.IsNotExist(err) {
		t.Fatalf("expired trail's file: %v", err)
	}
}

func TestNoteAggregates(t *testing.T) {
	s, c := newStore(t, Options{})
	deny := func(host string) {
		s.Note(Record{Kind: KindEgress, Action: ActionDeny, SandboxID: "sb", Egress: &Egress{Host: host, Rule: "default", Layer: "dns"}}, host)
	}
	for range 1000 {
		deny("a.example")
	}
	deny("b.example")
	recs, _, _ := s.Read("sb", Query{})
	if len(recs) != 2 {
		t.Fatalf("1001 denials wrote %d records within the window, want 2 (one per host)", len(recs))
	}
	c.add(AggregateWindow)
	s.Flush()
	recs, _, _ = s.Read("sb", Query{})
	if len(recs) != 3 || recs[2].Count != 999 || recs[2].Egress.Host != "a.example" {
		t.Fatalf("after the window: %+v", recs)
	}
	// Distinct keys per sandbox are bounded.
	for i := range MaxAggregateKeys + 50 {
		deny(fmt.Sprintf("h%d.example", i))
	}
	if s.Dropped() == 0 {
		t.Fatal("no events dropped past MaxAggregateKeys")
	}
	recs, _, _ = s.Read("sb", Query{Limit: 1000})
	if len(recs) > 3+MaxAggregateKeys {
		t.Fatalf("%d records: more keys than the bound went through", len(recs))
	}
}

func TestActiveLinksTrace(t *testing.T) {
	s, _ := newStore(t, Options{})
	release := s.Active("sb", "trace-1", "span-1")
	s.Note(Record{Kind: KindCredential, Action: ActionInject, SandboxID: "sb", Credential: &Credential{Binding: "gh", Host: "api.example", Injected: true}}, "gh")
	release()
	s.Note(Record{Kind: KindCredential, Action: ActionInject, SandboxID: "sb", Credential: &Credential{Binding: "gh2", Host: "api.example", Injected: true}}, "gh2")
	recs, _, _ := s.Read("sb", Query{})
	if len(recs) != 2 || recs[0].TraceID != "trace-1" || recs[0].SpanID != "span-1" || recs[1].TraceID != "" {
		t.Fatalf("trace links: %+v", recs)
	}
}

func TestParseKind(t *testing.T) {
	for _, k := range Kinds {
		if got, err := ParseKind(string(k)); err != nil || got != k {
			t.Fatalf("%s: %v", k, err)
		}
	}
	if _, err := ParseKind("output"); err == nil {
		t.Fatal("unknown kind accepted")
	}
}

// openTrailFiles counts this process's open descriptors on files in dir.
func openTrailFiles(t *testing.T, dir string) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skip("no /proc/self/fd")
	}
	n := 0
	for _, e := range ents {
		if p, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name())); err == nil && strings.HasPrefix(p, dir+"/") {
			n++
		}
	}
	return n
}

func TestAppendHoldsFewFilesOpen(t *testing.T) {
	s, c := newStore(t, Options{PerSandbox: 4 << 10})
	const n = maxOpen + 20
	for round := range 2 {
		for i := range n {
			c.add(time.Millisecond)
			if err := s.Append(Record{Kind: KindCommand, Action: ActionRun, SandboxID: fmt.Sprintf("sb%d", i),
				Command: &Command{Line: strings.Repeat("x", 100)}}); err != nil {
				t.Fatal(err)
			}
		}
		if got := openTrailFiles(t, s.opt.Dir); got > maxOpen {
			t.Fatalf("round %d: %d trail files open, want at most %d", round, got, maxOpen)
		}
	}
	// Every record reached its file, the ones whose file was closed and
	// reopened too, in order.
	for i := range n {
		recs, _, err := s.Read(fmt.Sprintf("sb%d", i), Query{})
		if err != nil || len(recs) != 2 || recs[0].Seq != 1 || recs[1].Seq != 2 {
			t.Fatalf("sb%d: %d records %v", i, len(recs), err)
		}
	}
	// Rotation closes the file it renames: the newest records go to the
	// new current half.
	for range 60 {
		if err := s.Append(Record{Kind: KindCommand, Action: ActionRun, SandboxID: "sb0", Command: &Command{Line: strings.Repeat("y", 100)}}); err != nil {
			t.Fatal(err)
		}
	}
	recs, _, _ := s.Read("sb0", Query{Limit: 1000})
	if len(recs) == 0 || recs[len(recs)-1].Seq != 62 {
		t.Fatalf("after rotation the last record is not the newest: %d records", len(recs))
	}
	if fi, err := os.Stat(filepath.Join(s.opt.Dir, "sb0.log")); err != nil || fi.Size() == 0 || fi.Size() > 2<<10 {
		t.Fatalf("current half after rotation: %v %v", fi, err)
	}
	s.Close()
	if got := openTrailFiles(t, s.opt.Dir); got != 0 {
		t.Fatalf("%d trail files open after Close", got)
	}
}
