package alloc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sbv1 "github.com/moat-sandbox/moat/api/v1alpha1"
	"github.com/moat-sandbox/moat/internal/errdefs"
)

// Options configure an Allocator.
type Options struct {
	// Client writes tables.
	Client client.Client
	// Reader reads a table straight from the API server after a conflict
	// (default Client, which must then not be a cached client).
	Reader client.Reader
	// Informers delivers the pods (those labelled sbv1.LabelPool) and the
	// table shard Secrets (LabelTable) of the namespaces served; the
	// allocator adds its handlers to them. The caller starts them.
	Informers cache.Informers
	// Revision returns the current template revision of a pool (its pods'
	// sbv1.LabelPoolRevision): only pods of that revision are handed
	// out. "" hands out pods of any revision. Optional.
	Revision func(pool types.NamespacedName) string
	// Usable returns what reports whether a free pod of pool may be
	// handed out besides being ready (the server: its token is known).
	// It is called once per look at the pool's free pods, and what it
	// returns once per pod, so it should do its lookups once. Optional.
	Usable func(pool types.NamespacedName) func(pod string) bool
	// Changed is called (outside any lock) after shard of pool's table
	// changed, from this process's writes and from other writers'.
	// Optional.
	Changed func(pool types.NamespacedName, shard int)
	// Size returns a pool's PoolMax, which sizes its table when this
	// allocator is the one to make it (ShardsFor). Optional (MinShards).
	Size func(pool types.NamespacedName) int
}

// Allocator serves the tables of the pools it sees: it keeps every pool's
// pods and table in memory, from the informers (the ledger), and applies
// changes with group commits. It is safe for concurrent use.
type Allocator struct {
	o Options

	mu    sync.Mutex
	pools map[types.NamespacedName]*poolState
	regs  []toolscache.ResourceEventHandlerRegistration

	// owners indexes every owner of every table: (namespace, owner) ->
	// pool. Lock order: a poolState's mu before ownMu.
	ownMu  sync.Mutex
	owners map[types.NamespacedName]types.NamespacedName
}

// PodState is what the allocator knows of a pool pod.
type PodState struct {
	UID      types.UID
	IP       string
	Ready    bool // running, with an address, not deleting
	Ended    bool // succeeded or failed: it will never serve again
	Deleting bool
	Revision string
}

// poolState is one pool's ledger: its pods, the newest known copy of
// each shard of its table, and the group commit queue. mu guards
// everything but queue, which qmu guards.
type poolState struct {
	key  types.NamespacedName
	a    *Allocator
	mu   sync.Mutex
	pods map[string]PodState
	// n is the number of shards of the table (0 until known), shards
	// their copies.
	n      int
	shards []shardState
	// cursor is the shard this process takes free pods from first: chosen
	// at random, so that replicas claiming from one pool mostly write
	// different shards, and moved after a conflict.
	cursor int

	qmu     sync.Mutex
	queue   []*request
	running bool
}

// shardState is the newest known copy of one shard.
type shardState struct {
	table Table
	// rv is the resourceVersion of table ("" while the shard does not
	// exist); exists says whether it does.
	rv     string
	exists bool
	// index maps every pod the shard names to its owner ("" retired).
	index map[string]string
	// wrote are the inline records of the shard this process wrote, by
	// owner (see InlineRecords).
	wrote map[string]string
}

type request struct {
	ch   Change
	res  Result
	err  error
	done chan struct{}
}

// New returns an allocator fed by o.Informers. Call Synced (or
// WaitSynced) before trusting it.
func New(ctx context.Context, o Options) (*Allocator, error) {
	if o.Client == nil || o.Informers == nil {
		return nil, errors.New("alloc: Client and Informers are required")
	}
	if o.Reader == nil {
		o.Reader = o.Client
	}
	a := &Allocator{o: o, pools: map[types.NamespacedName]*poolState{}, owners: map[types.NamespacedName]types.NamespacedName{}}
	pi, err := o.Informers.GetInformer(ctx, &corev1.Pod{})
	if err != nil {
		return nil, fmt.Errorf("alloc: pod informer: %w", err)
	}
	reg, err := pi.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { a.podEvent(obj, false) },
		UpdateFunc: func(_, obj any) { a.podEvent(obj, false) },
		DeleteFunc: func(obj any) { a.podEvent(obj, true) },
	})
	if err != nil {
		return nil, err
	}
	a.regs = append(a.regs, reg)
	ti, err := o.Informers.GetInformer(ctx, &corev1.Secret{})
	if err != nil {
		return nil, fmt.Errorf("alloc: table informer: %w", err)
	}
	reg, err = ti.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { a.tableEvent(obj, false) },
		UpdateFunc: func(_, obj any) { a.tableEvent(obj, false) },
		DeleteFunc: func(obj any) { a.tableEvent(obj, true) },
	})
	if err != nil {
		return nil, err
	}
	a.regs = append(a.regs, reg)
	return a, nil
}

// Synced reports whether the allocator has seen the informers' initial
// lists.
func (a *Allocator) Synced() bool {
	for _, r := range a.regs {
		if !r.HasSynced() {
			return false
		}
	}
	return true
}

