package envd

import (
	"context"
	"encoding/binary"
	"errors"
	"io/fs"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"sync"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/internal/errdefs"
	fspb "github.com/moat-sandbox/moat/internal/execd/envd/gen/filesystem"
	"github.com/moat-sandbox/moat/internal/execd/wire"
)

const (
	watchMask = unix.IN_CREATE | unix.IN_MOVED_TO | unix.IN_MODIFY | unix.IN_ATTRIB | unix.IN_DELETE | unix.IN_MOVED_FROM
	// maxPolledEvents bounds what a polled watcher buffers between
	// GetWatcherEvents calls; later events are dropped.
	maxPolledEvents = 10000
)

// networkFS are the statfs magics of filesystems a watch needs
// allow_network_mounts for (inotify misses changes made elsewhere).
var networkFS = map[int64]bool{0x6969: true, 0x517b: true, 0xff534d42: true, 0xfe534d42: true}

// watcher is an inotify watch of a directory (and, recursive, of every
// directory below it, including ones created later). Event names are
// relative to the watched directory.
type watcher struct {
	fd           int
	f            *os.File // fd, read through the poller; Close ends a Read
	root         string
	as           func(func() error) error // the identity of the watch's user
	recursive    bool
	includeEntry bool

	mu   sync.Mutex
	dirs map[int32]string // guarded by mu; watch descriptor -> directory relative to root
}

// newWatcher watches root, which must be a directory (and, unless
// allowNet, not on a network filesystem).
func newWatcher(root string, a account, recursive, includeEntry, allowNet bool) (w *watcher, err error) {
	err = a.as(func() (err error) { w, err = a.newWatcher(root, recursive, includeEntry, allowNet); return err })
	return w, err
}

func (a account) newWatcher(root string, recursive, includeEntry, allowNet bool) (*watcher, error) {
	st, err := os.Stat(root)
	if err != nil {
		return nil, fsError(err, root)
	}
	if !st.IsDir() {
		return nil, errdefs.Newf(errdefs.ErrInvalidArgument, "path '%s' is not a directory", root)
	}
	var sfs unix.Statfs_t
	if err := unix.Statfs(root, &sfs); err == nil && networkFS[int64(sfs.Type)] && !allowNet {
		return nil, errdefs.Newf(errdefs.ErrInvalidArgument, "path '%s' is on a network filesystem: set allow_network_mounts to watch it", root)
	}
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		return nil, errdefs.Newf(errdefs.ErrResourceExhausted, "inotify: %v", err)
	}
	w := &watcher{fd: fd, f: os.NewFile(uintptr(fd), "inotify"), root: root, as: a.as, recursive: recursive, includeEntry: includeEntry, dirs: make(map[int32]string)}
	if err := w.addTree(""); err != nil {
		w.f.Close()
		return nil, err
	}
	return w, nil
}

// addTree watches the directory rel (relative to root) and, recursive,
// every directory below it.
func (w *watcher) addTree(rel string) error {
	dir := filepath.Join(w.root, rel)
	if !w.recursive {
		return w.add(dir, rel)
	}
	return filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if p == dir {
				return fsError(err, p)
			}
			return nil
		}
		if !d.IsDir() {
			return nil
		}
		r, _ := filepath.Rel(w.root, p)
		if r == "." {
			r = ""
		}
		if err := w.add(p, r); err != nil && p == dir {
			return err
		}
		return nil
	})
}

func (w *watcher) add(dir, rel string) error {
	wd, err := unix.InotifyAddWatch(w.fd, dir, watchMask|unix.IN_ONLYDIR)
	if err != nil {
		if errors.Is(err, unix.ENOSPC) {
			return errdefs.Newf(errdefs.ErrResourceExhausted, "inotify watch limit reached")
		}
		return fsError(err, dir)
	}
	w.mu.Lock()
	w.dirs[int32(wd)] = rel
	w.mu.Unlock()
	return nil
}

func (w *watcher) close() { w.f.Close() }

// run reads events until the watcher is closed, handing each to emit.
func (w *watcher) run(emit func(*fspb.FilesystemEvent)) {
	buf := make([]byte, 64<<10)
	for {
		n, err := w.f.Read(buf)
		if err != nil {
			return
		}
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			wd := int32(binary.NativeEndian.Uint32(buf[off:]))
			mask := binary.NativeEndian.Uint32(buf[off+4:])
			nameLen := int(binary.NativeEndian.Uint32(buf[off+12:]))
			nameStart := off + unix.SizeofInotifyEvent
			off = nameStart + nameLen
			if off > n {
				break
			}
			name := string(buf[nameStart:off])
			for len(name) > 0 && name[len(name)-1] == 0 {
				name = name[:len(name)-1]
			}
			if ev := w.event(wd, mask, name); ev != nil {
				emit(ev)
			}
		}
	}
}

// event turns one inotify record into an event (nil for records that
// are not one: a directory's own removal, an overflow).
func (w *watcher) event(wd int32, mask uint32, name string) *fspb.FilesystemEvent {
	w.mu.Lock()
	dir, ok := w.dirs[wd]
	if mask&unix.IN_IGNORED != 0 {
		delete(w.dirs, wd)
	}
	w.mu.Unlock()
	if !ok || name == "" {
		return nil
	}
	rel := path.Join(dir, name)
	var typ fspb.EventType
	switch {
	case mask&(unix.IN_CREATE|unix.IN_MOVED_TO) != 0:
		typ = fspb.EventType_EVENT_TYPE_CREATE
		if w.recursive && mask&unix.IN_ISDIR != 0 {
			w.as(func() error { return w.addTree(rel) })
		}
	case mask&unix.IN_MODIFY != 0:
		typ = fspb.EventType_EVENT_TYPE_WRITE
	case mask&unix.IN_ATTRIB != 0:
		typ = fspb.EventType_EVENT_TYPE_CHMOD
	case mask&unix.IN_DELETE != 0:
		typ = fspb.EventType_EVENT_TYPE_REMOVE
	case mask&unix.IN_MOVED_FROM != 0:
		typ = fspb.EventType_EVENT_TYPE_RENAME
	default:
		return nil
	}
	ev := &fspb.FilesystemEvent{Name: rel, Type: typ}
	if w.includeEntry && typ != fspb.EventType_EVENT_TYPE_REMOVE && typ != fspb.EventType_EVENT_TYPE_RENAME {
		var e *fspb.EntryInfo
		if w.as(func() (err error) { e, err = entryInfo(filepath.Join(w.root, rel)); return err }) == nil {
			ev.Entry = e
		}
	}
	return ev
}

