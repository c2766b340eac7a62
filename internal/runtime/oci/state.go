package oci

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	gorunc "github.com/containerd/go-runc"

	"github.com/moat-sandbox/moat/internal/atomicfile"
	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/runtime"
)

// The persistent record of each sandbox (state.json) and what the OCI
// runtimes say about it: Status, List and Endpoint.

func (r *Runtime) sandboxesDir() string        { return filepath.Join(r.cfg.Root, "sandboxes") }
func (r *Runtime) sandboxDir(id string) string { return filepath.Join(r.sandboxesDir(), id) }

// stateRoot is the OCI runtime's --root for class.
func (r *Runtime) stateRoot(class string) string { return filepath.Join(r.cfg.RunRoot, class) }

// hasState reports whether the OCI runtime of class holds state for id:
// a directory for runc and crun, flat files for runsc.
func (r *Runtime) hasState(class, id string) bool {
	if r.kinds[class] == runscKind {
		return runscStateExists(r.stateRoot(class), id)
	}
	return exists(filepath.Join(r.stateRoot(class), id))
}

// stateIDs lists the container IDs the OCI runtime of class holds state
// for, read from its state directory (without running the runtime).
func (r *Runtime) stateIDs(class string) []string {
	ents, _ := os.ReadDir(r.stateRoot(class))
	var ids []string
	for _, e := range ents {
		id := e.Name()
		if r.kinds[class] == runscKind {
			var ok bool
			if id, _, ok = strings.Cut(id, "_sandbox:"); !ok || !strings.HasSuffix(e.Name(), ".state") {
				continue
			}
		} else if !e.IsDir() {
			continue
		}
		if runtime.ValidID(id) {
			ids = append(ids, id)
		}
	}
	return ids
}

// record is the persistent state of one sandbox (state.json).
type record struct {
	Spec      runtime.Spec `json:"spec"` // AgentToken is never stored (json:"-")
	Class     string       `json:"class"`
	IP        string       `json:"ip,omitempty"`
	CreatedAt time.Time    `json:"createdAt"`
	// Complete is set once the container has been started.
	Complete bool `json:"complete"`
	// Layers are the image layer directories of the root filesystem
	// (bottom first), pinned again when a restarted server re-adopts the
	// sandbox. Records of older builds lack them (see pinLayers).
	Layers []string `json:"layers,omitempty"`
	// Hibernated is set while the sandbox is hibernated (hibernate.go):
	// runtime.HibernateMemory or HibernateRestart, or hibSaving while a
	// runsc checkpoint for it is under way.
	Hibernated string `json:"hibernated,omitempty"`
}

func (r *Runtime) readRecord(id string) (record, error) {
	var rec record
	data, err := os.ReadFile(filepath.Join(r.sandboxDir(id), "state.json"))
	if errors.Is(err, os.ErrNotExist) {
		return rec, fmt.Errorf("sandbox %q: %w", id, errdefs.ErrNotFound)
	}
	if err != nil {
		return rec, fmt.Errorf("oci: %w", err)
	}
	if err := json.Unmarshal(data, &rec); err != nil {
		return rec, fmt.Errorf("oci: sandbox %q: corrupt state: %w: %w", id, err, errdefs.ErrInternal)
	}
	return rec, nil
}

func (r *Runtime) writeRecord(id string, rec record) error {
	data, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	return atomicfile.WriteFile(filepath.Join(r.sandboxDir(id), "state.json"), data, 0o600)
}

// containerState asks the OCI runtime about id; ok is false if the runtime
// has no such container.
func (r *Runtime) containerState(ctx context.Context, class, id string) (c *gorunc.Container, ok bool, err error) {
	if _, avail := r.classes[class]; !avail {
		return nil, false, fmt.Errorf("oci: class %q of sandbox %q is no longer installed: %w", class, id, errdefs.ErrUnavailable)
	}
	if !r.hasState(class, id) {
		return nil, false, nil
	}
	c, err = r.runc(class).State(ctx, id)
	if err != nil {
		if !r.hasState(class, id) {
			return nil, false, nil
		}
		return nil, false, fmt.Errorf("oci: %s state %s: %w: %w", class, id, err, errdefs.ErrUnavailable)
	}
	return c, true, nil
}

func (r *Runtime) status(id string, rec record, c *gorunc.Container, found bool) runtime.Status {
	st := runtime.Status{
		ID:        id,
		IP:        rec.IP,
		Class:     rec.Class,
		CreatedAt: rec.CreatedAt,
		Labels:    rec.Spec.Labels,
	}
	switch {
	case !rec.Complete:
		st.State = runtime.StateCreating
	case hibernated(rec) && !(found && (c.Status == "running" || c.Status == "paused")):
		st.State, st.Message = runtime.StatePaused, hibernatedMessage(rec.Hibernated)
		return st
	case !found:
		st.State = runtime.StateStopped
		st.Message = "container is gone from the OCI runtime (host reboot?)"
	default:
		st.Pid = c.Pid
		switch c.Status {
		case "running":
			st.State = runtime.StateRunning
			if c.Pid != 0 && !alive(c.Pid) {
				// runsc reports a sandbox whose process is a zombie not yet
				// reaped as running; a zombie is dead (as Stop counts it).
				st.State, st.Pid = runtime.StateStopped, 0
			}
		case "paused", "pausing":
			st.State = runtime.StatePaused
		case "stopped":
			st.State = runtime.StateStopped
			st.Pid = 0
		case "created", "creating":
			st.State = runtime.StateCreating
		default:
			st.State = runtime.StateUnknown
			st.Message = "OCI runtime status " + strconv.Quote(c.Status)
		}
	}
	if st.State == runtime.StateStopped {
		if data, err := os.ReadFile(filepath.Join(r.sandboxDir(id), "exit")); err == nil {
			code, reason := readExit(data)
			if code >= 0 {
				st.ExitCode = code
			}
			st.ExitReason = reason
			if reason == runtime.ExitReasonOOMKilled {
				st.Message = "OOM killed: the sandbox ran out of memory"
			}
		}
	}
	return st
}