// WaitSynced waits until Synced or ctx ends.
func (a *Allocator) WaitSynced(ctx context.Context) error {
	for !a.Synced() {
		select {
		case <-ctx.Done():
			return fmt.Errorf("alloc: informers not synced: %w", errdefs.ErrUnavailable)
		case <-time.After(10 * time.Millisecond):
		}
	}
	return nil
}

func (a *Allocator) pool(key types.NamespacedName) *poolState {
	a.mu.Lock()
	defer a.mu.Unlock()
	ps := a.pools[key]
	if ps == nil {
		ps = &poolState{key: key, a: a, pods: map[string]PodState{}}
		a.pools[key] = ps
	}
	return ps
}

// adoptLocked makes count the pool's number of shards if it knows none
// or no shard of its table exists (the table was deleted), and reports
// whether count is the pool's number of shards. Preconditions: ps.mu
// held.
func (ps *poolState) adoptLocked(count int) bool {
	if ps.n == count {
		return true
	}
	for i := range ps.shards {
		if ps.shards[i].exists {
			return false // a shard of another layout: not this table's
		}
	}
	for i := range ps.shards {
		ps.setLocked(i, Table{}, "", false) // forget their owners
	}
	ps.n = count
	ps.shards = make([]shardState, count)
	for i := range ps.shards {
		ps.shards[i] = shardState{table: Table{Owners: map[string]Owned{}, Retired: map[string]time.Time{}}, index: map[string]string{}}
	}
	ps.cursor = rand.IntN(count)
	return true
}

// knownLocked reports whether the pool's table is known to exist (some
// shard does). Preconditions: ps.mu held.
func (ps *poolState) knownLocked() bool {
	for i := range ps.shards {
		if ps.shards[i].exists {
			return true
		}
	}
	return false
}

// ShardCount returns the number of shards of pool's table (0 while no
// table is known).
func (a *Allocator) ShardCount(pool types.NamespacedName) int {
	ps := a.pool(pool)
	ps.mu.Lock()
	defer ps.mu.Unlock()
	return ps.n
}

func unwrap(obj any) any {
	if t, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
		return t.Obj
	}
	return obj
}

func (a *Allocator) podEvent(obj any, deleted bool) {
	p, ok := unwrap(obj).(*corev1.Pod)
	if !ok {
		return
	}
	name := p.Labels[sbv1.LabelPool]
	if name == "" {
		return
	}
	ps := a.pool(types.NamespacedName{Namespace: p.Namespace, Name: name})
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if deleted {
		if cur, ok := ps.pods[p.Name]; ok && cur.UID == p.UID {
			delete(ps.pods, p.Name)
		}
		return
	}
	ps.pods[p.Name] = podState(p)
}

func podState(p *corev1.Pod) PodState {
	st := PodState{UID: p.UID, IP: p.Status.PodIP, Deleting: p.DeletionTimestamp != nil, Revision: p.Labels[sbv1.LabelPoolRevision]}
	st.Ended = p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed
	st.Ready = !st.Deleting && p.Status.Phase == corev1.PodRunning && p.Status.PodIP != ""
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady && c.Status == corev1.ConditionFalse {
			st.Ready = false
		}
	}
	return st
}

func (a *Allocator) tableEvent(obj any, deleted bool) {
	cm, ok := unwrap(obj).(*corev1.Secret)
	if !ok {
		return
	}
	n, count, ok := shardOf(cm)
	if !ok {
		return
	}
	key := types.NamespacedName{Namespace: cm.Namespace, Name: cm.Annotations[AnnoPool]}
	ps := a.pool(key)
	ps.mu.Lock()
	if deleted && ps.n != count || !deleted && !ps.adoptLocked(count) {
		ps.mu.Unlock()
		return
	}
	sh := &ps.shards[n]
	changed := false
	if deleted {
		if sh.exists && !newer(sh.rv, cm.ResourceVersion) {
			ps.setLocked(n, Table{}, "", false)
			changed = true
		}
	} else if !sh.exists || newer(cm.ResourceVersion, sh.rv) {
		t, err := Parse(cm.Data)
		if err == nil {
			ps.setLocked(n, t, cm.ResourceVersion, true)
			changed = true
		}
	}
	ps.mu.Unlock()
	if changed && a.o.Changed != nil {
		a.o.Changed(key, n)
	}
}

// newer reports whether resourceVersion a is newer than b. Kubernetes
// calls them opaque, but etcd's are increasing integers, and both copies
// come from the same object; anything unparsable counts as newer, so a
// write then meets a conflict and reads the table again.
func newer(a, b string) bool {
	x, err1 := strconv.ParseUint(a, 10, 64)
	y, err2 := strconv.ParseUint(b, 10, 64)
	if err1 != nil || err2 != nil {
		return a != b
	}
	return x > y
}

// setLocked makes t the newest known copy of shard n. Preconditions:
// ps.mu held.
func (ps *poolState) setLocked(n int, t Table, rv string, exists bool) {
	if t.Owners == nil {
		t.Owners = map[string]Owned{}
	}
	if t.Retired == nil {
		t.Retired = map[string]time.Time{}
	}
	if t.Records == nil {
		t.Records = map[string]json.RawMessage{}
	}
	sh := &ps.shards[n]
	old := sh.table.Owners
	sh.table, sh.rv, sh.exists = t, rv, exists
	sh.index = t.Index()
	a := ps.a
	a.ownMu.Lock()
	defer a.ownMu.Unlock()
	for o := range old {
		k := types.NamespacedName{Namespace: ps.key.Namespace, Name: o}
		if _, still := t.Owners[o]; still || a.owners[k] != ps.key || ps.holdsLocked(o) {
			continue
		}
		delete(a.owners, k)
	}
	for o := range t.Owners {
		a.owners[types.NamespacedName{Namespace: ps.key.Namespace, Name: o}] = ps.key
	}
}