// rpcWatcher resolves the path of a watch request and starts watching.
func (s *Service) rpcWatcher(h http.Header, p string, recursive, includeEntry, allowNet bool) (*watcher, error) {
	a, root, err := s.rpcPath(h, p)
	if err != nil {
		return nil, err
	}
	return newWatcher(root, a, recursive, includeEntry, allowNet)
}

func (f *filesystemServer) WatchDir(ctx context.Context, req *connect.Request[fspb.WatchDirRequest], stream *connect.ServerStream[fspb.WatchDirResponse]) error {
	m := req.Msg
	w, err := f.s.rpcWatcher(req.Header(), m.GetPath(), m.GetRecursive(), m.GetIncludeEntry(), m.GetAllowNetworkMounts())
	if err != nil {
		return rpcError(err)
	}
	defer w.close()
	events := make(chan *fspb.FilesystemEvent, 256)
	done := make(chan struct{})
	defer close(done)
	f.s.run.Go(func() {
		w.run(func(ev *fspb.FilesystemEvent) {
			select {
			case events <- ev:
			case <-done:
			}
		})
	})
	if err := stream.Send(&fspb.WatchDirResponse{Event: &fspb.WatchDirResponse_Start{Start: &fspb.WatchDirResponse_StartEvent{}}}); err != nil {
		return err
	}
	every := keepaliveInterval(req.Header())
	t := time.NewTimer(every)
	defer t.Stop()
	for {
		var msg *fspb.WatchDirResponse
		select {
		case ev := <-events:
			msg = &fspb.WatchDirResponse{Event: &fspb.WatchDirResponse_Filesystem{Filesystem: ev}}
		case <-t.C:
			msg = &fspb.WatchDirResponse{Event: &fspb.WatchDirResponse_Keepalive{Keepalive: &fspb.WatchDirResponse_KeepAlive{}}}
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return connect.NewError(connect.CodeDeadlineExceeded, errors.New("watch timed out"))
			}
			return connect.NewError(connect.CodeCanceled, ctx.Err())
		case <-f.s.run.Context().Done():
			return connect.NewError(connect.CodeUnavailable, errors.New("agent is shutting down"))
		}
		if err := stream.Send(msg); err != nil {
			return err
		}
		t.Reset(every)
	}
}

// pollWatcher is a watcher whose events wait for GetWatcherEvents.
type pollWatcher struct {
	w    *watcher
	stop context.CancelFunc

	mu     sync.Mutex
	events []*fspb.FilesystemEvent // guarded by mu
}

func (f *filesystemServer) CreateWatcher(ctx context.Context, req *connect.Request[fspb.CreateWatcherRequest]) (*connect.Response[fspb.CreateWatcherResponse], error) {
	m := req.Msg
	w, err := f.s.rpcWatcher(req.Header(), m.GetPath(), m.GetRecursive(), m.GetIncludeEntry(), m.GetAllowNetworkMounts())
	if err != nil {
		return nil, rpcError(err)
	}
	wctx, stop := context.WithCancel(f.s.run.Context())
	pw := &pollWatcher{w: w, stop: stop}
	id := wire.NewID()
	if err := f.s.watchers.Add(id, pw); err != nil {
		stop()
		w.close()
		return nil, rpcError(err)
	}
	f.s.run.Go(func() { <-wctx.Done(); w.close() })
	f.s.run.Go(func() {
		w.run(func(ev *fspb.FilesystemEvent) {
			pw.mu.Lock()
			if len(pw.events) < maxPolledEvents {
				pw.events = append(pw.events, ev)
			}
			pw.mu.Unlock()
		})
	})
	return connect.NewResponse(&fspb.CreateWatcherResponse{WatcherId: id}), nil
}

func (f *filesystemServer) GetWatcherEvents(ctx context.Context, req *connect.Request[fspb.GetWatcherEventsRequest]) (*connect.Response[fspb.GetWatcherEventsResponse], error) {
	pw, err := f.s.watchers.Get(req.Msg.GetWatcherId())
	if err != nil {
		return nil, rpcError(errdefs.Newf(errdefs.ErrNotFound, "watcher '%s' not found", req.Msg.GetWatcherId()))
	}
	pw.mu.Lock()
	events := pw.events
	pw.events = nil
	pw.mu.Unlock()
	return connect.NewResponse(&fspb.GetWatcherEventsResponse{Events: events}), nil
}

func (f *filesystemServer) RemoveWatcher(ctx context.Context, req *connect.Request[fspb.RemoveWatcherRequest]) (*connect.Response[fspb.RemoveWatcherResponse], error) {
	pw, err := f.s.watchers.Remove(req.Msg.GetWatcherId())
	if err != nil {
		return nil, rpcError(errdefs.Newf(errdefs.ErrNotFound, "watcher '%s' not found", req.Msg.GetWatcherId()))
	}
	pw.stop()
	return connect.NewResponse(&fspb.RemoveWatcherResponse{}), nil
}
