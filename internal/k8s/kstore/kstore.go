// Package kstore is a store.Store kept in the Kubernetes API server: the
// records of `moat serve --runtime kubernetes` (sandboxes, pools, API keys
// and tenants, ...), so that the server keeps no state of its own and its
// replicas share every record. Records are Secrets (they hold agent and
// access tokens) in the server's namespace, labelled with its scope:
//
//   - a record first written by Put is one Secret (data "key" and
//     "record");
//   - the records of one PutMany are one Secret together (data "records",
//     a JSON object of key -> record): a batch of sandboxes costs one
//     write; a later Put or Delete of one of them rewrites that Secret.
//
// Reads come from an informer cache. Every write carries the
// resourceVersion it was based on; Update never creates a record, so a
// record another replica deleted meanwhile stays deleted (the write
// answers ErrNotFound). Changes made by other processes are reported to
// Watch.
//
// Records of one bucket can also live inline elsewhere (Options.Inline):
// a claim writes its sandbox's record into the same write of its pool's
// allocation table shard as the claim itself, so that the claim and its
// record are one write. The store reads them as its own (a record of its
// own Secret wins). A record stays inline until its first write, which
// moves it into a Secret of its own (recordName) with the new value: it
// creates that Secret, then drops the inline copy. Records whose home is
// short of room (InlineRecord.Crowded) are moved the same way off the
// caller's path. A record never written again costs no write beyond its
// claim's, and goes with its owner's release. A record whose owner was
// released meanwhile (the sandbox was deleted) is not moved: its own
// copy, if made, is deleted again, so a move never brings a deleted
// record back.
package kstore

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sbv1 "github.com/moat-sandbox/moat/api/v1alpha1"
	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/k8s/kclient"
	"github.com/moat-sandbox/moat/internal/store"
)

// Labels of the store's Secrets.
const (
	// LabelStore is the scope of the server whose record a Secret is.
	LabelStore = "moat." + sbv1.Group + "/store"
	// LabelBucket is its bucket.
	LabelBucket = "moat." + sbv1.Group + "/bucket"
	keyData     = "key"
	recordData  = "record"
	groupData   = "records"
)

// MaxGroupBytes bounds the records of one Secret written by PutMany
// (the API server refuses objects above about 1.5 MiB, Secrets above
// 1 MiB): larger PutManys are split, and are atomic per part only.
const MaxGroupBytes = 512 << 10

// Options configure a Store.
type Options struct {
	// Namespace holds the Secrets.
	Namespace string
	// Scope separates the records of servers sharing a namespace (the
	// server's --bridge name, as for its sandboxes).
	Scope string
	// SyncTimeout bounds the wait for the informer's first list (default
	// 60s).
	SyncTimeout time.Duration
	// Inline is where records of InlineBucket may live before they have
	// a Secret of their own. Optional.
	Inline       Inline
	InlineBucket string
	// MoveAfter is how long a crowded inline record stays inline before
	// the store moves it (moves made together share their table writes).
	// Default 200ms.
	MoveAfter time.Duration
}

// Inline is a second home of the records of one bucket, in parts (the
// shards of the pools' allocation tables): a change of one part is read
// again alone (Store.InlineChanged), so that a change costs the records
// of its part, not all of them.
type Inline interface {
	// Records lists the inline records of part (nil: of every part), by
	// key.
	Records(part any) map[string]InlineRecord
	// Drop removes key's inline copy if it is still rec, and reports
	// whether its record is still live (its owner still holds its claim),
	// as the API server has it.
	Drop(ctx context.Context, key string, rec InlineRecord) (live bool, err error)
}

// InlineRecord is one inline record.
type InlineRecord struct {
	Raw []byte
	// From is where it is, for Drop: its part, a comparable value.
	From any
	// Mine says this process wrote it (it is not reported to Watch).
	Mine bool
	// Crowded says its home is short of room: the store moves it to a
	// Secret of its own without waiting for a write.
	Crowded bool
}

// inlineSettle is how long an inline record that vanished with no own
// copy seen is still shown: its move's own copy may be on its way.
const inlineSettle = 2 * time.Second