// holdsLocked reports whether any shard names owner. Preconditions: ps.mu
// held.
func (ps *poolState) holdsLocked(owner string) bool {
	for i := range ps.shards {
		if _, ok := ps.shards[i].table.Owners[owner]; ok {
			return true
		}
	}
	return false
}

// ownedLocked returns what owner holds over all shards (ok false when no
// shard names it). Preconditions: ps.mu held.
func (ps *poolState) ownedLocked(owner string) (Owned, bool) {
	var out Owned
	found := false
	for i := range ps.shards {
		own, ok := ps.shards[i].table.Owners[owner]
		if !ok {
			continue
		}
		out.Pods = append(out.Pods, own.Pods...)
		if !found || (!own.At.IsZero() && own.At.Before(out.At)) {
			out.At = own.At
		}
		found = true
	}
	return out, found
}

// ownerLocked returns the owner of pod ("" retired; false when its shard
// does not name it). Preconditions: ps.mu held.
func (ps *poolState) ownerLocked(pod string) (string, bool) {
	if ps.n == 0 {
		return "", false
	}
	o, ok := ps.shards[ShardOf(pod, ps.n)].index[pod]
	return o, ok
}

// Find returns the pool whose table gives owner pods in namespace ns, and
// what it holds there.
func (a *Allocator) Find(ns, owner string) (types.NamespacedName, Owned, bool) {
	a.ownMu.Lock()
	pool, ok := a.owners[types.NamespacedName{Namespace: ns, Name: owner}]
	a.ownMu.Unlock()
	if !ok {
		return types.NamespacedName{}, Owned{}, false
	}
	ps := a.pool(pool)
	ps.mu.Lock()
	defer ps.mu.Unlock()
	own, ok := ps.ownedLocked(owner)
	if !ok {
		return types.NamespacedName{}, Owned{}, false
	}
	return pool, own, true
}

// Refresh reads every table of namespace ns from the API server (for a
// caller that must not miss an owner another process has just recorded).
func (a *Allocator) Refresh(ctx context.Context, ns string) error {
	var list corev1.SecretList
	if err := a.o.Reader.List(ctx, &list, client.InNamespace(ns), client.MatchingLabels{LabelTable: "true"}); err != nil {
		return fmt.Errorf("read allocation tables: %w: %v", errdefs.ErrUnavailable, err)
	}
	for i := range list.Items {
		a.tableEvent(&list.Items[i], false)
	}
	return nil
}

// InlineRecord is a record written inline with its owner's claim
// (Table.Records).
type InlineRecord struct {
	Pool  types.NamespacedName
	Shard int
	Owner string
	Raw   []byte
	// Mine says this process wrote it (a claim of its own).
	Mine bool
	// Crowded says it is one of the oldest records of a shard that holds
	// more than InlineRoom bytes of them, past which it should be moved
	// out (Table.crowded).
	Crowded bool
}

// poolsIn returns the pools of namespace ns the allocator knows.
func (a *Allocator) poolsIn(ns string) []*poolState {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []*poolState
	for k, ps := range a.pools {
		if k.Namespace == ns {
			out = append(out, ps)
		}
	}
	return out
}

// InlineRecords returns the inline records of the owners of namespace ns
// that match accepts, in every pool's table.
func (a *Allocator) InlineRecords(ns string, match func(owner string) bool) []InlineRecord {
	var out []InlineRecord
	for _, ps := range a.poolsIn(ns) {
		ps.mu.Lock()
		for i := range ps.shards {
			out = ps.shardRecordsLocked(out, i, match)
		}
		ps.mu.Unlock()
	}
	return out
}

// ShardRecords is InlineRecords for shard n of pool's table only: what a
// Changed call for that shard may have changed.
func (a *Allocator) ShardRecords(pool types.NamespacedName, n int, match func(owner string) bool) []InlineRecord {
	ps := a.pool(pool)
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if n < 0 || n >= len(ps.shards) {
		return nil
	}
	return ps.shardRecordsLocked(nil, n, match)
}

// shardRecordsLocked appends the inline records of shard n that match
// accepts to out, and forgets the records this process wrote there that
// are gone. Preconditions: ps.mu held.
func (ps *poolState) shardRecordsLocked(out []InlineRecord, n int, match func(owner string) bool) []InlineRecord {
	sh := &ps.shards[n]
	crowded := sh.table.crowded()
	for o, raw := range sh.table.Records {
		if match(o) {
			out = append(out, InlineRecord{Pool: ps.key, Shard: n, Owner: o, Raw: raw, Mine: sh.wrote[o] == string(raw), Crowded: crowded[o]})
		}
	}
	for o := range sh.wrote {
		if _, live := sh.table.Records[o]; !live {
			delete(sh.wrote, o)
		}
	}
	return out
}