// Status implements runtime.Runtime.
func (r *Runtime) Status(ctx context.Context, id string) (runtime.Status, error) {
	if !runtime.ValidID(id) {
		return runtime.Status{}, fmt.Errorf("sandbox %q: %w", id, errdefs.ErrNotFound)
	}
	rec, err := r.readRecord(id)
	if err != nil {
		return runtime.Status{}, err
	}
	if !rec.Complete {
		return r.status(id, rec, nil, false), nil
	}
	c, found, err := r.containerState(ctx, rec.Class, id)
	if err != nil {
		st := r.status(id, rec, nil, false)
		st.State, st.Message = runtime.StateUnknown, err.Error()
		return st, nil
	}
	return r.status(id, rec, c, found), nil
}

// List implements runtime.Runtime. It asks each OCI runtime once, after
// reading every record: a record read as complete then names a container
// the runtime had created before it was asked, so a create finishing
// meanwhile cannot make a live sandbox look gone (the liveness check used
// to delete such sandboxes).
func (r *Runtime) List(ctx context.Context) ([]runtime.Status, error) {
	entries, err := os.ReadDir(r.sandboxesDir())
	if err != nil {
		return nil, fmt.Errorf("oci: %w", err)
	}
	type item struct {
		id  string
		rec record
	}
	var items []item
	var out []runtime.Status
	for _, e := range entries {
		id := e.Name()
		if !e.IsDir() || !runtime.ValidID(id) {
			continue
		}
		rec, err := r.readRecord(id)
		if errdefs.IsNotFound(err) {
			continue // Create has made the directory but not the record yet
		}
		if err != nil {
			out = append(out, runtime.Status{ID: id, State: runtime.StateUnknown, Message: err.Error()})
			continue
		}
		items = append(items, item{id, rec})
	}
	containers := map[string]map[string]*gorunc.Container{}
	listed := map[string]error{}
	for _, it := range items {
		class := it.rec.Class
		if _, done := listed[class]; done || !it.rec.Complete {
			continue
		}
		listed[class] = nil
		if _, avail := r.classes[class]; !avail {
			listed[class] = fmt.Errorf("class %q is not installed", class)
		} else if cs, err := r.runc(class).List(ctx); err != nil {
			listed[class] = err
		} else {
			m := map[string]*gorunc.Container{}
			for _, c := range cs {
				m[c.ID] = c
			}
			containers[class] = m
		}
	}
	if r.afterRuncList != nil {
		r.afterRuncList()
	}
	for _, it := range items {
		id, rec := it.id, it.rec
		if lerr := listed[rec.Class]; lerr != nil && rec.Complete {
			// `runc list` fails as a whole now and then (seen under churn
			// right after a crash); one bad answer must not make every
			// sandbox of the class look dead. Ask about this one alone.
			c, found, err := r.containerState(ctx, rec.Class, id)
			if err != nil {
				st := r.status(id, rec, nil, false)
				st.State, st.Message = runtime.StateUnknown, fmt.Sprintf("list: %v; state: %v", lerr, err)
				out = append(out, st)
				continue
			}
			out = append(out, r.status(id, rec, c, found))
			continue
		}
		c, found := containers[rec.Class][id]
		out = append(out, r.status(id, rec, c, found))
	}
	return out, nil
}

// Endpoint implements runtime.Runtime.
func (r *Runtime) Endpoint(ctx context.Context, id string, port int) (string, error) {
	if port <= 0 || port > 65535 {
		return "", runtime.Invalid("invalid port %d", port)
	}
	if !runtime.ValidID(id) {
		return "", fmt.Errorf("sandbox %q: %w", id, errdefs.ErrNotFound)
	}
	rec, err := r.readRecord(id)
	if err != nil {
		return "", err
	}
	if rec.IP == "" {
		return "", fmt.Errorf("sandbox %q has no address yet: %w", id, errdefs.ErrFailedPrecondition)
	}
	return rec.IP + ":" + strconv.Itoa(port), nil
}

func exists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// readPid reads a pid file written by the OCI runtime.
func readPid(path string) (int, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, fmt.Errorf("oci: pid file: %w", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil || pid <= 0 {
		return 0, fmt.Errorf("oci: bad pid file %q: %w", data, errdefs.ErrInternal)
	}
	return pid, nil
}
