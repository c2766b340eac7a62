package image

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"strings"
	"sync"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/internal/atomicfile"
	"github.com/moat-sandbox/moat/internal/errdefs"
)

const indexVersion = 1

// indexFile is the on-disk index (index.json).
type indexFile struct {
	Version int                    `json:"version"`
	Images  map[string]Image       `json:"images"` // by normalized name
	Layers  map[string]layerRecord `json:"layers"` // by diff ID
}

// layerRecord is what the store knows about an extracted layer.
type layerRecord struct {
	// Size is the uncompressed tar size in bytes.
	Size int64 `json:"size"`
}

// Option configures a Store.
type Option func(*options)

type options struct {
	inUse      func(diffID string) bool
	platform   v1.Platform
	registries []string
}

// WithInUse installs a hook that garbage collection consults for every
// layer it is about to delete (diff ID "sha256:..."); returning true keeps
// the layer. It complements leases (Acquire) for users that cannot hold a
// lease, e.g. sandboxes re-adopted after a restart. It must be fast and
// safe for concurrent use, and must not call back into the Store.
func WithInUse(fn func(diffID string) bool) Option {
	return func(o *options) { o.inUse = fn }
}

// WithPlatform sets the platform selected from multi-platform images
// (default linux/GOARCH of the running binary).
func WithPlatform(p v1.Platform) Option {
	return func(o *options) { o.platform = p }
}

// Store is the local image store, safe for concurrent use. Under its root:
// blobs/sha256 (configs, manifests), layers/sha256/<diffid> (trees),
// index.json (names to images, changed under index.lock) and tmp/. gc.lock
// is shared by writers of new layers and taken exclusively by GC, so GC
// never collects a layer not yet in the index. Use Open.
type Store struct {
	root string
	opts options

	// idxMu serialises index read-modify-write within the process;
	// index.lock does the same across processes.
	idxMu sync.Mutex

	pulls  flightGroup[Image] // by normalized reference
	layers flightGroup[int64] // by diff ID; value is the tar size
}

// Open opens (creating if needed) the store at root. It removes leftovers
// in tmp/ and collects unreferenced layers, unless another process is
// writing to the store right now.
func Open(ctx context.Context, root string, opts ...Option) (*Store, error) {
	abs, err := filepath.Abs(root)
	if err != nil {
		return nil, fmt.Errorf("image store root %q: %w", root, errdefs.ErrInvalidArgument)
	}
	s := &Store{root: abs, opts: options{platform: v1.Platform{OS: "linux", Architecture: goruntime.GOARCH}}}
	for _, o := range opts {
		o(&s.opts)
	}
	for _, d := range []string{"blobs/sha256", "layers/sha256", "tmp"} {
		if err := os.MkdirAll(filepath.Join(abs, d), 0o700); err != nil {
			return nil, fmt.Errorf("image store: %w", err)
		}
	}
	// The layer tree must be traversable by sandbox processes running
	// as any user, overlayfs checks permissions on the lower dirs.
	for _, d := range []string{".", "layers", "layers/sha256"} {
		if err := os.Chmod(filepath.Join(abs, d), 0o711); err != nil {
			return nil, fmt.Errorf("image store: %w", err)
		}
	}
	if _, err := os.Stat(s.indexPath()); errors.Is(err, fs.ErrNotExist) {
		if err := s.update(func(*indexFile) error { return nil }); err != nil {
			return nil, err
		}
	}
	if err := s.gc(ctx, true); err != nil {
		return nil, err
	}
	return s, nil
}

// Close releases the store. It holds no long-lived resources today; it
// exists so callers do not depend on that.
func (s *Store) Close() error { return nil }

// Root returns the store's absolute root directory.
func (s *Store) Root() string { return s.root }

func (s *Store) indexPath() string { return filepath.Join(s.root, "index.json") }