// Holds reports whether owner holds pods in shard of pool's table, read
// from the API server (for a caller that must not act on a stale copy).
func (a *Allocator) Holds(ctx context.Context, pool types.NamespacedName, shard int, owner string) (bool, error) {
	ps := a.pool(pool)
	ps.mu.Lock()
	n := ps.n
	ps.mu.Unlock()
	if shard < 0 || shard >= n {
		return false, fmt.Errorf("allocation table of pool %s has no shard %d: %w", pool.Name, shard, errdefs.ErrInvalidArgument)
	}
	if err := a.refresh(ctx, pool, ps, shard); err != nil {
		return false, err
	}
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if ps.n != n {
		return false, nil
	}
	_, ok := ps.shards[shard].table.Owners[owner]
	return ok, nil
}

// Pod returns the allocator's view of a pool pod.
func (a *Allocator) Pod(pool types.NamespacedName, name string) (PodState, bool) {
	ps := a.pool(pool)
	ps.mu.Lock()
	defer ps.mu.Unlock()
	st, ok := ps.pods[name]
	return st, ok
}

// Owner returns the owner of a pod in its pool's table ("" and true for a
// retired pod; false when the table does not name it).
func (a *Allocator) Owner(pool types.NamespacedName, pod string) (string, bool) {
	ps := a.pool(pool)
	ps.mu.Lock()
	defer ps.mu.Unlock()
	return ps.ownerLocked(pod)
}

// Held returns the pods owner holds in pool's table.
func (a *Allocator) Held(pool types.NamespacedName, owner string) ([]string, time.Time) {
	ps := a.pool(pool)
	ps.mu.Lock()
	defer ps.mu.Unlock()
	o, _ := ps.ownedLocked(owner)
	return o.Pods, o.At
}

// Holding is one owner's pods in one pool.
type Holding struct {
	Pool  types.NamespacedName
	Owner string
	Owned
}

// Holdings returns every owner of namespace ns whose id match accepts,
// in every pool's table.
func (a *Allocator) Holdings(ns string, match func(owner string) bool) []Holding {
	var out []Holding
	for _, ps := range a.poolsIn(ns) {
		ps.mu.Lock()
		seen := map[string]bool{}
		for i := range ps.shards {
			for o := range ps.shards[i].table.Owners {
				if seen[o] || !match(o) {
					continue
				}
				seen[o] = true
				own, _ := ps.ownedLocked(o)
				out = append(out, Holding{Pool: ps.key, Owner: o, Owned: own})
			}
		}
		ps.mu.Unlock()
	}
	return out
}

// Counts are a pool's pods as the table and the pod cache see them.
type Counts struct {
	// Free are ready, unnamed pods of the current revision.
	Free int
	// Owned are pods the table gives to an owner.
	Owned int
}

// Count counts pool's pods.
func (a *Allocator) Count(pool types.NamespacedName) Counts {
	ps := a.pool(pool)
	rev := a.revision(pool)
	ps.mu.Lock()
	defer ps.mu.Unlock()
	var c Counts
	for name, st := range ps.pods {
		o, named := ps.ownerLocked(name)
		switch {
		case named && o != "":
			c.Owned++
		case !named && st.Ready && (rev == "" || st.Revision == rev):
			c.Free++
		}
	}
	return c
}

func (a *Allocator) revision(pool types.NamespacedName) string {
	if a.o.Revision == nil {
		return ""
	}
	return a.o.Revision(pool)
}

// Apply applies ch to pool's table and returns what it did. Concurrent
// calls for one pool are grouped into one write per shard touched (a warm
// claim, or a batch that one shard can serve, is one write); each write
// carries the resourceVersion of the shard it was computed from, and on a
// conflict that shard's part is computed again from the newer shard (its
// free pods sought from another shard), so an allocation can never hand
// out a pod that another writer has taken. Once the write is
// made Apply waits for it even if ctx ends (the result is the truth of
// the table); ctx bounds only the wait for the informers' first sync.
func (a *Allocator) Apply(ctx context.Context, pool types.NamespacedName, ch Change) (Result, error) {
	res, err := a.ApplyAll(ctx, pool, []Change{ch})
	if err != nil {
		return Result{}, err
	}
	return res[0], nil
}

// ApplyAll is Apply for several changes, applied in order in the same
// write.
func (a *Allocator) ApplyAll(ctx context.Context, pool types.NamespacedName, chs []Change) ([]Result, error) {
	if err := a.WaitSynced(ctx); err != nil {
		return nil, err
	}
	ps := a.pool(pool)
	rs := make([]*request, len(chs))
	ps.qmu.Lock()
	for i, ch := range chs {
		rs[i] = &request{ch: ch, done: make(chan struct{})}
		ps.queue = append(ps.queue, rs[i])
	}
	if !ps.running {
		ps.running = true
		go a.lead(pool, ps)
	}
	ps.qmu.Unlock()
	out := make([]Result, len(chs))
	for i, r := range rs {
		<-r.done
		if r.err != nil {
			return nil, r.err
		}
		out[i] = r.res
	}
	return out, nil
}