// Store is a store.Store and store.Watcher in the API server. It is safe
// for concurrent use.
type Store struct {
	c    client.Client
	o    Options
	stop context.CancelFunc
	done chan struct{}

	mu sync.Mutex
	// objects are the store's Secrets as last seen (by name); index maps
	// bucket -> key -> the Secret holding it.
	objects map[string]*object
	index   map[string]map[string]string
	// watchers are Watch callbacks by bucket.
	watchers map[string]map[int]func(string, []byte)
	nextW    int
	// mine is what this process last wrote of each record (bucket NUL
	// key -> record, deletedMark after a delete), set before the write:
	// an informer event that shows it is this process's own change, even
	// when it arrives before the write returns, and is not reported.
	mine map[string]string
	// inline are the inline records of Options.InlineBucket as last
	// listed, parts their keys by part (InlineRecord.From), crowded the
	// keys of the crowded ones; moving are those being moved, seen when
	// each was first listed.
	inline  map[string]InlineRecord
	parts   map[any]map[string]bool
	crowded map[string]bool
	moving  map[string]bool
	seen    map[string]time.Time
	kick    chan struct{}
}

const deletedMark = "\x00deleted"

func mineKey(bucket, key string) string { return bucket + "\x00" + key }

// claimLocked notes that this process is about to write raw (nil: delete)
// as record key. Preconditions: s.mu held.
func (s *Store) claimLocked(bucket, key string, raw []byte) {
	v := deletedMark
	if raw != nil {
		v = string(raw)
	}
	s.mine[mineKey(bucket, key)] = v
}

func (s *Store) claim(bucket, key string, raw []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.claimLocked(bucket, key, raw)
}

// object is one Secret: a single record or a group.
type object struct {
	name    string
	bucket  string
	rv      string
	group   bool
	records map[string][]byte
}

var (
	_ store.Store   = (*Store)(nil)
	_ store.Watcher = (*Store)(nil)
)

