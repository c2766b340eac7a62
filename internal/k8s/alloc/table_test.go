package alloc

import (
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"
)

func TestApply(t *testing.T) {
	now := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	old := now.Add(-2 * RetiredTTL)
	never := func(string) bool { return false }
	always := func(string) bool { return true }
	for i, tc := range []struct {
		name    string
		table   Table
		changes []Change
		free    []string
		gone    func(string) bool
		want    []Result
		owners  map[string][]string
		retired []string
	}{{
		name:    "claims take free pods in order, skipping named ones",
		table:   Table{Owners: map[string]Owned{"b/x": {Pods: []string{"p1"}, At: old}}, Retired: map[string]time.Time{"p2": now}},
		changes: []Change{{Owner: "s/a", Want: 2}, {Owner: "s/b", Want: 1}},
		free:    []string{"p1", "p2", "p3", "p4", "p5"},
		gone:    never,
		want:    []Result{{Pods: []string{"p3", "p4"}, Held: []string{"p3", "p4"}}, {Pods: []string{"p5"}, Held: []string{"p5"}}},
		owners:  map[string][]string{"b/x": {"p1"}, "s/a": {"p3", "p4"}, "s/b": {"p5"}},
		retired: []string{"p2"},
	}, {
		name:    "a claim gets fewer pods when the pool runs out, and no entry without pods",
		table:   Table{},
		changes: []Change{{Owner: "s/a", Want: 3}, {Owner: "s/b", Want: 1}},
		free:    []string{"p1", "p2"},
		gone:    never,
		want:    []Result{{Pods: []string{"p1", "p2"}, Held: []string{"p1", "p2"}}, {}},
		owners:  map[string][]string{"s/a": {"p1", "p2"}},
	}, {
		name:    "release retires an owner's pods, never another's",
		table:   Table{Owners: map[string]Owned{"s/a": {Pods: []string{"p1", "p2"}, At: old}, "s/b": {Pods: []string{"p3", "p4", "p5", "p6"}, At: old}}},
		changes: []Change{{Owner: "s/a", Release: []string{"p1", "p3"}}, {Owner: "s/b", ReleaseAll: true}},
		gone:    never,
		want:    []Result{{Held: []string{"p2"}}, {}},
		owners:  map[string][]string{"s/a": {"p2"}},
		retired: []string{"p1", "p3", "p4", "p5", "p6"},
	}, {
		name:    "retire takes only free pods, and a retired pod is not handed out",
		table:   Table{Owners: map[string]Owned{"s/a": {Pods: []string{"p1"}, At: old}}},
		changes: []Change{{Retire: []string{"p1", "p2"}}, {Owner: "s/b", Want: 1}},
		free:    []string{"p2", "p3"},
		gone:    never,
		want:    []Result{{Retired: []string{"p2"}}, {Pods: []string{"p3"}, Held: []string{"p3"}}},
		owners:  map[string][]string{"s/a": {"p1"}, "s/b": {"p3"}},
		retired: []string{"p2"},
	}, {
		name:    "adopt records named pods as they are, skipping taken ones",
		table:   Table{Owners: map[string]Owned{"s/a": {Pods: []string{"p1"}, At: old}}},
		changes: []Change{{Owner: "b/x", Adopt: []string{"p1", "p2"}}},
		gone:    never,
		want:    []Result{{Held: []string{"p2"}}},
		owners:  map[string][]string{"s/a": {"p1"}, "b/x": {"p2"}},
	}, {
		name:    "retired pods are forgotten once gone and old",
		table:   Table{Retired: map[string]time.Time{"old": old, "recent": now}},
		changes: []Change{{Owner: "s/a", Want: 1}},
		free:    []string{"old", "p1"},
		gone:    always,
		want:    []Result{{Pods: []string{"p1"}, Held: []string{"p1"}}},
		owners:  map[string][]string{"s/a": {"p1"}},
		retired: []string{"recent"},
	}, {
		name:    "retired pods that are still there stay",
		table:   Table{Retired: map[string]time.Time{"old": old}},
		changes: []Change{{Owner: "s/a", Want: 0}},
		gone:    never,
		want:    []Result{{}},
		owners:  map[string][]string{},
		retired: []string{"old"},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			tbl, _ := Parse(Table{Owners: tc.table.Owners, Retired: tc.table.Retired}.Encode())
			got := tbl.apply(tc.changes, tc.free, tc.gone, nil, now)
			for j := range tc.want {
				w, g := tc.want[j], got[j]
				if !slices.Equal(w.Pods, g.Pods) || !slices.Equal(w.Retired, g.Retired) || !slices.Equal(w.Held, g.Held) {
					t.Errorf("%d: result %d = %+v, want %+v", i, j, g, w)
				}
			}
			if len(tbl.Owners) != len(tc.owners) {
				t.Errorf("%d: owners %v, want %v", i, tbl.Owners, tc.owners)
			}
			for o, pods := range tc.owners {
				if !slices.Equal(tbl.Owners[o].Pods, pods) {
					t.Errorf("%d: owner %s holds %v, want %v", i, o, tbl.Owners[o].Pods, pods)
				}
				if tbl.Owners[o].At.IsZero() {
					t.Errorf("%d: owner %s has no time", i, o)
				}
			}
			var ret []string
			for p := range tbl.Retired {
				ret = append(ret, p)
			}
			slices.Sort(ret)
			if !slices.Equal(ret, tc.retired) {
				t.Errorf("%d: retired %v, want %v", i, ret, tc.retired)
			}
			// Encoding round-trips.
			back, err := Parse(tbl.Encode())
			if err != nil || !back.equal(tbl) {
				t.Errorf("%d: round trip: %v %+v", i, err, back)
			}
		})
	}
}