// lead commits the queued changes of a pool group by group until the
// queue is empty.
func (a *Allocator) lead(pool types.NamespacedName, ps *poolState) {
	for {
		ps.qmu.Lock()
		group := ps.queue
		ps.queue = nil
		if len(group) == 0 {
			ps.running = false
			ps.qmu.Unlock()
			return
		}
		ps.qmu.Unlock()
		res, written, err := a.commit(pool, ps, group)
		if a.o.Changed != nil {
			// Before the callers hear of it: what they do next sees it
			// (what was written even if a later round failed).
			for _, n := range written {
				a.o.Changed(pool, n)
			}
		}
		for i, r := range group {
			if err == nil {
				r.res = res[i]
			}
			r.err = err
			close(r.done)
		}
	}
}

// commitTimeout bounds one group commit, retries included.
const commitTimeout = 30 * time.Second

// shardWork is what one round of a group commit writes to one shard.
type shardWork struct {
	n     int
	idx   []int    // the group's changes with a part in this shard, in order
	parts []Change // their parts in this shard
	wants bool     // some part takes free pods
	base  Table
	next  Table
	rv    string
	exist bool
	res   []Result
	skip  bool // nothing to write: next is base
	newRV string
	err   error
}

// commit writes one group of changes. Each change is split by shard: the
// pods it adopts, releases or retires go to their own shards, and the
// free pods it wants are taken from the shards with free pods, starting
// at the pool's cursor (a batch from one shard when one has enough).
// Every shard touched is written, in parallel, computed from the newest
// known copy of the shard and guarded by its resourceVersion; a shard
// whose write conflicts is read again and its part computed again in the
// next round, and the free pods it was to give are sought again over all
// shards (starting from another one: the cursor moves), so a claim never
// gets a pod another writer took, and never waits on a full shard.
//
// The writes of one group are not one transaction: when a later round
// fails (the API server down, the commit timeout), the shards written
// before keep their part, and the caller gets the error. An owner then
// holds pods it was not told of, as when a process dies after its write:
// the servers' orphan sweep gives back the pods of sandbox owners that
// were never recorded, and the controller's next pass over a batch
// releases the pods the table gives it beyond its record.
//
// written are the shards written, each once (also when it fails).
func (a *Allocator) commit(pool types.NamespacedName, ps *poolState, group []*request) (_ []Result, written []int, _ error) {
	ctx, cancel := context.WithTimeout(context.Background(), commitTimeout)
	defer cancel()
	if err := a.table(ctx, pool, ps); err != nil {
		return nil, written, err
	}
	g := a.split(pool, ps, group)
	for attempt := 0; ; attempt++ {
		work, err := a.plan(pool, ps, group, g.fixed, g.want)
		if err != nil {
			return nil, g.written, err
		}
		if len(work) == 0 {
			break
		}
		wrote := g.write(ctx, work)
		conflict, err := g.collect(ctx, work)
		if err != nil {
			return nil, g.written, err
		}
		if !wrote {
			// Nothing changed: a next round would plan the same.
			break
		}
		if !conflict && settled(group, g.fixed, g.want) {
			// Everything is written and every want met: a next round
			// would find nothing to do (and cost a look at every pod).
			break
		}
		if err := g.pause(ctx, conflict, attempt); err != nil {
			return nil, g.written, err
		}
	}
	g.held()
	return g.out, g.written, nil
}

// groupCommit is the state of one commit, across its rounds: what of the
// group is still to write (fixed, want) and what was done (out, written).
// Only the commit's goroutine uses it; the pool's copies it reads and
// sets are under ps.mu.
type groupCommit struct {
	a     *Allocator
	pool  types.NamespacedName
	ps    *poolState
	group []*request
	count int // the table's shards
	// fixed[s][i] is the part of change i in shard s that is not a want
	// and is not yet written; want[i] the free pods change i still wants.
	fixed   []map[int]Change
	want    []int
	out     []Result
	written []int
}

// split splits each change of group by shard: the pods it adopts,
// releases or retires go to their own shards, a ReleaseAll or DropRecord
// to every shard where the owner has pods or a record. Its wants are not
// split here: plan spreads them over the shards with free pods, round by
// round.
func (a *Allocator) split(pool types.NamespacedName, ps *poolState, group []*request) *groupCommit {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	g := &groupCommit{a: a, pool: pool, ps: ps, group: group, count: ps.n,
		fixed: make([]map[int]Change, ps.n), want: make([]int, len(group)), out: make([]Result, len(group))}
	for s := range g.fixed {
		g.fixed[s] = map[int]Change{}
	}
	edit := func(s, i int, f func(*Change)) {
		ch, ok := g.fixed[s][i]
		if !ok {
			ch = Change{Owner: group[i].ch.Owner}
		}
		f(&ch)
		g.fixed[s][i] = ch
	}
	for i, r := range group {
		ch := r.ch
		g.want[i] = ch.Want
		for _, p := range ch.Adopt {
			edit(ShardOf(p, g.count), i, func(c *Change) { c.Adopt = append(c.Adopt, p) })
		}
		for _, p := range ch.Release {
			edit(ShardOf(p, g.count), i, func(c *Change) { c.Release = append(c.Release, p) })
		}
		for _, p := range ch.Retire {
			edit(ShardOf(p, g.count), i, func(c *Change) { c.Retire = append(c.Retire, p) })
		}
		if ch.ReleaseAll && ch.Owner != "" {
			for s := range ps.shards {
				if _, ok := ps.shards[s].table.Owners[ch.Owner]; ok {
					edit(s, i, func(c *Change) { c.ReleaseAll = true })
				}
			}
		}
		if ch.DropRecord != nil && ch.Owner != "" {
			for s := range ps.shards {
				if _, ok := ps.shards[s].table.Records[ch.Owner]; ok {
					edit(s, i, func(c *Change) { c.DropRecord = ch.DropRecord })
				}
			}
		}
	}
	return g
}