// New connects to the API server and loads the store.
func New(rc *rest.Config, o Options) (*Store, error) {
	if o.Namespace == "" || o.Scope == "" {
		return nil, fmt.Errorf("kstore: namespace and scope are required: %w", errdefs.ErrInvalidArgument)
	}
	if o.SyncTimeout == 0 {
		o.SyncTimeout = 60 * time.Second
	}
	if o.MoveAfter == 0 {
		o.MoveAfter = 200 * time.Millisecond
	}
	c, err := client.New(rc, client.Options{Scheme: kclient.Scheme()})
	if err != nil {
		return nil, fmt.Errorf("kstore: %w: %v", errdefs.ErrUnavailable, err)
	}
	inf, err := cache.New(rc, cache.Options{
		Scheme:            kclient.Scheme(),
		DefaultNamespaces: map[string]cache.Config{o.Namespace: {}},
		ByObject: map[client.Object]cache.ByObject{
			&corev1.Secret{}: {Label: labels.SelectorFromSet(labels.Set{LabelStore: o.Scope})},
		},
	})
	if err != nil {
		return nil, fmt.Errorf("kstore: %w: %v", errdefs.ErrUnavailable, err)
	}
	s := &Store{c: c, o: o, objects: map[string]*object{}, index: map[string]map[string]string{}, watchers: map[string]map[int]func(string, []byte){}, mine: map[string]string{},
		inline: map[string]InlineRecord{}, parts: map[any]map[string]bool{}, crowded: map[string]bool{}, moving: map[string]bool{}, seen: map[string]time.Time{},
		kick: make(chan struct{}, 1)}
	ctx, cancel := context.WithCancel(context.Background())
	s.stop, s.done = cancel, make(chan struct{})
	inf2, err := inf.GetInformer(ctx, &corev1.Secret{})
	if err != nil {
		cancel()
		return nil, fmt.Errorf("kstore: %w", err)
	}
	reg, err := inf2.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { s.event(obj, false) },
		UpdateFunc: func(_, obj any) { s.event(obj, false) },
		DeleteFunc: func(obj any) { s.event(obj, true) },
	})
	if err != nil {
		cancel()
		return nil, fmt.Errorf("kstore: %w", err)
	}
	go func() {
		defer close(s.done)
		if o.Inline != nil {
			go s.mover(ctx)
		}
		inf.Start(ctx)
	}()
	deadline := time.Now().Add(o.SyncTimeout)
	for !reg.HasSynced() {
		if time.Now().After(deadline) {
			s.Close()
			return nil, fmt.Errorf("kstore: %w: the record informer did not sync in %v", errdefs.ErrUnavailable, o.SyncTimeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
	s.InlineChanged(nil) // the inline records there are already
	return s, nil
}

// Close stops the informer.
func (s *Store) Close() error {
	s.stop()
	<-s.done
	return nil
}

// newer reports whether resourceVersion a is newer than b (see
// alloc's newer: etcd's are increasing integers).
func newer(a, b string) bool {
	x, err1 := strconv.ParseUint(a, 10, 64)
	y, err2 := strconv.ParseUint(b, 10, 64)
	if err1 != nil || err2 != nil {
		return a != b
	}
	return x > y
}

// decode reads a store Secret.
func decode(sec *corev1.Secret) (*object, bool) {
	b := sec.Labels[LabelBucket]
	if b == "" {
		return nil, false
	}
	o := &object{name: sec.Name, bucket: b, rv: sec.ResourceVersion, records: map[string][]byte{}}
	if raw, ok := sec.Data[groupData]; ok {
		o.group = true
		var m map[string]json.RawMessage
		if json.Unmarshal(raw, &m) != nil {
			return nil, false
		}
		for k, v := range m {
			o.records[k] = v
		}
		return o, true
	}
	k := string(sec.Data[keyData])
	if k == "" {
		return nil, false
	}
	o.records[k] = sec.Data[recordData]
	return o, true
}

// event applies an informer event if it is newer than what the store
// has, and reports the records it changed to the watchers.
func (s *Store) event(obj any, deleted bool) {
	if t, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	sec, ok := obj.(*corev1.Secret)
	if !ok {
		return
	}
	var notify []func()
	s.mu.Lock()
	cur := s.objects[sec.Name]
	switch {
	case deleted:
		if cur != nil && !newer(cur.rv, sec.ResourceVersion) {
			notify = s.setLocked(sec.Name, nil)
		}
	case cur == nil || newer(sec.ResourceVersion, cur.rv):
		if o, ok := decode(sec); ok {
			notify = s.setLocked(sec.Name, o)
		}
	}
	s.mu.Unlock()
	for _, f := range notify {
		f()
	}
}

// setLocked makes o the state of Secret name (nil: gone) and returns the
// watcher calls for the records that changed. Preconditions: s.mu held.
func (s *Store) setLocked(name string, o *object) []func() {
	old := s.objects[name]
	var calls []func()
	report := func(bucket, key string, raw []byte) {
		if in, ok := s.inlineLocked(bucket, key); ok {
			if raw == nil {
				raw = in.Raw // the inline copy shows again
			} else if string(raw) == string(in.Raw) {
				return // the inline copy moved: nothing changed
			}
		}
		calls = append(calls, s.reportLocked(bucket, key, raw)...)
	}
	if old != nil {
		for k, raw := range old.records {
			if o == nil || o.records[k] == nil {
				if s.index[old.bucket][k] == name {
					delete(s.index[old.bucket], k)
					report(old.bucket, k, nil)
				}
			} else if string(o.records[k]) != string(raw) {
				report(o.bucket, k, o.records[k])
			}
		}
	}
	if o == nil {
		delete(s.objects, name)
		return calls
	}
	s.objects[name] = o
	if s.index[o.bucket] == nil {
		s.index[o.bucket] = map[string]string{}
	}
	for k, raw := range o.records {
		if old == nil || old.records[k] == nil {
			report(o.bucket, k, raw)
		}
		s.index[o.bucket][k] = name
	}
	return calls
}

// noteLocked records a write of this process (no watcher is told).
// Preconditions: s.mu held.
func (s *Store) noteLocked(name string, o *object) {
	if cur := s.objects[name]; cur != nil && o != nil && newer(cur.rv, o.rv) {
		return // an event already brought a newer copy
	}
	w := s.watchers
	s.watchers = nil
	s.setLocked(name, o)
	s.watchers = w
}

func recordName(scope, bucket, key string) string {
	h := sha256.Sum256([]byte(scope + "\x00" + bucket + "\x00" + key))
	return "moat-rec-" + hex.EncodeToString(h[:16])
}

func groupName() string {
	b := make([]byte, 12)
	rand.Read(b)
	return "moat-grp-" + hex.EncodeToString(b)
}

func (s *Store) labels(bucket string) map[string]string {
	return map[string]string{LabelStore: s.o.Scope, LabelBucket: bucket}
}

func unavailable(what string, err error) error {
	return fmt.Errorf("kstore: %s: %w: %v", what, errdefs.ErrUnavailable, err)
}

// secretOf renders o as a Secret.
func (s *Store) secretOf(o *object) (*corev1.Secret, error) {
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: s.o.Namespace, Name: o.name, ResourceVersion: o.rv, Labels: s.labels(o.bucket)}}
	if o.group {
		m := make(map[string]json.RawMessage, len(o.records))
		for k, v := range o.records {
			m[k] = v
		}
		b, err := json.Marshal(m)
		if err != nil {
			return nil, err
		}
		sec.Data = map[string][]byte{groupData: b}
		return sec, nil
	}
	for k, v := range o.records {
		sec.Data = map[string][]byte{keyData: []byte(k), recordData: v}
	}
	return sec, nil
}

