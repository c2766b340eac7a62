package volume

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/runtime"
)

// DefaultSize is the capacity of a volume created without a size (the
// size upstream OpenSandbox gives a PersistentVolumeClaim it creates).
const DefaultSize = 1 << 30

// Store keeps the native runtime's named volumes under one directory:
//
//	<root>/<name>/volume.json   name, capacity, creation time, labels
//	<root>/<name>/disk.img      the quota filesystem (sparse ext4 image)
//	<root>/<name>/fs            its mount point, mounted while in use
//	<root>/<name>/users/<id>    one empty file per sandbox using it
//
// A volume's filesystem is mounted on first use (Acquire) and unmounted
// when its last user releases it, so idle volumes hold no loop device.
// The users files are the reference count: they survive a crash of the
// server, and Sweep drops those of sandboxes that no longer exist. A
// volume is created in a temporary directory renamed into place, and
// deleted by renaming it away first, so a crash never leaves a half-made
// volume under its name; Open removes such leftovers.
//
// One server process owns a root. Operations on one volume are
// serialized; different volumes proceed in parallel.
type Store struct {
	root        string
	defaultSize int64

	mu    sync.Mutex
	locks map[string]*nameLock
}

type nameLock struct {
	mu   sync.Mutex
	refs int
}

// volumeFile is the content of volume.json.
type volumeFile struct {
	Name      string            `json:"name"`
	SizeBytes int64             `json:"sizeBytes"`
	CreatedAt time.Time         `json:"createdAt"`
	Labels    map[string]string `json:"labels,omitempty"`
}

const (
	metaFile  = "volume.json"
	imageFile = "disk.img"
	fsDir     = "fs"
	usersDir  = "users"
	tmpPrefix = ".tmp-"
)

// OpenStore opens (creating) the store at root. defaultSize is the
// capacity of volumes created without one (0 = DefaultSize).
func OpenStore(root string, defaultSize int64) (*Store, error) {
	if defaultSize == 0 {
		defaultSize = DefaultSize
	}
	if defaultSize < MinQuotaBytes || defaultSize > MaxQuotaBytes {
		return nil, fmt.Errorf("volume default size %d out of range: %w", defaultSize, errdefs.ErrInvalidArgument)
	}
	if err := os.MkdirAll(root, 0o700); err != nil {
		return nil, fmt.Errorf("volumes: %w", err)
	}
	s := &Store{root: root, defaultSize: defaultSize, locks: map[string]*nameLock{}}
	ents, err := os.ReadDir(root)
	if err != nil {
		return nil, fmt.Errorf("volumes: %w", err)
	}
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), tmpPrefix) {
			// A create or delete cut short by a crash.
			if err := s.removeDir(filepath.Join(root, e.Name())); err != nil {
				return nil, err
			}
		}
	}
	return s, nil
}

// Root is the store's directory.
func (s *Store) Root() string { return s.root }

func (s *Store) lock(name string) func() {
	s.mu.Lock()
	l := s.locks[name]
	if l == nil {
		l = &nameLock{}
		s.locks[name] = l
	}
	l.refs++
	s.mu.Unlock()
	l.mu.Lock()
	return func() {
		l.mu.Unlock()
		s.mu.Lock()
		if l.refs--; l.refs == 0 {
			delete(s.locks, name)
		}
		s.mu.Unlock()
	}
}

func notFound(name string) error {
	return fmt.Errorf("volume %q: %w", name, errdefs.ErrNotFound)
}

func (s *Store) dir(name string) string { return filepath.Join(s.root, name) }

