package image

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/internal/errdefs"
)

// Images are released when their last user goes: a sandbox pins the
// layers it runs on (LeaseLayers, held by the server per sandbox and taken
// again when a restarted server re-adopts it), a snapshot is an image
// under SnapshotRepo, and Prune removes every other image no sandbox
// uses, least recently used first, down to a disk budget or entirely.
// GC (which Prune and Remove run) never deletes a layer that is leased,
// reported by WithInUse, or a lower dir of a mounted overlay in any mount
// namespace (a sandbox whose server is down or not yet re-adopted).

// SnapshotRepo is the repository snapshots store their images under
// ("localhost/moat-snapshots:<snapshot id>"). Prune never removes those:
// they go when their snapshot is deleted.
const SnapshotRepo = "localhost/moat-snapshots"

// IsSnapshot reports whether img is a snapshot's image.
func IsSnapshot(img Image) bool { return strings.HasPrefix(img.Name, SnapshotRepo+":") }

// LeaseLayers leases layer directories of this store by path (as
// Lease.Layers or LayerPaths give them), e.g. for a sandbox re-adopted
// after a restart, whose image may have lost its name since. A path
// outside the store is ErrInvalidArgument, a missing layer ErrNotFound.
func (s *Store) LeaseLayers(paths []string) (*Lease, error) {
	base := filepath.Join(s.root, "layers", "sha256") + string(filepath.Separator)
	l := &Lease{Layers: slices.Clone(paths)}
	for _, p := range paths {
		if !strings.HasPrefix(filepath.Clean(p), base) || !validDigest("sha256:"+filepath.Base(p)) {
			l.Release()
			return nil, fmt.Errorf("lease layers: %s is not a layer of the store at %s: %w", p, s.root, errdefs.ErrInvalidArgument)
		}
		f, err := lockDir(p, unix.LOCK_SH)
		if err != nil {
			l.Release()
			return nil, fmt.Errorf("lease layers: %w", err)
		}
		l.files = append(l.files, f)
	}
	return l, nil
}

// mountedLayers returns the diff IDs of this store's layers that are
// lower dirs of overlay mounts in this mount namespace or in the mount
// namespace of any process: the native runtime drops the host's mount of
// a started sandbox's root, which then lives only in the sandbox's own
// namespace, and that mount must protect its layers while the server is
// down.
func (s *Store) mountedLayers() map[string]bool {
	out := map[string]bool{}
	for _, table := range mountTables() {
		s.mountedLayersIn(table, out)
	}
	return out
}

// mountTables returns one mountinfo path per mount namespace that a
// process lives in, this process's first.
func mountTables() []string {
	tables := []string{"/proc/self/mountinfo"}
	seen := map[uint64]bool{}
	var st unix.Stat_t
	if unix.Stat("/proc/self/ns/mnt", &st) == nil {
		seen[st.Ino] = true
	}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		if e.Name()[0] < '0' || e.Name()[0] > '9' {
			continue
		}
		if unix.Stat("/proc/"+e.Name()+"/ns/mnt", &st) != nil || seen[st.Ino] {
			continue
		}
		seen[st.Ino] = true
		tables = append(tables, "/proc/"+e.Name()+"/mountinfo")
	}
	return tables
}

// mountedLayersIn adds to out the store's layers that the mount table at
// path (a mountinfo file) holds as overlay lower dirs or bind mounts.
func (s *Store) mountedLayersIn(path string, out map[string]bool) {
	f, err := os.Open(path)
	if err != nil {
		return // the process is gone
	}
	defer f.Close()
	base := filepath.Join(s.root, "layers", "sha256") + "/"
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.Contains(line, base) {
			continue
		}
		fields := strings.Fields(line)
		for i, fl := range fields {
			if fl == "-" && i+3 < len(fields) && fields[i+1] == "overlay" {
				for _, opt := range strings.Split(fields[i+3], ",") {
					dirs, ok := strings.CutPrefix(opt, "lowerdir=")
					if !ok {
						if dirs, ok = strings.CutPrefix(opt, "lowerdir+="); !ok {
							continue
						}
					}
					for _, d := range strings.Split(dirs, ":") {
						if h, ok := strings.CutPrefix(d, base); ok {
							out["sha256:"+h] = true
						}
					}
				}
			}
		}
		// A single read-only layer is bind-mounted (MountRootfs): the
		// mount's root is the layer directory.
		if len(fields) > 3 && strings.HasPrefix(fields[3], base) {
			out["sha256:"+strings.TrimPrefix(fields[3], base)] = true
		}
	}
}