// Put implements store.Store: an existing record is rewritten where it is,
// a new one gets a Secret of its own.
func (s *Store) Put(bucket, key string, v any) error {
	raw, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode %s/%s: %w", bucket, key, err)
	}
	ctx := context.Background()
	s.mu.Lock()
	name, known := s.index[bucket][key]
	in, inline := s.inlineLocked(bucket, key)
	s.mu.Unlock()
	s.claim(bucket, key, raw)
	if !known && inline {
		return s.move(ctx, key, raw, in, true)
	}
	if !known {
		o := &object{name: recordName(s.o.Scope, bucket, key), bucket: bucket, records: map[string][]byte{key: raw}}
		sec, err := s.secretOf(o)
		if err != nil {
			return err
		}
		err = s.c.Create(ctx, sec)
		if err == nil {
			o.rv = sec.ResourceVersion
			s.mu.Lock()
			s.noteLocked(o.name, o)
			s.mu.Unlock()
			return nil
		}
		if !apierrors.IsAlreadyExists(err) {
			return unavailable("create "+bucket+"/"+key, err)
		}
		// Written by another process a moment ago: update it.
		if err := s.refresh(ctx, o.name); err != nil {
			return err
		}
		name = o.name
	}
	return s.rewrite(ctx, name, bucket, key, raw)
}

// Update implements store.Store: the record must exist (ErrNotFound if
// it does not, or if another process deleted it meanwhile: it is not
// made again).
func (s *Store) Update(bucket, key string, v any) error {
	raw, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode %s/%s: %w", bucket, key, err)
	}
	s.mu.Lock()
	name, known := s.index[bucket][key]
	in, inline := s.inlineLocked(bucket, key)
	s.mu.Unlock()
	if !known && inline {
		s.claim(bucket, key, raw)
		return s.move(context.Background(), key, raw, in, true)
	}
	if !known {
		return fmt.Errorf("%s/%s: %w", bucket, key, errdefs.ErrNotFound)
	}
	s.claim(bucket, key, raw)
	return s.rewrite(context.Background(), name, bucket, key, raw)
}

// rewrite replaces record key in Secret name.
func (s *Store) rewrite(ctx context.Context, name, bucket, key string, raw []byte) error {
	return s.update(ctx, name, func(o *object) error {
		if _, ok := o.records[key]; !ok {
			return fmt.Errorf("%s/%s: %w (deleted meanwhile)", bucket, key, errdefs.ErrNotFound)
		}
		o.records[key] = raw
		return nil
	})
}