// Create makes a volume of spec.SizeBytes (0 = the default size).
// ErrAlreadyExists if the name is taken.
func (s *Store) Create(ctx context.Context, spec runtime.VolumeSpec) (runtime.Volume, error) {
	if !runtime.ValidVolumeName(spec.Name) {
		return runtime.Volume{}, fmt.Errorf("volume name %q: %w", spec.Name, errdefs.ErrInvalidArgument)
	}
	size := spec.SizeBytes
	if size == 0 {
		size = s.defaultSize
	}
	if size < MinQuotaBytes || size > MaxQuotaBytes {
		return runtime.Volume{}, fmt.Errorf("volume size %d: must be between 16Mi and 16Ti on this runtime: %w", size, errdefs.ErrInvalidArgument)
	}
	unlock := s.lock(spec.Name)
	defer unlock()
	if _, err := os.Lstat(s.dir(spec.Name)); err == nil {
		return runtime.Volume{}, fmt.Errorf("volume %q: %w", spec.Name, errdefs.ErrAlreadyExists)
	}
	tmp, err := os.MkdirTemp(s.root, tmpPrefix)
	if err != nil {
		return runtime.Volume{}, fmt.Errorf("volumes: %w", err)
	}
	done := false
	defer func() {
		if !done {
			os.RemoveAll(tmp)
		}
	}()
	for _, d := range []string{fsDir, usersDir} {
		if err := os.Mkdir(filepath.Join(tmp, d), 0o700); err != nil {
			return runtime.Volume{}, fmt.Errorf("volumes: %w", err)
		}
	}
	if err := CreateFS(ctx, filepath.Join(tmp, imageFile), size, FSOptions{Journal: true}); err != nil {
		return runtime.Volume{}, err
	}
	meta := volumeFile{Name: spec.Name, SizeBytes: size, CreatedAt: time.Now().UTC(), Labels: maps.Clone(spec.Labels)}
	data, err := json.Marshal(meta)
	if err != nil {
		return runtime.Volume{}, err
	}
	if err := os.WriteFile(filepath.Join(tmp, metaFile), data, 0o600); err != nil {
		return runtime.Volume{}, fmt.Errorf("volumes: %w", err)
	}
	if err := unix.Renameat2(unix.AT_FDCWD, tmp, unix.AT_FDCWD, s.dir(spec.Name), unix.RENAME_NOREPLACE); err != nil {
		if errors.Is(err, unix.EEXIST) {
			return runtime.Volume{}, fmt.Errorf("volume %q: %w", spec.Name, errdefs.ErrAlreadyExists)
		}
		return runtime.Volume{}, fmt.Errorf("volumes: %w", err)
	}
	done = true
	return s.info(spec.Name)
}

// info reads one volume; the caller holds its lock (or accepts a racy view).
func (s *Store) info(name string) (runtime.Volume, error) {
	if !runtime.ValidVolumeName(name) {
		return runtime.Volume{}, notFound(name)
	}
	dir := s.dir(name)
	data, err := os.ReadFile(filepath.Join(dir, metaFile))
	if errors.Is(err, os.ErrNotExist) {
		return runtime.Volume{}, notFound(name)
	}
	if err != nil {
		return runtime.Volume{}, fmt.Errorf("volume %q: %w", name, err)
	}
	var meta volumeFile
	if err := json.Unmarshal(data, &meta); err != nil {
		return runtime.Volume{}, fmt.Errorf("volume %q: corrupt %s: %v: %w", name, metaFile, err, errdefs.ErrInternal)
	}
	v := runtime.Volume{Name: name, SizeBytes: meta.SizeBytes, CreatedAt: meta.CreatedAt, Labels: meta.Labels, Managed: true}
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(dir, imageFile), &st); err == nil {
		v.UsedBytes = st.Blocks * 512
	}
	v.Users, _ = s.users(name)
	return v, nil
}

func (s *Store) users(name string) ([]string, error) {
	ents, err := os.ReadDir(filepath.Join(s.dir(name), usersDir))
	if err != nil {
		return nil, err
	}
	out := make([]string, 0, len(ents))
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out, nil
}

// Get returns one volume; ErrNotFound if there is none of that name.
func (s *Store) Get(ctx context.Context, name string) (runtime.Volume, error) {
	return s.info(name)
}