// PruneOptions tune Prune.
type PruneOptions struct {
	// Budget, if positive, makes Prune stop as soon as the layers of the
	// remaining images (and the leased ones) fit in Budget bytes
	// (uncompressed layer sizes); zero removes every unused image.
	Budget int64
}

// PruneResult is what Prune removed.
type PruneResult struct {
	// Removed are the images whose names were removed, oldest use first.
	Removed []Image
	// Size is the store's layer bytes after the prune (and its GC).
	Size int64
}

// Prune removes images no sandbox uses (none of a leased, reported or
// mounted layer set covers all of their layers) other than snapshot
// images, least recently used first (an image last seen in use by a
// Prune, else its creation), then collects their layers. With a Budget it
// stops once the store fits; it reports the store's size either way.
func (s *Store) Prune(ctx context.Context, opts PruneOptions) (PruneResult, error) {
	var res PruneResult
	inUse := s.layersInUse()
	now := time.Now().UTC()
	var candidates []Image
	err := s.update(func(idx *indexFile) error {
		for n, img := range idx.Images {
			if usesOnly(img, inUse) {
				img.LastUsed = now // seen in use: the most recent of all
				idx.Images[n] = img
				continue
			}
			if !IsSnapshot(img) {
				candidates = append(candidates, img)
			}
		}
		slices.SortFunc(candidates, func(a, b Image) int { return a.lastUse().Compare(b.lastUse()) })
		size := storeSize(idx, inUse)
		for _, img := range candidates {
			if opts.Budget > 0 && size <= opts.Budget {
				break
			}
			if err := ctx.Err(); err != nil {
				return err
			}
			delete(idx.Images, img.Name)
			res.Removed = append(res.Removed, img)
			size = storeSize(idx, inUse)
		}
		return nil
	})
	if err != nil {
		return res, err
	}
	if err := s.GC(ctx); err != nil {
		return res, err
	}
	idx, err := s.load()
	if err != nil {
		return res, err
	}
	res.Size = storeSize(idx, s.layersInUse())
	return res, nil
}

// lastUse orders images for eviction.
func (img Image) lastUse() time.Time {
	if !img.LastUsed.IsZero() {
		return img.LastUsed
	}
	return img.CreatedAt
}

// usesOnly reports whether every layer of img is in use (a sandbox runs
// img or an image built on it).
func usesOnly(img Image, inUse map[string]bool) bool {
	if len(img.Layers) == 0 {
		return false
	}
	for _, l := range img.Layers {
		if !inUse[l] {
			return false
		}
	}
	return true
}

// storeSize sums the sizes of the layers that stay: those of the indexed
// images and those in use.
func storeSize(idx *indexFile, inUse map[string]bool) int64 {
	keep := map[string]bool{}
	for _, img := range idx.Images {
		for _, l := range img.Layers {
			keep[l] = true
		}
	}
	for l := range inUse {
		keep[l] = true
	}
	var n int64
	for l := range keep {
		n += idx.Layers[l].Size
	}
	return n
}

// layersInUse are the layers GC must keep whatever the index says: leased
// (a shared flock held by any process), reported by WithInUse, or mounted.
func (s *Store) layersInUse() map[string]bool {
	out := s.mountedLayers()
	ents, _ := os.ReadDir(filepath.Join(s.root, "layers", "sha256"))
	for _, e := range ents {
		d := "sha256:" + e.Name()
		if out[d] || (s.opts.inUse != nil && s.opts.inUse(d)) {
			out[d] = true
			continue
		}
		f, err := lockDir(filepath.Join(s.root, "layers", "sha256", e.Name()), unix.LOCK_EX|unix.LOCK_NB)
		if errdefs.IsConflict(err) {
			out[d] = true
			continue
		}
		if err == nil {
			f.Close()
		}
	}
	return out
}