// update applies edit to a copy of Secret name and writes it with its
// resourceVersion, reading it again after a conflict. An edit that
// leaves no record deletes the Secret.
func (s *Store) update(ctx context.Context, name string, edit func(*object) error) error {
	for attempt := 0; attempt < 100; attempt++ {
		s.mu.Lock()
		cur := s.objects[name]
		if cur == nil {
			s.mu.Unlock()
			return fmt.Errorf("record %s: %w", name, errdefs.ErrNotFound)
		}
		o := &object{name: name, bucket: cur.bucket, rv: cur.rv, group: cur.group, records: maps.Clone(cur.records)}
		s.mu.Unlock()
		if err := edit(o); err != nil {
			return err
		}
		var err error
		if len(o.records) == 0 {
			sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: s.o.Namespace, Name: name}}
			err = s.c.Delete(ctx, sec, client.Preconditions{ResourceVersion: &o.rv})
			if err == nil || apierrors.IsNotFound(err) {
				s.mu.Lock()
				s.noteLocked(name, nil)
				s.mu.Unlock()
				return nil
			}
		} else {
			var sec *corev1.Secret
			if sec, err = s.secretOf(o); err != nil {
				return err
			}
			if err = s.c.Update(ctx, sec); err == nil {
				o.rv = sec.ResourceVersion
				s.mu.Lock()
				s.noteLocked(name, o)
				s.mu.Unlock()
				return nil
			}
		}
		if !apierrors.IsConflict(err) && !apierrors.IsNotFound(err) {
			return unavailable("write "+name, err)
		}
		if err := s.refresh(ctx, name); err != nil {
			return err
		}
	}
	return fmt.Errorf("kstore: write %s: %w: too much contention", name, errdefs.ErrUnavailable)
}

// refresh reads Secret name from the API server.
func (s *Store) refresh(ctx context.Context, name string) error {
	var sec corev1.Secret
	err := s.c.Get(ctx, types.NamespacedName{Namespace: s.o.Namespace, Name: name}, &sec)
	if apierrors.IsNotFound(err) {
		s.mu.Lock()
		notify := s.setLocked(name, nil)
		s.mu.Unlock()
		for _, f := range notify {
			f()
		}
		return nil
	}
	if err != nil {
		return unavailable("read "+name, err)
	}
	s.event(&sec, false)
	return nil
}

// PutMany implements store.Store: new records go into one Secret (split
// above MaxGroupBytes; atomic per part); records that exist already are
// rewritten where they are, one by one.
func (s *Store) PutMany(bucket string, kv map[string]any) error {
	fresh := map[string][]byte{}
	var old []string
	s.mu.Lock()
	for k, v := range kv {
		if _, known := s.index[bucket][k]; known {
			old = append(old, k)
			continue
		}
		raw, err := json.Marshal(v)
		if err != nil {
			s.mu.Unlock()
			return fmt.Errorf("encode %s/%s: %w", bucket, k, err)
		}
		fresh[k] = raw
		s.claimLocked(bucket, k, raw)
	}
	s.mu.Unlock()
	ctx := context.Background()
	keys := slices.Sorted(maps.Keys(fresh))
	for len(keys) > 0 {
		o := &object{name: groupName(), bucket: bucket, group: true, records: map[string][]byte{}}
		size := 0
		for len(keys) > 0 && (len(o.records) == 0 || size+len(fresh[keys[0]]) <= MaxGroupBytes) {
			o.records[keys[0]] = fresh[keys[0]]
			size += len(fresh[keys[0]]) + len(keys[0])
			keys = keys[1:]
		}
		sec, err := s.secretOf(o)
		if err != nil {
			return err
		}
		if err := s.c.Create(ctx, sec); err != nil {
			return unavailable("create a group of "+bucket, err)
		}
		o.rv = sec.ResourceVersion
		s.mu.Lock()
		s.noteLocked(o.name, o)
		s.mu.Unlock()
	}
	for _, k := range old {
		if err := s.Put(bucket, k, kv[k]); err != nil {
			return err
		}
	}
	return nil
}