func TestNames(t *testing.T) {
	long := ""
	for len(long) < 300 {
		long += "abcdefghij"
	}
	for _, n := range []string{ShardName(long, 0), TokenSecretName(long), ShardName(long+"x", 7)} {
		if len(n) > 253 {
			t.Errorf("name %q too long (%d)", n, len(n))
		}
	}
	if ShardName(long, 0) == ShardName(long+"x", 0) {
		t.Error("long pool names collide")
	}
	if ShardName(long, 0) == ShardName(long, 1) {
		t.Error("shards of a long pool name collide")
	}
	if got := ShardName("warm", 3); got != "warm-moat-alloc-3" {
		t.Errorf("ShardName = %q", got)
	}
	if id, ok := SandboxOf("moat0", SandboxOwner("moat0", "abc")); !ok || id != "abc" {
		t.Errorf("SandboxOf = %q %v", id, ok)
	}
	if _, ok := SandboxOf("other", SandboxOwner("moat0", "abc")); ok {
		t.Error("SandboxOf accepts another scope")
	}
	if b, ok := BatchOf(BatchOwner("x")); !ok || b != "x" {
		t.Errorf("BatchOf = %q %v", b, ok)
	}
}

// fullShard is a shard as a pool's claims leave it: PodsPerShard owners
// of one pod each, with their inline records.
func fullShard() Table {
	t := Table{Owners: map[string]Owned{}, Retired: map[string]time.Time{}, Records: map[string]json.RawMessage{}}
	at := time.Date(2026, 12, 4, 10, 2, 16, 919587814, time.UTC)
	for i := range PodsPerShard {
		id := fmt.Sprintf("%08x-%04x-4%03x-8%03x-%012x", i*2654435761, i%0xffff, i%0xfff, i%0xfff, i*40503)
		o := SandboxOwner("moat0", id)
		at = at.Add(time.Duration(i*7919) * time.Microsecond)
		t.Owners[o] = Owned{Pods: []string{fmt.Sprintf("warm-%08x", i*97)}, At: at}
		t.Records[o] = json.RawMessage(fmt.Sprintf(`{"id":%q,"image":"busybox:scale","entrypoint":["sleep","infinity"],"metadata":{},"resources":{},`+
			`"status":{"state":"Running","reason":"SANDBOX_RUNNING","lastTransitionAt":%q},"createdAt":%q,"expiresAt":%q,`+
			`"agentToken":"%032x","pool":"warm","poolRevision":1,"tenant":"default"}`,
			id, at.Format(time.RFC3339Nano), at.Format(time.RFC3339Nano), at.Add(time.Hour).Format(time.RFC3339Nano), uint64(i)*0x9e3779b97f4a7c15))
	}
	return t
}

// TestEncoding: a shard is stored gzipped and reads back the same; a
// table of an older moat, stored as plain JSON, reads too; data that is
// not gzip is an error, not an empty table.
func TestEncoding(t *testing.T) {
	tbl := fullShard()
	data := tbl.Encode()
	plain, _ := json.Marshal(tbl)
	if gz := len(data[TableKey]); gz == 0 || gz*3 > len(plain) {
		t.Errorf("a full shard is %d bytes stored, %d of JSON: want it a third or less", gz, len(plain))
	}
	back, err := Parse(data)
	if err != nil || !back.equal(tbl) || len(back.Records) != len(tbl.Records) {
		t.Fatalf("round trip: %v (%d owners, %d records)", err, len(back.Owners), len(back.Records))
	}
	old, err := Parse(map[string][]byte{"table": plain})
	if err != nil || !old.equal(tbl) {
		t.Errorf("a plain JSON table: %v (%d owners)", err, len(old.Owners))
	}
	if _, err := Parse(map[string][]byte{TableKey: plain}); err == nil {
		t.Error("plain JSON under the gzip key parsed")
	}
}

// BenchmarkEncode and BenchmarkParse: a full shard, as every claim's
// write encodes it and every table event parses it.
func BenchmarkEncode(b *testing.B) {
	tbl := fullShard()
	for b.Loop() {
		tbl.Encode()
	}
}

func BenchmarkParse(b *testing.B) {
	data := fullShard().Encode()
	for b.Loop() {
		if _, err := Parse(data); err != nil {
			b.Fatal(err)
		}
	}
}
