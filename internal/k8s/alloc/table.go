// Package alloc is the allocation table of a Pool's warm pods: which pod
// belongs to which claim. Every allocator reads and writes it — `moat
// controller` for the BatchSandboxes users create, and every replica of
// `moat serve --runtime kubernetes` for claims made through the Lifecycle
// API — so that none of them hands out a pod another one took: an
// allocation is a write of the table guarded by the resourceVersion it was
// computed from, and that one write is the allocation (a conflict means
// someone else changed the table first, and the allocation is computed
// again from the newer table).
//
// The table of pool P is split into shards: Secrets in P's namespace
// (ShardName), each with data[TableKey] the gzipped JSON of a Table (a
// write's cost in the API server grows with its size: a shard full of
// inline records is ~77 KB of JSON and ~11 KB gzipped): the owners
// of pods (a BatchSandbox, or one sandbox of a moat server scope), the
// retired pods (released or being deleted: never handed out again), and
// the records of sandboxes written with their claim (Table.Records; a
// record can carry secrets, hence Secrets). Every
// pod belongs to one shard, by a stable hash of its name (ShardOf), and
// only that shard names it; an owner holding pods of several shards has
// an entry in each. Free pods are the pool's ready pods that their shard
// does not name. A write carries one shard, so its size is the shard's,
// and allocators writing different shards never conflict: each process
// takes free pods from a shard of its own choosing and moves to another
// after a conflict. Concurrent changes of one pool in one process are
// grouped into one write per shard (Allocator.Apply).
//
// The number of shards is fixed when the table is made (ShardsFor the
// pool's PoolMax: one shard per PodsPerShard pods, at least MinShards),
// so that a shard holds about PodsPerShard pods however large the pool
// is, and a claim's write does not grow with the pool. Every shard
// records the count (AnnoShards); shard 0 is made first, and whoever
// finds it made adopts its count, so every allocator of a pool agrees on
// which shard names a pod.
//
// The pool's pods carry their own agent access token, one per pod, kept
// in the pool's token Secret (TokenSecretName), which the controller
// writes before it creates the pods; a claim hands the pod's token to the
// sandbox's owner, so no token is shared between sandboxes.
package alloc

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/klauspost/compress/gzip"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sbv1 "github.com/moat-sandbox/moat/api/v1alpha1"
)

// Names, labels and keys of the objects of this package.
const (
	// TableKey is the data key of a table shard Secret holding Table's
	// JSON, gzipped. Read it with `kubectl get secret NAME -o
	// jsonpath='{.data.table\.json\.gz}' | base64 -d | gunzip`.
	TableKey = "table.json.gz"
	// plainTableKey is the key of the plain JSON of tables written before
	// TableKey (read, never written).
	plainTableKey = "table"
	// AnnoShard is the shard number of a table shard Secret.
	AnnoShard = "moat." + sbv1.Group + "/alloc-shard"
	// AnnoShards is the number of shards of the table a shard belongs to
	// (absent on tables made before it existed: MinShards).
	AnnoShards = "moat." + sbv1.Group + "/alloc-shards"
	// LabelTable marks table shard Secrets ("true"); AnnoPool names the
	// pool.
	LabelTable = "moat." + sbv1.Group + "/alloc-table"
	// LabelPoolData marks the Secrets of pools ("table" or "tokens"), so
	// that one cache can select both.
	LabelPoolData = "moat." + sbv1.Group + "/pool-data"
	// LabelTokens marks pool token Secrets ("true"); AnnoPool names the pool.
	LabelTokens = "moat." + sbv1.Group + "/pool-tokens"
	// AnnoPool names the pool of a table or token Secret.
	AnnoPool = "moat." + sbv1.Group + "/pool"
	// TokenEnv is the agent's access token variable in a pod.
	TokenEnv = "EXECD_ACCESS_TOKEN"
)

// RetiredTTL is how long a retired pod stays in a table after it is gone
// from the pod cache of the process writing the table: longer than any
// other allocator's cache may lag, so that none sees the pod as free.
const RetiredTTL = 2 * time.Minute