// Get implements store.Store.
func (s *Store) Get(bucket, key string, v any) error {
	s.mu.Lock()
	var raw []byte
	if name, ok := s.index[bucket][key]; ok {
		raw = s.objects[name].records[key]
	} else if in, ok := s.inlineLocked(bucket, key); ok {
		raw = in.Raw
	}
	s.mu.Unlock()
	if raw == nil {
		return fmt.Errorf("%s/%s: %w", bucket, key, errdefs.ErrNotFound)
	}
	return json.Unmarshal(raw, v)
}

// Delete implements store.Store.
func (s *Store) Delete(bucket, key string) error {
	s.mu.Lock()
	name, ok := s.index[bucket][key]
	s.mu.Unlock()
	if !ok && bucket == s.o.InlineBucket && s.o.Inline != nil {
		// Its own copy may exist unseen yet (a move a moment ago): the
		// name is known. The inline copy goes with the owner's release.
		s.claim(bucket, key, nil)
		sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: s.o.Namespace, Name: recordName(s.o.Scope, bucket, key)}}
		if err := s.c.Delete(context.Background(), sec); err != nil && !apierrors.IsNotFound(err) {
			return unavailable("delete "+bucket+"/"+key, err)
		}
		return nil
	}
	if !ok {
		return nil
	}
	s.claim(bucket, key, nil)
	err := s.update(context.Background(), name, func(o *object) error {
		delete(o.records, key)
		return nil
	})
	if errdefs.IsNotFound(err) {
		return nil
	}
	return err
}

// ForEach implements store.Store (from the cache, in key order).
func (s *Store) ForEach(bucket string, fn func(key string, raw []byte) error) error {
	s.mu.Lock()
	all := maps.Clone(s.index[bucket])
	if all == nil {
		all = map[string]string{}
	}
	if bucket == s.o.InlineBucket {
		for k := range s.inline {
			if _, ok := all[k]; !ok {
				all[k] = ""
			}
		}
	}
	keys := slices.Sorted(maps.Keys(all))
	raws := make([][]byte, len(keys))
	for i, k := range keys {
		if name := all[k]; name != "" {
			raws[i] = s.objects[name].records[k]
		} else {
			raws[i] = s.inline[k].Raw
		}
	}
	s.mu.Unlock()
	for i, k := range keys {
		if err := fn(k, raws[i]); err != nil {
			return err
		}
	}
	return nil
}

// inlineLocked returns the inline copy of key of bucket. Preconditions:
// s.mu held.
func (s *Store) inlineLocked(bucket, key string) (InlineRecord, bool) {
	if bucket != s.o.InlineBucket || s.o.Inline == nil {
		return InlineRecord{}, false
	}
	in, ok := s.inline[key]
	return in, ok
}