// List returns every volume, sorted by name.
func (s *Store) List(ctx context.Context) ([]runtime.Volume, error) {
	ents, err := os.ReadDir(s.root)
	if err != nil {
		return nil, fmt.Errorf("volumes: %w", err)
	}
	var out []runtime.Volume
	for _, e := range ents {
		if !e.IsDir() || !runtime.ValidVolumeName(e.Name()) {
			continue
		}
		v, err := s.info(e.Name())
		if errdefs.IsNotFound(err) {
			continue // deleted meanwhile
		}
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	slices.SortFunc(out, func(a, b runtime.Volume) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// Delete removes a volume and its data. ErrNotFound if there is none;
// ErrFailedPrecondition while a sandbox uses it.
func (s *Store) Delete(ctx context.Context, name string) error {
	if !runtime.ValidVolumeName(name) {
		return notFound(name)
	}
	unlock := s.lock(name)
	defer unlock()
	dir := s.dir(name)
	if _, err := os.Stat(filepath.Join(dir, metaFile)); errors.Is(err, os.ErrNotExist) {
		return notFound(name)
	}
	if users, _ := s.users(name); len(users) > 0 {
		return runtime.Volume{Name: name, Managed: true, Users: users}.Deletable()
	}
	if err := unmountFS(filepath.Join(dir, fsDir)); err != nil {
		return err
	}
	tmp := filepath.Join(s.root, tmpPrefix+"del-"+randHex())
	if err := os.Rename(dir, tmp); err != nil {
		return fmt.Errorf("volumes: %w", err)
	}
	return s.removeDir(tmp)
}

// removeDir removes a volume directory, never through a mount.
func (s *Store) removeDir(dir string) error {
	if err := unmountFS(filepath.Join(dir, fsDir)); err != nil {
		return err
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("volumes: %w", err)
	}
	return nil
}

// Acquire records user (a sandbox ID) as a user of volume name and
// returns the host path of the volume's mounted filesystem root.
// ErrNotFound if the volume does not exist. Acquiring twice is fine.
func (s *Store) Acquire(ctx context.Context, name, user string) (string, error) {
	if !runtime.ValidVolumeName(name) {
		return "", notFound(name)
	}
	if user == "" || strings.ContainsAny(user, "/\x00") || strings.HasPrefix(user, ".") {
		return "", fmt.Errorf("volume user %q: %w", user, errdefs.ErrInvalidArgument)
	}
	unlock := s.lock(name)
	defer unlock()
	dir := s.dir(name)
	if _, err := os.Stat(filepath.Join(dir, metaFile)); errors.Is(err, os.ErrNotExist) {
		return "", notFound(name)
	}
	mnt := filepath.Join(dir, fsDir)
	if err := os.WriteFile(filepath.Join(dir, usersDir, user), nil, 0o600); err != nil {
		return "", fmt.Errorf("volumes: %w", err)
	}
	mounted, err := isMountPoint(mnt)
	if err == nil && !mounted {
		err = MountFS(filepath.Join(dir, imageFile), mnt)
	}
	if err != nil {
		s.releaseLocked(name, user)
		return "", fmt.Errorf("volume %q: %w", name, err)
	}
	return mnt, nil
}

// Release drops user from volume name's users and unmounts the volume's
// filesystem when it was the last. An unknown volume or user is fine.
func (s *Store) Release(name, user string) error {
	if !runtime.ValidVolumeName(name) || user == "" || strings.ContainsAny(user, "/\x00") {
		return nil
	}
	unlock := s.lock(name)
	defer unlock()
	return s.releaseLocked(name, user)
}

func (s *Store) releaseLocked(name, user string) error {
	dir := s.dir(name)
	if err := os.Remove(filepath.Join(dir, usersDir, user)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("volumes: %w", err)
	}
	if users, err := s.users(name); err != nil || len(users) > 0 {
		return nil
	}
	return unmountFS(filepath.Join(dir, fsDir))
}

// Sweep drops the users for which live returns false (sandboxes that no
// longer exist, e.g. after a crash) and unmounts every volume left
// without users. The runtime calls it once it knows its sandboxes.
func (s *Store) Sweep(live func(user string) bool) error {
	ents, err := os.ReadDir(s.root)
	if err != nil {
		return fmt.Errorf("volumes: %w", err)
	}
	var errs []error
	for _, e := range ents {
		name := e.Name()
		if !e.IsDir() || !runtime.ValidVolumeName(name) {
			continue
		}
		unlock := s.lock(name)
		users, _ := s.users(name)
		for _, u := range users {
			if !live(u) {
				os.Remove(filepath.Join(s.dir(name), usersDir, u))
			}
		}
		if users, err := s.users(name); err == nil && len(users) == 0 {
			if err := unmountFS(filepath.Join(s.dir(name), fsDir)); err != nil {
				errs = append(errs, err)
			}
		}
		unlock()
	}
	return errors.Join(errs...)
}

// isMountPoint reports whether dir is the root of a mount (its device
// differs from its parent's).
func isMountPoint(dir string) (bool, error) {
	var st, parent unix.Stat_t
	if err := unix.Lstat(dir, &st); err != nil {
		return false, err
	}
	if err := unix.Lstat(filepath.Dir(dir), &parent); err != nil {
		return false, err
	}
	return st.Dev != parent.Dev, nil
}

// unmountFS unmounts a volume's filesystem if it is mounted (its loop
// device then auto-clears). A missing directory is fine.
func unmountFS(mnt string) error {
	for range 8 {
		mounted, err := isMountPoint(mnt)
		if errors.Is(err, os.ErrNotExist) || (err == nil && !mounted) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("volumes: %w", err)
		}
		if err := unix.Unmount(mnt, 0); err != nil {
			if !errors.Is(err, unix.EBUSY) {
				return fmt.Errorf("volumes: unmount %s: %w", mnt, err)
			}
			// Busy (an open file of the host): detach; the loop device
			// clears when the last reference goes.
			if err := unix.Unmount(mnt, unix.MNT_DETACH); err != nil {
				return fmt.Errorf("volumes: unmount %s: %w", mnt, err)
			}
		}
	}
	return fmt.Errorf("volumes: %s still mounted: %w", mnt, errdefs.ErrInternal)
}

func randHex() string {
	var b [8]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