// Table is the allocation record of one pool.
type Table struct {
	// Owners are the claims holding pods, by owner (see BatchOwner and
	// SandboxOwner).
	Owners map[string]Owned `json:"owners,omitempty"`
	// Retired are pods given up, with when: released by their owner, or
	// free pods the pool controller deletes. They are never handed out
	// again, and are forgotten RetiredTTL after they are gone.
	Retired map[string]time.Time `json:"retired,omitempty"`
	// Records are records written in the same write as their owner's
	// claim (Change.Record), by owner: the claim and its record are one
	// durable step. They go with the owner's release, or when their
	// store has written them elsewhere (Change.DropRecord).
	Records map[string]json.RawMessage `json:"records,omitempty"`
}

// Owned is what one owner holds.
type Owned struct {
	Pods []string `json:"pods"`
	// At is when the owner was first given pods: a sandbox owner whose
	// server never recorded the sandbox (it died in between) is released
	// after a grace period counted from here.
	At time.Time `json:"at"`
}

// BatchOwner is the owner id of a BatchSandbox's pool pods.
func BatchOwner(name string) string { return "batchsandbox/" + name }

// SandboxOwner is the owner id of sandbox id of a moat server of scope
// (the server's --bridge name, which separates servers in a namespace).
func SandboxOwner(scope, id string) string { return "moat/" + scope + "/" + id }

// SandboxOf returns the sandbox id of an owner of scope, if it is one.
func SandboxOf(scope, owner string) (string, bool) {
	return strings.CutPrefix(owner, "moat/"+scope+"/")
}

// BatchOf returns the BatchSandbox name of an owner, if it is one.
func BatchOf(owner string) (string, bool) { return strings.CutPrefix(owner, "batchsandbox/") }

// Shard counts: a pool's table has ShardsFor(PoolMax) shards.
const (
	// MinShards is the fewest shards of a table (and the count of tables
	// that do not record theirs).
	MinShards = 8
	// PodsPerShard is the pods a shard is sized for.
	PodsPerShard = 128
	// MaxShards bounds the count (a pool past MaxShards*PodsPerShard pods
	// has larger shards).
	MaxShards = 4096
)

// ShardsFor returns the number of shards of the table of a pool of at
// most poolMax pods.
func ShardsFor(poolMax int) int {
	return min(max(MinShards, (poolMax+PodsPerShard-1)/PodsPerShard), MaxShards)
}

// ShardOf returns the shard of pod in a table of n shards (a stable hash
// of its name).
func ShardOf(pod string, n int) int {
	h := fnv.New32a()
	h.Write([]byte(pod))
	return int(h.Sum32() % uint32(n))
}

// ByShard orders free pods for an allocator that hands them out in order
// (the controller's batches) from a table of n shards: the pods of the
// shard with the most free pods first, then the next fullest shard's, so
// that a batch touches as few shards (writes) as it can; by name within a
// shard. n 0 (no table yet): by name.
func ByShard(free []string, n int) []string {
	if n <= 0 {
		return slices.Sorted(slices.Values(free))
	}
	by := make([][]string, n)
	for _, p := range free {
		s := ShardOf(p, n)
		by[s] = append(by[s], p)
	}
	order := make([]int, n)
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return len(by[b]) - len(by[a]) })
	out := make([]string, 0, len(free))
	for _, s := range order {
		slices.Sort(by[s])
		out = append(out, by[s]...)
	}
	return out
}

// ShardName is the name of the Secret of shard of pool's table.
func ShardName(pool string, shard int) string {
	return objectName(pool, fmt.Sprintf("moat-alloc-%d", shard))
}

// TokenSecretName is the name of pool's token Secret.
func TokenSecretName(pool string) string { return objectName(pool, "moat-tokens") }

// objectName joins pool and suffix into a valid object name (at most 253
// characters; long pool names are cut and made distinct with a hash).
func objectName(pool, suffix string) string {
	if max := 252 - len(suffix); len(pool) > max {
		sum := sha256.Sum256([]byte(pool))
		pool = pool[:max-9] + "-" + hex.EncodeToString(sum[:4])
	}
	return pool + "-" + suffix
}