// InlineChanged tells the store that the inline records of part (nil:
// of any part) may have changed (the Inline source calls it): it lists
// them again, reports what changed to the watchers, and moves the new
// crowded ones.
func (s *Store) InlineChanged(part any) {
	if s.o.Inline == nil {
		return
	}
	recs := s.o.Inline.Records(part)
	b := s.o.InlineBucket
	var calls []func()
	var gone []string
	now := time.Now()
	s.mu.Lock()
	var before []string // the keys of the part as last listed
	if part == nil {
		before = slices.Collect(maps.Keys(s.inline))
	} else {
		before = slices.Collect(maps.Keys(s.parts[part]))
	}
	for k, r := range recs {
		o, had := s.inline[k]
		s.setInlineLocked(k, r, now)
		if _, own := s.index[b][k]; own {
			continue
		}
		if had && string(o.Raw) == string(r.Raw) {
			continue
		}
		if r.Mine {
			s.claimLocked(b, k, r.Raw)
		}
		calls = append(calls, s.reportLocked(b, k, r.Raw)...)
	}
	for _, k := range before {
		if _, still := recs[k]; still {
			continue
		}
		s.dropInlineLocked(k)
		if _, own := s.index[b][k]; !own {
			gone = append(gone, k)
		}
	}
	s.mu.Unlock()
	for _, f := range calls {
		f()
	}
	for _, k := range gone {
		time.AfterFunc(inlineSettle, func() { s.settle(k) })
	}
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// setInlineLocked makes r the inline record key, listed at now.
// Preconditions: s.mu held.
func (s *Store) setInlineLocked(key string, r InlineRecord, now time.Time) {
	if o, had := s.inline[key]; had && o.From != r.From {
		s.unlistLocked(key, o.From)
	}
	s.inline[key] = r
	p := s.parts[r.From]
	if p == nil {
		p = map[string]bool{}
		s.parts[r.From] = p
	}
	p[key] = true
	if _, ok := s.seen[key]; !ok {
		s.seen[key] = now
	}
	if r.Crowded {
		s.crowded[key] = true
	} else {
		delete(s.crowded, key)
	}
}

// dropInlineLocked forgets the inline record key. Preconditions: s.mu
// held.
func (s *Store) dropInlineLocked(key string) {
	if o, had := s.inline[key]; had {
		s.unlistLocked(key, o.From)
	}
	delete(s.inline, key)
	delete(s.seen, key)
	delete(s.crowded, key)
}

// unlistLocked removes key from part's keys. Preconditions: s.mu held.
func (s *Store) unlistLocked(key string, part any) {
	if p := s.parts[part]; p != nil {
		delete(p, key)
		if len(p) == 0 {
			delete(s.parts, part)
		}
	}
}

// settle reports the deletion of key, an inline record that vanished,
// unless it shows again, inline or in its own Secret.
func (s *Store) settle(key string) {
	b := s.o.InlineBucket
	s.mu.Lock()
	_, own := s.index[b][key]
	_, in := s.inline[key]
	var calls []func()
	if !own && !in {
		calls = s.reportLocked(b, key, nil)
	}
	s.mu.Unlock()
	for _, f := range calls {
		f()
	}
}

// reportLocked returns the watcher calls for a change of key that this
// process did not make (none if it did). Preconditions: s.mu held.
func (s *Store) reportLocked(bucket, key string, raw []byte) []func() {
	mk := mineKey(bucket, key)
	if m, ok := s.mine[mk]; ok && ((raw == nil && m == deletedMark) || (raw != nil && m == string(raw))) {
		if raw == nil {
			delete(s.mine, mk)
		}
		return nil // this process's own write
	}
	delete(s.mine, mk) // someone else's change: ours is history
	var calls []func()
	for _, w := range s.watchers[bucket] {
		calls = append(calls, func() { w(key, raw) })
	}
	return calls
}

// mover moves crowded inline records into their own Secrets until ctx
// ends (the others stay inline until their first write).
func (s *Store) mover(ctx context.Context) {
	wait := 5 * time.Second
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.kick:
		case <-time.After(wait):
		}
		b := s.o.InlineBucket
		type job struct {
			key string
			in  InlineRecord
		}
		var jobs []job
		now := time.Now()
		wait = 5 * time.Second
		s.mu.Lock()
		for k := range s.crowded {
			in := s.inline[k]
			if _, own := s.index[b][k]; own || s.moving[k] {
				continue
			}
			if due := s.seen[k].Add(s.o.MoveAfter); due.After(now) {
				wait = min(wait, due.Sub(now)+time.Millisecond)
				continue
			}
			s.moving[k] = true
			jobs = append(jobs, job{k, in})
		}
		s.mu.Unlock()
		// Concurrent moves: their drops share the table writes.
		var wg sync.WaitGroup
		for _, j := range jobs {
			wg.Go(func() {
				s.move(ctx, j.key, j.in.Raw, j.in, false)
				s.mu.Lock()
				delete(s.moving, j.key)
				s.mu.Unlock()
			})
		}
		wg.Wait()
	}
}