func (s *Store) layerDir(diffID string) string {
	return filepath.Join(s.root, "layers", "sha256", strings.TrimPrefix(diffID, "sha256:"))
}

func (s *Store) blobPath(digest string) string {
	return filepath.Join(s.root, "blobs", "sha256", strings.TrimPrefix(digest, "sha256:"))
}

// load reads the index. Writers replace the file atomically, so readers
// need no lock.
func (s *Store) load() (*indexFile, error) {
	idx := &indexFile{Version: indexVersion, Images: map[string]Image{}, Layers: map[string]layerRecord{}}
	data, err := os.ReadFile(s.indexPath())
	if errors.Is(err, fs.ErrNotExist) {
		return idx, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read image index: %w", err)
	}
	if err := json.Unmarshal(data, idx); err != nil {
		return nil, fmt.Errorf("parse image index %s: %v: %w", s.indexPath(), err, errdefs.ErrInternal)
	}
	if idx.Version != indexVersion {
		return nil, fmt.Errorf("image index version %d, want %d: %w", idx.Version, indexVersion, errdefs.ErrFailedPrecondition)
	}
	if idx.Images == nil {
		idx.Images = map[string]Image{}
	}
	if idx.Layers == nil {
		idx.Layers = map[string]layerRecord{}
	}
	return idx, nil
}

// update runs fn on the current index under the index locks and writes
// the result atomically (tmp + fsync + rename). An fn error aborts.
func (s *Store) update(fn func(*indexFile) error) error {
	s.idxMu.Lock()
	defer s.idxMu.Unlock()
	unlock, err := s.flock("index.lock", unix.LOCK_EX)
	if err != nil {
		return err
	}
	defer unlock()
	idx, err := s.load()
	if err != nil {
		return err
	}
	if err := fn(idx); err != nil {
		return err
	}
	data, err := json.MarshalIndent(idx, "", "  ")
	if err != nil {
		return fmt.Errorf("encode image index: %w", err)
	}
	return atomicfile.WriteFileSync(s.indexPath(), data, 0o600)
}

// flock takes lock (LOCK_SH or LOCK_EX, optionally |LOCK_NB) on the lock
// file name under the root and returns its release function. Locks are
// per open file, so two holders in one process exclude each other too.
func (s *Store) flock(name string, how int) (func(), error) {
	f, err := os.OpenFile(filepath.Join(s.root, name), os.O_RDWR|os.O_CREATE|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("image store lock: %w", err)
	}
	if err = flockRetry(f, how); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("image store %s busy: %w", name, errdefs.ErrConflict)
		}
		return nil, fmt.Errorf("image store lock %s: %w", name, err)
	}
	return func() { f.Close() }, nil
}

// flockRetry takes lock how on f, again while a signal interrupts the
// wait (a blocking flock returns EINTR then).
func flockRetry(f *os.File, how int) error {
	for {
		if err := unix.Flock(int(f.Fd()), how); err != unix.EINTR {
			return err
		}
	}
}

// writerLock is held by every operation that creates layers or blobs not
// yet referenced from the index, so GC cannot collect them mid-flight.
func (s *Store) writerLock() (func(), error) { return s.flock("gc.lock", unix.LOCK_SH) }