// maxTableJSON bounds the JSON a shard's gzipped data may unpack to (a
// Secret holds at most 1 MiB; JSON this size is many times any shard's).
const maxTableJSON = 64 << 20

// Parse reads a table from a shard Secret's data (nil data: an empty
// table).
func Parse(data map[string][]byte) (Table, error) {
	var t Table
	raw := data[plainTableKey]
	if gz := data[TableKey]; len(gz) > 0 {
		zr, err := gzip.NewReader(bytes.NewReader(gz))
		if err != nil {
			return Table{}, fmt.Errorf("allocation table: %w", err)
		}
		if raw, err = io.ReadAll(io.LimitReader(zr, maxTableJSON+1)); err != nil {
			return Table{}, fmt.Errorf("allocation table: %w", err)
		}
		if len(raw) > maxTableJSON {
			return Table{}, fmt.Errorf("allocation table: more than %d bytes of JSON", maxTableJSON)
		}
	}
	if len(raw) > 0 {
		if err := json.Unmarshal(raw, &t); err != nil {
			return Table{}, fmt.Errorf("allocation table: %w", err)
		}
	}
	if t.Owners == nil {
		t.Owners = map[string]Owned{}
	}
	if t.Retired == nil {
		t.Retired = map[string]time.Time{}
	}
	if t.Records == nil {
		t.Records = map[string]json.RawMessage{}
	}
	return t, nil
}

// Encode returns the table as shard Secret data.
func (t Table) Encode() map[string][]byte {
	b, _ := json.Marshal(t) // maps of strings, times and valid JSON: cannot fail
	var buf bytes.Buffer
	// Stateless: no compressor state of a megabyte per write (a full
	// shard: 77 KB of JSON, 11 KB stored, in ~0.15 ms more than the JSON).
	zw, _ := gzip.NewWriterLevel(&buf, gzip.StatelessCompression) // a valid level: cannot fail
	zw.Write(b)                                                   // into memory: cannot fail
	zw.Close()
	return map[string][]byte{TableKey: buf.Bytes()}
}

// Clone deep-copies t.
func (t Table) Clone() Table {
	out := Table{Owners: make(map[string]Owned, len(t.Owners)), Retired: maps.Clone(t.Retired), Records: maps.Clone(t.Records)}
	for k, o := range t.Owners {
		out.Owners[k] = Owned{Pods: slices.Clone(o.Pods), At: o.At}
	}
	if out.Retired == nil {
		out.Retired = map[string]time.Time{}
	}
	if out.Records == nil {
		out.Records = map[string]json.RawMessage{}
	}
	return out
}

// Merge returns the union of tables (the shards of one pool): an owner's
// pods are joined, with the earliest At.
func Merge(ts ...Table) Table {
	out := Table{Owners: map[string]Owned{}, Retired: map[string]time.Time{}, Records: map[string]json.RawMessage{}}
	for _, t := range ts {
		maps.Copy(out.Retired, t.Retired)
		maps.Copy(out.Records, t.Records)
		for o, own := range t.Owners {
			cur, had := out.Owners[o]
			cur.Pods = append(cur.Pods, own.Pods...)
			if !had || (!own.At.IsZero() && own.At.Before(cur.At)) {
				cur.At = own.At
			}
			out.Owners[o] = cur
		}
	}
	return out
}

// Shard is one stored shard of a pool's table.
type Shard struct {
	Index int
	// Count is the number of shards of the table.
	Count int
	Table Table
	// Bytes is the size of the shard's data as stored.
	Bytes int
}

// ReadShards reads the shards of pool's table from r (those that exist).
func ReadShards(ctx context.Context, r client.Reader, pool types.NamespacedName) ([]Shard, error) {
	var list corev1.SecretList
	if err := r.List(ctx, &list, client.InNamespace(pool.Namespace), client.MatchingLabels{LabelTable: "true"}); err != nil {
		return nil, err
	}
	var out []Shard
	for i := range list.Items {
		sec := &list.Items[i]
		n, count, ok := shardOf(sec)
		if !ok || sec.Annotations[AnnoPool] != pool.Name {
			continue
		}
		t, err := Parse(sec.Data)
		if err != nil {
			return nil, fmt.Errorf("shard %d of pool %s: %w", n, pool.Name, err)
		}
		out = append(out, Shard{Index: n, Count: count, Table: t, Bytes: len(sec.Data[TableKey]) + len(sec.Data[plainTableKey])})
	}
	slices.SortFunc(out, func(a, b Shard) int { return a.Index - b.Index })
	return out, nil
}