// move gives inline record key a Secret of its own holding raw (the
// inline value, or a new one when write is set), then drops the inline
// copy in. A record whose owner no longer holds its claim is gone: the
// Secret this move made is deleted again, and a write answers
// ErrNotFound.
func (s *Store) move(ctx context.Context, key string, raw []byte, in InlineRecord, write bool) error {
	b := s.o.InlineBucket
	o := &object{name: recordName(s.o.Scope, b, key), bucket: b, records: map[string][]byte{key: raw}}
	sec, err := s.secretOf(o)
	if err != nil {
		return err
	}
	err = s.c.Create(ctx, sec)
	created := err == nil
	switch {
	case created:
		o.rv = sec.ResourceVersion
		s.mu.Lock()
		s.noteLocked(o.name, o)
		s.mu.Unlock()
	case apierrors.IsAlreadyExists(err):
		// Moved by another process a moment ago.
		if write {
			if err := s.refresh(ctx, o.name); err != nil {
				return err
			}
			if err := s.rewrite(ctx, o.name, b, key, raw); err != nil {
				return err
			}
		}
	default:
		return unavailable("move "+b+"/"+key, err)
	}
	live, err := s.o.Inline.Drop(ctx, key, in)
	if err != nil {
		return unavailable("drop the inline copy of "+b+"/"+key, err)
	}
	if live {
		return nil
	}
	if created {
		del := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: s.o.Namespace, Name: o.name}}
		if err := s.c.Delete(ctx, del, client.Preconditions{ResourceVersion: &o.rv}); err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			return unavailable("delete "+b+"/"+key, err)
		}
		s.mu.Lock()
		s.noteLocked(o.name, nil)
		s.mu.Unlock()
	}
	return fmt.Errorf("%s/%s: %w (deleted meanwhile)", b, key, errdefs.ErrNotFound)
}

// Watch implements store.Watcher: fn hears of the records of bucket that
// other processes write or delete, until ctx ends.
func (s *Store) Watch(ctx context.Context, bucket string, fn func(key string, raw []byte)) {
	s.mu.Lock()
	if s.watchers == nil {
		s.watchers = map[string]map[int]func(string, []byte){}
	}
	if s.watchers[bucket] == nil {
		s.watchers[bucket] = map[int]func(string, []byte){}
	}
	id := s.nextW
	s.nextW++
	s.watchers[bucket][id] = fn
	s.mu.Unlock()
	go func() {
		<-ctx.Done()
		s.mu.Lock()
		delete(s.watchers[bucket], id)
		s.mu.Unlock()
	}()
}

// Shared returns the value name of the secrets the replicas of a server
// share (its API key and key-hashing secret, when no file gives them),
// making it with mk the first time. They live in one Secret of the scope
// (SharedName), created or extended with a resourceVersion-guarded write,
// so that replicas starting together agree on one value.
func (s *Store) Shared(ctx context.Context, name string, mk func() []byte) ([]byte, error) {
	key := types.NamespacedName{Namespace: s.o.Namespace, Name: SharedName(s.o.Scope)}
	for attempt := 0; attempt < 20; attempt++ {
		var sec corev1.Secret
		err := s.c.Get(ctx, key, &sec)
		switch {
		case apierrors.IsNotFound(err):
			sec = corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name, Labels: map[string]string{LabelStore: s.o.Scope}},
				Data: map[string][]byte{name: mk()}}
			err = s.c.Create(ctx, &sec)
		case err != nil:
			return nil, unavailable("read shared secrets", err)
		case len(sec.Data[name]) > 0:
			return sec.Data[name], nil
		default:
			if sec.Data == nil {
				sec.Data = map[string][]byte{}
			}
			sec.Data[name] = mk()
			err = s.c.Update(ctx, &sec)
		}
		if err == nil {
			return sec.Data[name], nil
		}
		if !apierrors.IsAlreadyExists(err) && !apierrors.IsConflict(err) {
			return nil, unavailable("write shared secrets", err)
		}
	}
	return nil, fmt.Errorf("kstore: shared secrets: %w: too much contention", errdefs.ErrUnavailable)
}

// SharedName is the name of the Secret holding the shared secrets of
// scope.
func SharedName(scope string) string { return "moat-" + scope + "-shared" }