// write makes one round's writes, one per shard, in parallel; it reports
// whether there was any (a round may find every shard's next copy to be
// its current one).
func (g *groupCommit) write(ctx context.Context, work []*shardWork) (wrote bool) {
	var wg sync.WaitGroup
	for _, w := range work {
		if w.skip {
			continue
		}
		wrote = true
		wg.Go(func() { w.newRV, w.err = g.a.write(ctx, g.pool, w.n, g.count, w.next, w.rv, w.exist) })
	}
	wg.Wait()
	return wrote
}

// collect takes in a round's writes, in shard order: a shard written (or
// skipped) gives its parts' results; a conflict reads the shard again for
// the next round; any other error ends the commit (the shards taken in
// before it stay written).
func (g *groupCommit) collect(ctx context.Context, work []*shardWork) (conflict bool, _ error) {
	for _, w := range work {
		switch {
		case w.err == nil:
			if !w.skip {
				g.stored(w)
			}
			for k, i := range w.idx {
				delete(g.fixed[w.n], i)
				g.out[i].Pods = append(g.out[i].Pods, w.res[k].Pods...)
				g.out[i].Retired = append(g.out[i].Retired, w.res[k].Retired...)
				g.out[i].Recorded = g.out[i].Recorded || w.res[k].Recorded
				g.out[i].Dropped = g.out[i].Dropped || w.res[k].Dropped
				g.want[i] -= len(w.res[k].Pods)
			}
		case apierrors.IsConflict(w.err) || apierrors.IsAlreadyExists(w.err) || apierrors.IsNotFound(w.err):
			// Someone else wrote the shard first: read what they
			// wrote, and seek free pods elsewhere first.
			conflict = true
			if w.wants && g.count > 1 {
				g.ps.mu.Lock()
				g.ps.cursor = (w.n + 1 + rand.IntN(g.count-1)) % g.count
				g.ps.mu.Unlock()
			}
			if err := g.a.refresh(ctx, g.pool, g.ps, w.n); err != nil {
				return conflict, err
			}
		default:
			return conflict, fmt.Errorf("write allocation table of pool %s: %w: %v", g.pool.Name, errdefs.ErrUnavailable, w.err)
		}
	}
	return conflict, nil
}

// stored notes shard w.n written: the inline records it added are this
// process's (InlineRecords), and the copy written is the shard's newest
// unless the informer already delivered a newer one.
func (g *groupCommit) stored(w *shardWork) {
	if !slices.Contains(g.written, w.n) {
		g.written = append(g.written, w.n)
	}
	g.ps.mu.Lock()
	defer g.ps.mu.Unlock()
	sh := &g.ps.shards[w.n]
	for o, raw := range w.next.Records {
		if _, had := w.base.Records[o]; !had {
			if sh.wrote == nil {
				sh.wrote = map[string]string{}
			}
			sh.wrote[o] = string(raw)
		}
	}
	if !sh.exists || !newer(sh.rv, w.newRV) {
		g.ps.setLocked(w.n, w.next, w.newRV, true)
	}
}

// pause waits between rounds after repeated conflicts (a random backoff
// that grows with the rounds), and ends the commit when its time is up.
func (g *groupCommit) pause(ctx context.Context, conflict bool, attempt int) error {
	if conflict && attempt > 2 {
		select {
		case <-ctx.Done():
			return fmt.Errorf("allocation table of pool %s: %w: too much contention", g.pool.Name, errdefs.ErrUnavailable)
		case <-time.After(time.Duration(rand.IntN(1000*min(attempt, 20))) * time.Microsecond):
		}
	}
	if ctx.Err() != nil {
		return fmt.Errorf("allocation table of pool %s: %w: too much contention", g.pool.Name, errdefs.ErrUnavailable)
	}
	return nil
}

// held sets each owner's result's Held: every pod the table gives it
// now, in all the shards.
func (g *groupCommit) held() {
	g.ps.mu.Lock()
	defer g.ps.mu.Unlock()
	for i, r := range g.group {
		if r.ch.Owner != "" {
			own, _ := g.ps.ownedLocked(r.ch.Owner)
			g.out[i].Held = own.Pods
		}
	}
}

// settled reports whether a group commit has nothing left to do: no fixed
// part unwritten and no want unmet.
func settled(group []*request, fixed []map[int]Change, want []int) bool {
	for _, f := range fixed {
		if len(f) > 0 {
			return false
		}
	}
	for i, w := range want {
		if w > 0 && group[i].ch.Owner != "" {
			return false
		}
	}
	return true
}