// ReadTable reads pool's whole table (its shards merged) from r.
func ReadTable(ctx context.Context, r client.Reader, pool types.NamespacedName) (Table, error) {
	shards, err := ReadShards(ctx, r, pool)
	if err != nil {
		return Table{}, err
	}
	ts := make([]Table, len(shards))
	for i, s := range shards {
		ts[i] = s.Table
	}
	return Merge(ts...), nil
}

// shardOf returns the shard number of a table shard Secret and the
// number of shards of its table.
func shardOf(cm *corev1.Secret) (int, int, bool) {
	if cm.Labels[LabelTable] != "true" || cm.Annotations[AnnoPool] == "" {
		return 0, 0, false
	}
	count := MinShards
	if c, ok := cm.Annotations[AnnoShards]; ok {
		var err error
		if count, err = strconv.Atoi(c); err != nil || count < 1 || count > MaxShards {
			return 0, 0, false
		}
	}
	n, err := strconv.Atoi(cm.Annotations[AnnoShard])
	if err != nil || n < 0 || n >= count {
		return 0, 0, false
	}
	return n, count, true
}

// Index maps every pod the table names to its owner ("" for a retired
// pod).
func (t Table) Index() map[string]string {
	out := make(map[string]string, len(t.Retired)+len(t.Owners))
	for p := range t.Retired {
		out[p] = ""
	}
	for o, own := range t.Owners {
		for _, p := range own.Pods {
			out[p] = o
		}
	}
	return out
}

// Change is one modification of a pool's table. Changes of one group
// commit are applied in order.
type Change struct {
	// Owner receives Want free pods and gives up Release (or all its pods
	// with ReleaseAll).
	Owner string
	// Want is the number of free pods to give Owner. It gets fewer when
	// the pool has fewer free pods (Result.Pods says which it got).
	Want int
	// Adopt are pods to record as Owner's as they are (the controller
	// re-recording the pool pods of a batch record written before the
	// table existed); a pod the table names already is skipped.
	Adopt []string
	// Release are pods of Owner to retire; ReleaseAll retires all of them
	// and forgets Owner.
	Release    []string
	ReleaseAll bool
	// Retire are free pods to retire (the pool controller is deleting
	// them); a pod the table names already is skipped (Result.Retired
	// says which were retired).
	Retire []string
	// Record, when set, makes Owner's record, written inline in the same
	// write as the pods Owner gets (Table.Records), from the first of
	// them and what the allocator knows of it; a record over
	// MaxInlineRecord bytes is not written (Result.Recorded). It is
	// called with the allocator's locks held: it must not call the
	// allocator.
	Record func(pod string, st PodState) []byte
	// DropRecord removes Owner's inline record if it is still this one
	// (its store has written it elsewhere).
	DropRecord []byte
}

// Result is what a Change did.
type Result struct {
	// Pods are the free pods given to the owner (Want of them at most).
	Pods []string
	// Retired are the pods of Change.Retire that were free and are now
	// retired.
	Retired []string
	// Held are all the pods the owner holds after the change.
	Held []string
	// Recorded says Change.Record's record was written with the pods.
	Recorded bool
	// Dropped says Change.DropRecord's record was dropped: by a write of
	// its shard guarded by the version it was computed from, so Held was
	// the truth of that shard then.
	Dropped bool
}

// MaxInlineRecord bounds an inline record: a shard's PodsPerShard claims
// with their records stay far below a Secret's 1 MiB.
const MaxInlineRecord = 4 << 10

