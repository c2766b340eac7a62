package trail

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"
)

// Defaults for Options.
const (
	DefaultPerSandbox = 2 << 20   // bytes of records kept per sandbox
	DefaultTotal      = 512 << 20 // bytes of records kept in all
	DefaultRetention  = 7 * 24 * time.Hour
)

// Options configure a Store.
type Options struct {
	// Dir holds the trails (created 0700).
	Dir string
	// PerSandbox bounds one sandbox's records in bytes: past it the oldest
	// half is dropped (default DefaultPerSandbox).
	PerSandbox int64
	// Total bounds every trail together: past it the trails of deleted
	// sandboxes go first, oldest first, then the older halves of live
	// ones (default DefaultTotal).
	Total int64
	// Retention is how long a deleted sandbox's trail is kept after its
	// last record (default DefaultRetention).
	Retention time.Duration
	// Exists reports whether a sandbox still exists; the trails of those
	// that do are never expired. Nil: every sandbox exists.
	Exists func(id string) bool
	// Export, if set, is given every record as it is written (the OTLP
	// logs exporter). It must not block.
	Export func(Record)
	Now    func() time.Time
	Log    *slog.Logger
}

// Store is the trails of every sandbox. It is safe for concurrent use.
type Store struct {
	opt Options

	mu    sync.Mutex
	sbs   map[string]*trailState
	total int64
	open  int // trail files held open (trailState.f), at most maxOpen

	agg aggregator
}

// trailState is what the store knows of one sandbox's files: <id>.log
// (newest records) and <id>.log.1 (the older half).
type trailState struct {
	seq      uint64
	cur, old int64 // file sizes
	last     time.Time
	tenant   string
	// f is <id>.log held open for appends (nil: closed). The most
	// recently written trails stay open, so that a command's record costs
	// one write rather than an open, a write and a close.
	f *os.File
}

// maxOpen bounds the trail files held open at once.
const maxOpen = 64

// Open opens (creating) the trails under opt.Dir.
func Open(opt Options) (*Store, error) {
	if opt.Dir == "" {
		return nil, errors.New("audit trail: no directory")
	}
	if opt.PerSandbox <= 0 {
		opt.PerSandbox = DefaultPerSandbox
	}
	if opt.Total <= 0 {
		opt.Total = DefaultTotal
	}
	if opt.Total < opt.PerSandbox {
		opt.Total = opt.PerSandbox
	}
	if opt.Retention <= 0 {
		opt.Retention = DefaultRetention
	}
	if opt.Now == nil {
		opt.Now = time.Now
	}
	if opt.Log == nil {
		opt.Log = slog.New(slog.DiscardHandler)
	}
	if err := os.MkdirAll(opt.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("audit trail: %w", err)
	}
	s := &Store{opt: opt, sbs: map[string]*trailState{}}
	if err := s.load(); err != nil {
		return nil, err
	}
	return s, nil
}

const suffix = ".log"

func (s *Store) path(id string) string { return filepath.Join(s.opt.Dir, id+suffix) }