// plan computes one round of a group commit: for every shard with
// something to do (a fixed part not yet written, or free pods to give),
// the shard's next copy. want[i] free pods are still to be found for
// change i; they come from the shard at the cursor when it has them all,
// else from the first shard after it that has them all, else from as
// many shards as it takes. A shard whose next copy is its current one
// needs no write (skip).
func (a *Allocator) plan(pool types.NamespacedName, ps *poolState, group []*request, fixed []map[int]Change, want []int) ([]*shardWork, error) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	count := len(fixed)
	if ps.n != count {
		return nil, fmt.Errorf("allocation table of pool %s: %w: it was made again with %d shards meanwhile", pool.Name, errdefs.ErrUnavailable, ps.n)
	}
	free := a.freeLocked(pool, ps)
	avail := make([]int, count)
	for s := range free {
		avail[s] = len(free[s])
	}
	var wants []map[int]int
	wants, ps.cursor = spread(avail, ps.cursor, group, want)
	pods := ps.pods
	gone := func(p string) bool { _, ok := pods[p]; return !ok }
	state := func(p string) PodState { return pods[p] }
	now := time.Now().UTC()
	var work []*shardWork
	for s := range count {
		if len(fixed[s]) == 0 && len(wants[s]) == 0 {
			continue
		}
		w := &shardWork{n: s}
		for i := range group {
			f, hasFixed := fixed[s][i]
			k := wants[s][i]
			if !hasFixed && k == 0 {
				continue
			}
			if !hasFixed {
				f = Change{Owner: group[i].ch.Owner}
			}
			f.Want = k
			if k > 0 {
				f.Record = group[i].ch.Record
			}
			w.wants = w.wants || k > 0
			w.idx = append(w.idx, i)
			w.parts = append(w.parts, f)
		}
		sh := &ps.shards[s]
		w.base, w.rv, w.exist = sh.table.Clone(), sh.rv, sh.exists
		w.next = w.base.Clone()
		w.res = w.next.apply(w.parts, free[s], gone, state, now)
		// A part that took free pods changed the shard; else compare
		// (a whole encoding of both).
		took := slices.ContainsFunc(w.res, func(r Result) bool { return len(r.Pods) > 0 })
		w.skip = !took && (w.exist && w.next.equal(w.base) || !w.exist && len(w.next.Owners) == 0 && len(w.next.Retired) == 0)
		work = append(work, w)
	}
	return work, nil
}

// spread decides how many free pods each claim of group (want[i] of
// them) takes from which shard, given the free pods of each shard
// (avail, used up as it goes) and the shard to start at (cursor): the
// whole group from one shard when one can serve it, else each claim
// from one shard when one can serve it, else from several. It returns,
// per shard, the pods each claim takes, and the cursor for the next
// plan (a shard with free pods left).
func spread(avail []int, cursor int, group []*request, want []int) ([]map[int]int, int) {
	count := len(avail)
	total := 0
	for i, w := range want {
		if w > 0 && group[i].ch.Owner != "" {
			total += w
		}
	}
	if total > 0 && avail[cursor] < total {
		for d := range count {
			if s := (cursor + d) % count; avail[s] >= total {
				cursor = s
				break
			}
		}
	}
	wants := make([]map[int]int, count)
	for i, w := range want {
		if w <= 0 || group[i].ch.Owner == "" {
			continue
		}
		take := func(s, k int) {
			if wants[s] == nil {
				wants[s] = map[int]int{}
			}
			wants[s][i] += k
			avail[s] -= k
			w -= k
		}
		for d := range count {
			if s := (cursor + d) % count; avail[s] >= w {
				take(s, w)
				cursor = s
				break
			}
		}
		for d := 0; d < count && w > 0; d++ {
			if s := (cursor + d) % count; avail[s] > 0 {
				take(s, min(w, avail[s]))
			}
		}
	}
	if avail[cursor] == 0 {
		for d := range count {
			if s := (cursor + d) % count; avail[s] > 0 {
				cursor = s
				break
			}
		}
	}
	return wants, cursor
}

// Ensure creates the shards of pool's table, empty, unless they exist.
// The pool controller calls it when it first sees the pool, so that the
// table is made with the pool's fill and the first allocation from the
// pool is an update like every later one, not a create on the delivery
// path. A new table gets ShardsFor(Options.Size) shards; an existing one
// keeps its count.
func (a *Allocator) Ensure(ctx context.Context, pool types.NamespacedName) error {
	if err := a.WaitSynced(ctx); err != nil {
		return err
	}
	ps := a.pool(pool)
	if err := a.table(ctx, pool, ps); err != nil {
		return err
	}
	ps.mu.Lock()
	count := ps.n
	ps.mu.Unlock()
	for n := range count {
		ps.mu.Lock()
		exists := ps.n == count && ps.shards[n].exists
		ps.mu.Unlock()
		if exists {
			continue
		}
		rv, err := a.write(ctx, pool, n, count, Table{}, "", false)
		switch {
		case err == nil:
			ps.mu.Lock()
			if ps.n == count && !ps.shards[n].exists {
				ps.setLocked(n, Table{}, rv, true)
			}
			ps.mu.Unlock()
		case apierrors.IsAlreadyExists(err):
			// Another writer made it first (a moat server's claim, or a
			// group commit of this process): read what it wrote.
			if err := a.refresh(ctx, pool, ps, n); err != nil {
				return err
			}
		default:
			return fmt.Errorf("create allocation table of pool %s: %w: %v", pool.Name, errdefs.ErrUnavailable, err)
		}
	}
	return nil
}