// InlineRoom is how many bytes of inline records a shard keeps: past it,
// the oldest are crowded (InlineRecord.Crowded) and their store moves
// them out, so that a claim's write of the shard stays bounded. The
// records of a shard's PodsPerShard claims (about 500 bytes each) fit, so
// they stay inline until their first update; big ones (a large env) or a
// shard holding more pods than it was sized for push some out.
const InlineRoom = 64 << 10

// crowded returns the owners of the records t holds past InlineRoom: the
// oldest claims' (then by owner), until the rest fit.
func (t Table) crowded() map[string]bool {
	size := 0
	for _, raw := range t.Records {
		size += len(raw)
	}
	if size <= InlineRoom {
		return nil
	}
	owners := slices.Collect(maps.Keys(t.Records))
	slices.SortFunc(owners, func(a, b string) int {
		return cmp.Or(t.Owners[a].At.Compare(t.Owners[b].At), strings.Compare(a, b))
	})
	out := map[string]bool{}
	for _, o := range owners {
		if size <= InlineRoom {
			break
		}
		out[o] = true
		size -= len(t.Records[o])
	}
	return out
}

// apply applies changes to t (in place) at time now and returns their
// results. free lists candidate free pods (ready, of the current
// revision), in the order they should be handed out; a pod the table
// names is skipped. gone reports whether a pod is gone from the pool (for
// the clean-up of retired entries); state is what is known of a pod (for
// Change.Record).
func (t *Table) apply(changes []Change, free []string, gone func(string) bool, state func(string) PodState, now time.Time) []Result {
	taken := t.Index()
	out := make([]Result, len(changes))
	fi := 0
	for i, ch := range changes {
		own, had := t.Owners[ch.Owner]
		var rel []string
		if ch.ReleaseAll {
			rel = slices.Clone(own.Pods) // own.Pods shrinks below
		} else {
			rel = ch.Release
		}
		for _, p := range rel {
			if taken[p] == ch.Owner && ch.Owner != "" {
				t.Retired[p] = now
				taken[p] = ""
				own.Pods = slices.DeleteFunc(own.Pods, func(q string) bool { return q == p })
			}
		}
		for _, p := range ch.Retire {
			if _, named := taken[p]; !named {
				t.Retired[p] = now
				taken[p] = ""
				out[i].Retired = append(out[i].Retired, p)
			}
		}
		for _, p := range ch.Adopt {
			if _, named := taken[p]; !named && ch.Owner != "" {
				own.Pods = append(own.Pods, p)
				taken[p] = ch.Owner
			}
		}
		for len(out[i].Pods) < ch.Want && fi < len(free) {
			p := free[fi]
			fi++
			if _, named := taken[p]; named {
				continue
			}
			own.Pods = append(own.Pods, p)
			taken[p] = ch.Owner
			out[i].Pods = append(out[i].Pods, p)
		}
		if ch.Owner == "" {
			continue
		}
		if ch.Record != nil && len(out[i].Pods) > 0 {
			p := out[i].Pods[0]
			var st PodState
			if state != nil {
				st = state(p)
			}
			if raw := ch.Record(p, st); len(raw) > 0 && len(raw) <= MaxInlineRecord {
				t.Records[ch.Owner] = raw
				out[i].Recorded = true
			}
		}
		if cur, ok := t.Records[ch.Owner]; ok && ch.DropRecord != nil && string(cur) == string(ch.DropRecord) {
			delete(t.Records, ch.Owner)
			out[i].Dropped = true
		}
		if len(own.Pods) == 0 {
			delete(t.Owners, ch.Owner)
			delete(t.Records, ch.Owner)
			continue
		}
		if !had || own.At.IsZero() {
			own.At = now
		}
		t.Owners[ch.Owner] = own
		out[i].Held = slices.Clone(own.Pods)
	}
	for p, at := range t.Retired {
		if now.Sub(at) > RetiredTTL && gone(p) {
			delete(t.Retired, p)
		}
	}
	return out
}

// equal reports whether t and o hold the same record.
func (t Table) equal(o Table) bool {
	a, _ := json.Marshal(t)
	b, _ := json.Marshal(o)
	return string(a) == string(b)
}