// validID keeps sandbox ids from naming paths outside the directory.
func validID(id string) bool {
	if id == "" || len(id) > 128 {
		return false
	}
	for _, c := range id {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

// load reads the sizes, last sequence numbers and owners of the trails
// an earlier process left.
func (s *Store) load() error {
	ents, err := os.ReadDir(s.opt.Dir)
	if err != nil {
		return fmt.Errorf("audit trail: %w", err)
	}
	for _, e := range ents {
		id, ok := strings.CutSuffix(e.Name(), suffix)
		if !ok || !validID(id) {
			continue
		}
		st := &trailState{}
		for _, p := range []string{s.path(id) + ".1", s.path(id)} {
			fi, err := os.Stat(p)
			if err != nil {
				continue
			}
			if strings.HasSuffix(p, ".1") {
				st.old = fi.Size()
			} else {
				st.cur = fi.Size()
			}
			if fi.ModTime().After(st.last) {
				st.last = fi.ModTime()
			}
			if r, ok := lastRecord(p); ok {
				st.seq, st.tenant = max(st.seq, r.Seq), r.Tenant
			}
		}
		s.sbs[id] = st
		s.total += st.cur + st.old
	}
	return nil
}

// lastRecord reads the last whole record of file p.
func lastRecord(p string) (Record, bool) {
	f, err := os.Open(p)
	if err != nil {
		return Record{}, false
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return Record{}, false
	}
	const tail = 64 << 10
	off := max(fi.Size()-tail, 0)
	b := make([]byte, fi.Size()-off)
	if _, err := f.ReadAt(b, off); err != nil && err != io.EOF {
		return Record{}, false
	}
	lines := bytes.Split(bytes.TrimRight(b, "\n"), []byte("\n"))
	for i := len(lines) - 1; i >= 0; i-- {
		var r Record
		if json.Unmarshal(lines[i], &r) == nil && r.Seq > 0 {
			return r, true
		}
	}
	return Record{}, false
}

// Append stamps r (sequence number, and the time if unset) and appends it
// to its sandbox's trail. A record of a sandbox id that cannot name a file
// is refused.
func (s *Store) Append(r Record) error {
	if !validID(r.SandboxID) {
		return fmt.Errorf("audit trail: bad sandbox id %q", r.SandboxID)
	}
	if r.Time.IsZero() {
		r.Time = s.opt.Now()
	}
	r.Time = r.Time.UTC()
	s.mu.Lock()
	r, err := s.appendLocked(r)
	s.mu.Unlock()
	if err != nil {
		return err
	}
	// Outside the lock: the exporter's work does not hold up other
	// sandboxes' appends.
	if s.opt.Export != nil {
		s.opt.Export(r)
	}
	return nil
}

// appendLocked writes r and returns it as written (with its sequence
// number and tenant).
func (s *Store) appendLocked(r Record) (Record, error) {
	st := s.sbs[r.SandboxID]
	if st == nil {
		st = &trailState{}
		s.sbs[r.SandboxID] = st
	}
	if r.Tenant == "" {
		r.Tenant = st.tenant
	}
	st.seq++
	r.Seq = st.seq
	b, err := json.Marshal(r)
	if err != nil {
		st.seq--
		return r, err
	}
	b = append(b, '\n')
	p := s.path(r.SandboxID)
	if st.cur > 0 && st.cur+int64(len(b)) > s.opt.PerSandbox/2 {
		// The current half is full: it becomes the older half.
		s.closeLocked(st)
		if err := os.Rename(p, p+".1"); err != nil && !os.IsNotExist(err) {
			return r, fmt.Errorf("audit trail: %w", err)
		}
		s.total -= st.old
		st.old, st.cur = st.cur, 0
	}
	if st.f == nil {
		f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
		if err != nil {
			return r, fmt.Errorf("audit trail: %w", err)
		}
		if s.open >= maxOpen {
			s.closeOldestLocked()
		}
		st.f = f
		s.open++
	}
	n, err := st.f.Write(b)
	st.cur += int64(n)
	s.total += int64(n)
	st.last = r.Time
	if r.Tenant != "" {
		st.tenant = r.Tenant
	}
	if err != nil {
		s.closeLocked(st)
		return r, fmt.Errorf("audit trail: %w", err)
	}
	if s.total > s.opt.Total {
		s.evictLocked(r.SandboxID)
	}
	return r, nil
}

// closeLocked closes st's open trail file, if any.
func (s *Store) closeLocked(st *trailState) {
	if st.f != nil {
		st.f.Close()
		st.f = nil
		s.open--
	}
}

// closeOldestLocked closes the open trail file written least recently.
func (s *Store) closeOldestLocked() {
	var old *trailState
	for _, st := range s.sbs {
		if st.f != nil && (old == nil || st.last.Before(old.last)) {
			old = st
		}
	}
	if old != nil {
		s.closeLocked(old)
	}
}

// Close closes the trail files held open; a later Append opens them
// again.
func (s *Store) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, st := range s.sbs {
		s.closeLocked(st)
	}
	return nil
}

// evictLocked brings the total under the bound: whole trails of deleted
// sandboxes first (least recently written first), then the older halves
// of live ones, never the current half of keep.
func (s *Store) evictLocked(keep string) {
	type cand struct {
		id   string
		last time.Time
	}
	var gone, live []cand
	for id, st := range s.sbs {
		if id == keep {
			if st.old > 0 {
				live = append(live, cand{id, st.last})
			}
			continue
		}
		if s.exists(id) {
			if st.old > 0 {
				live = append(live, cand{id, st.last})
			}
		} else {
			gone = append(gone, cand{id, st.last})
		}
	}
	byAge := func(a, b cand) int { return a.last.Compare(b.last) }
	slices.SortFunc(gone, byAge)
	slices.SortFunc(live, byAge)
	for _, c := range gone {
		if s.total <= s.opt.Total {
			return
		}
		s.removeLocked(c.id)
	}
	for _, c := range live {
		if s.total <= s.opt.Total {
			return
		}
		st := s.sbs[c.id]
		if err := os.Remove(s.path(c.id) + ".1"); err != nil && !os.IsNotExist(err) {
			s.opt.Log.Warn("audit trail: evict", "id", c.id, "err", err)
			continue
		}
		s.total -= st.old
		st.old = 0
	}
}

func (s *Store) removeLocked(id string) {
	st := s.sbs[id]
	if st == nil {
		return
	}
	s.closeLocked(st)
	p := s.path(id)
	os.Remove(p)
	os.Remove(p + ".1")
	s.total -= st.cur + st.old
	delete(s.sbs, id)
}

func (s *Store) exists(id string) bool { return s.opt.Exists == nil || s.opt.Exists(id) }

// Expire removes the trails of deleted sandboxes whose last record is
// older than the retention, and returns how many it removed.
func (s *Store) Expire() int {
	cut := s.opt.Now().Add(-s.opt.Retention)
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for id, st := range s.sbs {
		if st.last.Before(cut) && !s.exists(id) {
			s.removeLocked(id)
			n++
		}
	}
	return n
}

// Size is the bytes of records the store holds.
func (s *Store) Size() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.total
}