// table makes sure the allocator knows pool's table and its number of
// shards: known from the informer, else read from shard 0, else made by
// creating shard 0 with ShardsFor(Options.Size) (every allocator that
// finds shard 0 made adopts its count).
func (a *Allocator) table(ctx context.Context, pool types.NamespacedName, ps *poolState) error {
	for attempt := 0; attempt < 5; attempt++ {
		ps.mu.Lock()
		known := ps.n > 0 && ps.knownLocked()
		ps.mu.Unlock()
		if known {
			return nil
		}
		if err := a.refresh(ctx, pool, ps, 0); err != nil {
			return err
		}
		ps.mu.Lock()
		known = ps.n > 0 && ps.shards[0].exists
		ps.mu.Unlock()
		if known {
			return nil
		}
		size := 0
		if a.o.Size != nil {
			size = a.o.Size(pool)
		}
		count := ShardsFor(size)
		rv, err := a.write(ctx, pool, 0, count, Table{}, "", false)
		switch {
		case err == nil:
			ps.mu.Lock()
			if ps.adoptLocked(count) && !ps.shards[0].exists {
				ps.setLocked(0, Table{}, rv, true)
			}
			ps.mu.Unlock()
		case apierrors.IsAlreadyExists(err):
			// Made by another allocator a moment ago: read it.
		default:
			return fmt.Errorf("create allocation table of pool %s: %w: %v", pool.Name, errdefs.ErrUnavailable, err)
		}
	}
	return fmt.Errorf("allocation table of pool %s: %w: its shard 0 keeps changing", pool.Name, errdefs.ErrUnavailable)
}

// freeLocked lists the pool's free pods by shard: ready, of the current
// revision, usable, not named by their shard. Preconditions: ps.mu held.
func (a *Allocator) freeLocked(pool types.NamespacedName, ps *poolState) [][]string {
	rev := a.revision(pool)
	out := make([][]string, ps.n)
	if ps.n == 0 {
		return out
	}
	usable := func(string) bool { return true }
	if a.o.Usable != nil {
		usable = a.o.Usable(pool)
	}
	for name, st := range ps.pods {
		if !st.Ready || (rev != "" && st.Revision != rev) {
			continue
		}
		s := ShardOf(name, ps.n)
		if _, named := ps.shards[s].index[name]; named {
			continue
		}
		if !usable(name) {
			continue
		}
		out[s] = append(out[s], name)
	}
	return out
}

// write stores t as shard n of pool's table of count shards: an update
// guarded by rv, or a create.
func (a *Allocator) write(ctx context.Context, pool types.NamespacedName, n, count int, t Table, rv string, exists bool) (string, error) {
	cm := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: pool.Namespace, Name: ShardName(pool.Name, n), ResourceVersion: rv,
			Labels:      map[string]string{LabelTable: "true", LabelPoolData: "table"},
			Annotations: map[string]string{AnnoPool: pool.Name, AnnoShard: strconv.Itoa(n), AnnoShards: strconv.Itoa(count)},
		},
		Data: t.Encode(),
	}
	var err error
	if exists {
		err = a.o.Client.Update(ctx, cm)
	} else {
		cm.ResourceVersion = ""
		err = a.o.Client.Create(ctx, cm)
	}
	return cm.ResourceVersion, err
}

// refresh reads shard n of pool's table from the API server.
// A copy it makes the newest is a change like a table event's (Changed):
// the informer's event of the same copy then changes nothing.
func (a *Allocator) refresh(ctx context.Context, pool types.NamespacedName, ps *poolState, n int) error {
	set, err := a.readShard(ctx, pool, ps, n)
	if set && a.o.Changed != nil {
		a.o.Changed(pool, n)
	}
	return err
}

// readShard is refresh's read; set says it made the copy read the newest.
func (a *Allocator) readShard(ctx context.Context, pool types.NamespacedName, ps *poolState, n int) (set bool, _ error) {
	var cm corev1.Secret
	err := a.o.Reader.Get(ctx, types.NamespacedName{Namespace: pool.Namespace, Name: ShardName(pool.Name, n)}, &cm)
	ps.mu.Lock()
	defer ps.mu.Unlock()
	switch {
	case apierrors.IsNotFound(err):
		if n < ps.n {
			ps.setLocked(n, Table{}, "", false)
			return true, nil
		}
		return false, nil
	case err != nil:
		return false, fmt.Errorf("read allocation table of pool %s: %w: %v", pool.Name, errdefs.ErrUnavailable, err)
	}
	_, count, ok := shardOf(&cm)
	t, err := Parse(cm.Data)
	if err != nil || !ok {
		return false, fmt.Errorf("pool %s: %w: allocation table shard %s is malformed: %v", pool.Name, errdefs.ErrInternal, cm.Name, err)
	}
	if !ps.adoptLocked(count) {
		return false, fmt.Errorf("allocation table of pool %s: %w: shard %d has %d shards, the table %d", pool.Name, errdefs.ErrUnavailable, n, count, ps.n)
	}
	// The informer may have delivered a still newer copy meanwhile.
	if sh := &ps.shards[n]; !sh.exists || newer(cm.ResourceVersion, sh.rv) {
		ps.setLocked(n, t, cm.ResourceVersion, true)
		return true, nil
	}
	return false, nil
}