func randomSuffix() string {
	var b [8]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// NormalizeName turns a user-supplied reference into the form images are
// stored under, go-containerregistry's ("busybox" becomes
// "index.docker.io/library/busybox:latest"), for pulls and imports alike:
// an imported "busybox" satisfies Ensure("busybox") offline. A malformed
// reference is ErrInvalidArgument.
func NormalizeName(ref string) (string, error) {
	r, err := parseRef(ref)
	if err != nil {
		return "", err
	}
	return r.Name(), nil
}

func parseRef(ref string) (name.Reference, error) {
	if strings.TrimSpace(ref) == "" {
		return nil, errdefs.WithPublic(fmt.Errorf("%w: %w", ErrInvalidReference, errdefs.ErrInvalidArgument), "", "image reference is empty")
	}
	r, err := name.ParseReference(ref)
	if err != nil {
		return nil, errdefs.WithPublic(fmt.Errorf("parse %q: %v: %w: %w", ref, err, ErrInvalidReference, errdefs.ErrInvalidArgument),
			"", fmt.Sprintf("invalid image reference %q", ref))
	}
	return r, nil
}

// lookup finds ref in idx: by normalized name, then by ID or unambiguous
// ID prefix (at least 6 hex digits).
func lookup(idx *indexFile, ref string) (Image, error) {
	if n, err := NormalizeName(ref); err == nil {
		if img, ok := idx.Images[n]; ok {
			return img, nil
		}
	}
	hexRef := strings.TrimPrefix(ref, "sha256:")
	if len(hexRef) >= 6 && isHex(hexRef) {
		var found []Image
		for _, n := range sortedNames(idx) {
			img := idx.Images[n]
			if strings.HasPrefix(strings.TrimPrefix(img.ID, "sha256:"), hexRef) {
				found = append(found, img)
			}
		}
		ids := map[string]bool{}
		for _, img := range found {
			ids[img.ID] = true
		}
		switch {
		case len(ids) == 1:
			return found[0], nil
		case len(ids) > 1:
			return Image{}, fmt.Errorf("image ID prefix %q is ambiguous: %w", ref, errdefs.ErrInvalidArgument)
		}
	}
	return Image{}, errdefs.WithPublic(fmt.Errorf("image %q: %w: %w", ref, ErrUnknownImage, errdefs.ErrNotFound),
		"", fmt.Sprintf("image %q not found", ref))
}

func isHex(s string) bool {
	for _, c := range s {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

func sortedNames(idx *indexFile) []string {
	names := make([]string, 0, len(idx.Images))
	for n := range idx.Images {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// Get returns the image stored under ref (a name, an ID or an ID prefix);
// ErrNotFound if there is none.
func (s *Store) Get(ctx context.Context, ref string) (Image, error) {
	if err := ctx.Err(); err != nil {
		return Image{}, err
	}
	idx, err := s.load()
	if err != nil {
		return Image{}, err
	}
	return lookup(idx, ref)
}

// List returns all images, sorted by name.
func (s *Store) List(ctx context.Context) ([]Image, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	idx, err := s.load()
	if err != nil {
		return nil, err
	}
	out := make([]Image, 0, len(idx.Images))
	for _, n := range sortedNames(idx) {
		out = append(out, idx.Images[n])
	}
	return out, nil
}

// Remove deletes the name ref (or, given an ID, every name of that image)
// and then garbage-collects what is no longer referenced (see GC). Layers
// in use stay on disk until a later GC finds them unused.
func (s *Store) Remove(ctx context.Context, ref string) error {
	err := s.update(func(idx *indexFile) error {
		img, err := lookup(idx, ref)
		if err != nil {
			return err
		}
		if n, nerr := NormalizeName(ref); nerr == nil && n == img.Name {
			delete(idx.Images, img.Name)
			return nil
		}
		for n, other := range idx.Images {
			if other.ID == img.ID {
				delete(idx.Images, n)
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	return s.GC(ctx)
}

// LayerPaths returns the absolute extracted layer directories of img,
// bottom first (reverse them for an overlayfs lowerdir=; MountRootfs takes
// them in this order). A missing layer is ErrNotFound. The paths may be
// collected after the image is removed unless a Lease is held.
func (s *Store) LayerPaths(ctx context.Context, img Image) ([]string, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	paths := make([]string, 0, len(img.Layers))
	for _, l := range img.Layers {
		if !validDigest(l) {
			return nil, fmt.Errorf("image %s: bad layer diff ID %q: %w", img.Name, l, errdefs.ErrInvalidArgument)
		}
		p := s.layerDir(l)
		if fi, err := os.Stat(p); err != nil || !fi.IsDir() {
			return nil, fmt.Errorf("image %s: layer %s is not extracted: %w", img.Name, l, errdefs.ErrNotFound)
		}
		paths = append(paths, p)
	}
	return paths, nil
}

func validDigest(d string) bool {
	h, ok := strings.CutPrefix(d, "sha256:")
	return ok && len(h) == 64 && isHex(h)
}

// Lease pins an image's layers on disk: while it is held, GC in any
// process sharing the store root skips them. It is backed by a shared
// flock(2) on each layer directory, so it ends when the holding process
// dies. Release it when the last sandbox using the layers is gone.
type Lease struct {
	// Image is the leased image.
	Image Image
	// Layers are its layer directories, bottom first (as LayerPaths).
	Layers []string

	once  sync.Once
	files []*os.File
}

// Release ends the lease. It is idempotent.
func (l *Lease) Release() {
	l.once.Do(func() {
		for _, f := range l.files {
			f.Close()
		}
		l.files = nil
	})
}

// Acquire looks up ref (as Get) and leases its layers. The caller must
// call Release on the result. A layer collected concurrently makes
// Acquire fail with ErrNotFound.
func (s *Store) Acquire(ctx context.Context, ref string) (*Lease, error) {
	img, err := s.Get(ctx, ref)
	if err != nil {
		return nil, err
	}
	paths, err := s.LayerPaths(ctx, img)
	if err != nil {
		return nil, err
	}
	l, err := s.LeaseLayers(paths)
	if err != nil {
		return nil, fmt.Errorf("lease image %s: %w", img.Name, err)
	}
	l.Image = img
	return l, nil
}

// lockDir opens dir and flocks it. It fails with ErrNotFound if dir was
// renamed away (collected) between the open and the lock.
func lockDir(dir string, how int) (*os.File, error) {
	f, err := os.OpenFile(dir, os.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("layer %s: %w", filepath.Base(dir), errdefs.ErrNotFound)
	}
	if err != nil {
		return nil, err
	}
	if err = flockRetry(f, how); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("layer %s in use: %w", filepath.Base(dir), errdefs.ErrConflict)
		}
		return nil, err
	}
	var a, b unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &a); err != nil {
		f.Close()
		return nil, err
	}
	if err := unix.Lstat(dir, &b); err != nil || a.Ino != b.Ino || a.Dev != b.Dev {
		f.Close()
		return nil, fmt.Errorf("layer %s: %w", filepath.Base(dir), errdefs.ErrNotFound)
	}
	return f, nil
}

// GC deletes layers and blobs no longer referenced by any image, skipping
// layers that are leased, reported in use by the WithInUse hook, or lower
// dirs of a mounted overlay (see prune.go). If a
// pull, import or commit is running (in any process), GC does nothing and
// returns nil: the next GC, Remove or Open retries.
func (s *Store) GC(ctx context.Context) error { return s.gc(ctx, false) }

func (s *Store) gc(ctx context.Context, cleanTmp bool) error {
	unlock, err := s.flock("gc.lock", unix.LOCK_EX|unix.LOCK_NB)
	if errdefs.IsConflict(err) {
		return nil
	}
	if err != nil {
		return err
	}
	defer unlock()

	if cleanTmp {
		if err := s.cleanTmp(); err != nil {
			return err
		}
	}
	idx, err := s.load()
	if err != nil {
		return err
	}
	keepLayers, keepBlobs := referenced(idx)
	removed, err := s.collectLayers(ctx, keepLayers)
	if err != nil {
		return err
	}
	if err := s.collectBlobs(keepBlobs); err != nil {
		return err
	}
	return s.update(func(idx *indexFile) error {
		for _, l := range removed {
			delete(idx.Layers, l)
		}
		for l := range idx.Layers {
			if _, err := os.Stat(s.layerDir(l)); errors.Is(err, fs.ErrNotExist) {
				delete(idx.Layers, l)
			}
		}
		return nil
	})
}

// cleanTmp empties tmp/. Preconditions: gc.lock held exclusively, so no
// writer is running and nothing in tmp/ is live.
func (s *Store) cleanTmp() error {
	tmp := filepath.Join(s.root, "tmp")
	ents, _ := os.ReadDir(tmp)
	for _, e := range ents {
		if err := removeAllTree(filepath.Join(tmp, e.Name())); err != nil {
			return fmt.Errorf("clean %s: %w", tmp, err)
		}
	}
	return nil
}

// referenced returns the hex digests of the layers and blobs (configs and
// manifests) that the images in idx refer to.
func referenced(idx *indexFile) (layers, blobs map[string]bool) {
	layers, blobs = map[string]bool{}, map[string]bool{}
	for _, img := range idx.Images {
		for _, l := range img.Layers {
			layers[strings.TrimPrefix(l, "sha256:")] = true
		}
		blobs[strings.TrimPrefix(img.ID, "sha256:")] = true
		if img.Digest != "" {
			blobs[strings.TrimPrefix(img.Digest, "sha256:")] = true
		}
	}
	return layers, blobs
}

// collectLayers deletes the layer trees not in keep and not in use, and
// returns the diff IDs it deleted.
func (s *Store) collectLayers(ctx context.Context, keep map[string]bool) ([]string, error) {
	var removed []string
	mounted := s.mountedLayers()
	layersDir := filepath.Join(s.root, "layers", "sha256")
	ents, err := os.ReadDir(layersDir)
	if err != nil {
		return nil, fmt.Errorf("image gc: %w", err)
	}
	for _, e := range ents {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		h := e.Name()
		if keep[h] || mounted["sha256:"+h] || (s.opts.inUse != nil && s.opts.inUse("sha256:"+h)) {
			continue
		}
		ok, err := s.removeLayer(filepath.Join(layersDir, h), h)
		if err != nil {
			return nil, fmt.Errorf("image gc: %w", err)
		}
		if ok {
			removed = append(removed, "sha256:"+h)
		}
	}
	return removed, nil
}

// removeLayer deletes the layer tree dir unless it is leased; ok reports
// whether it did.
func (s *Store) removeLayer(dir, h string) (ok bool, err error) {
	f, err := lockDir(dir, unix.LOCK_EX|unix.LOCK_NB)
	if errdefs.IsConflict(err) || errdefs.IsNotFound(err) {
		return false, nil // leased, or already gone
	}
	if err != nil {
		return false, err
	}
	// Rename while holding the lock: a concurrent Acquire that opened
	// the old path sees the inode change and fails instead of leasing
	// a dying tree.
	dead := filepath.Join(s.root, "tmp", "gc-"+h+"-"+randomSuffix())
	err = os.Rename(dir, dead)
	f.Close()
	if err != nil {
		return false, err
	}
	return true, removeAllTree(dead)
}

// collectBlobs deletes the blobs not in keep, sparing hidden files (the
// temporary files of writes in progress).
func (s *Store) collectBlobs(keep map[string]bool) error {
	dir := filepath.Join(s.root, "blobs", "sha256")
	blobs, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("image gc: %w", err)
	}
	for _, e := range blobs {
		if !keep[e.Name()] && !strings.HasPrefix(e.Name(), ".") {
			if err := os.Remove(filepath.Join(dir, e.Name())); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return fmt.Errorf("image gc: %w", err)
			}
		}
	}
	return nil
}

// removeAllTree is os.RemoveAll that, if that fails (without root, on
// read-only directories, which images commonly contain), makes every
// directory writable and retries.
func removeAllTree(dir string) error {
	err := os.RemoveAll(dir)
	if err == nil {
		return nil
	}
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			os.Chmod(p, 0o700)
		}
		return nil
	})
	return os.RemoveAll(dir)
}