// Owner returns the tenant that owns sandbox id's trail, and whether the
// store has a trail for it.
func (s *Store) Owner(id string) (string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st, ok := s.sbs[id]
	if !ok {
		return "", false
	}
	return st.tenant, true
}

// Query selects records of one trail.
type Query struct {
	Kinds []Kind // any of (empty: all)
	// Since and Until bound the time (zero: unbounded); Since inclusive,
	// Until exclusive.
	Since, Until time.Time
	// After skips the records up to this sequence number (a cursor).
	After uint64
	// Limit is the most records returned (default 100).
	Limit int
}

// Read returns the records of sandbox id that q selects, oldest first,
// and the sequence number to pass as After for the next page (0: no
// more). A sandbox without a trail has no records.
func (s *Store) Read(id string, q Query) ([]Record, uint64, error) {
	if q.Limit <= 0 {
		q.Limit = 100
	}
	if !validID(id) {
		return nil, 0, nil
	}
	// Reading races Append's rotation only harmlessly: a record is in
	// one of the two files, read in order; a rename between the two
	// reads can at worst show a record twice, which the sequence filter
	// drops.
	s.mu.Lock()
	p := s.path(id)
	_, known := s.sbs[id]
	s.mu.Unlock()
	if !known {
		return nil, 0, nil
	}
	out := []Record{}
	seen := q.After
	more := false
	for _, f := range []string{p + ".1", p} {
		err := scan(f, func(r Record) bool {
			if r.Seq <= seen {
				return true
			}
			seen = r.Seq
			if !q.match(r) {
				return true
			}
			if len(out) == q.Limit {
				more = true
				return false
			}
			out = append(out, r)
			return true
		})
		if err != nil {
			return nil, 0, err
		}
		if more {
			break
		}
	}
	if !more || len(out) == 0 {
		return out, 0, nil
	}
	return out, out[len(out)-1].Seq, nil
}

func (q Query) match(r Record) bool {
	if len(q.Kinds) > 0 && !slices.Contains(q.Kinds, r.Kind) {
		return false
	}
	if !q.Since.IsZero() && r.Time.Before(q.Since) {
		return false
	}
	if !q.Until.IsZero() && !r.Time.Before(q.Until) {
		return false
	}
	return true
}

// scan calls fn with each record of file p until fn returns false. A
// missing file has none; an unreadable line is skipped.
func scan(p string, fn func(Record) bool) error {
	f, err := os.Open(p)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("audit trail: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var r Record
		if json.Unmarshal(sc.Bytes(), &r) != nil {
			continue
		}
		if !fn(r) {
			return nil
		}
	}
	return sc.Err()
}
