package oci

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	gorunc "github.com/containerd/go-runc"
	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/internal/agentproto"
	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/image"
	"github.com/moat-sandbox/moat/internal/network"
	"github.com/moat-sandbox/moat/internal/runtime"
)

// Create: validate the spec, then the steps in order (state dir and
// record, network in parallel with the overlay root, the sandbox files and
// the OCI bundle, then the hosts file with the sandbox's address, `run
// --detach`), rolled back by cleanup on any failure.

// validate checks spec: the common rules (runtime.Spec.Validate), then
// this backend's extras: an installed class (filled in with the default),
// a checkpoint it can restore, the quota filesystem's minimum size, and
// host mount sources that exist.
func (r *Runtime) validate(spec *runtime.Spec) error {
	if err := spec.Validate(); err != nil {
		return err
	}
	if spec.Checkpoint != "" {
		if err := r.validateRestore(spec); err != nil {
			return err
		}
	}
	if spec.Class == "" {
		spec.Class = r.cfg.DefaultClass
	}
	if _, ok := r.classes[spec.Class]; !ok {
		return runtime.Invalid("runtime class %q is not available", spec.Class)
	}
	if d := spec.Resources.DiskBytes; d != 0 && d < minDiskBytes {
		return runtime.Invalid("disk limit must be at least %d MiB", minDiskBytes>>20)
	}
	for _, m := range spec.Mounts {
		if m.Volume != "" {
			continue
		}
		if _, err := os.Stat(m.Source); err != nil {
			return runtime.Invalid("mount source %s: %v", m.Source, err)
		}
	}
	return nil
}

// Create implements runtime.Runtime.
func (r *Runtime) Create(ctx context.Context, spec runtime.Spec) (_ runtime.Status, err error) {
	if err := r.validate(&spec); err != nil {
		return runtime.Status{}, err
	}
	if r.creating.Add(1) == 1 {
		r.warmCgroupAttach()
	}
	defer r.creating.Add(-1)
	id := spec.ID
	dir := r.sandboxDir(id)
	t0 := time.Now()
	var phases []any
	phase := func(name string) {
		phases = append(phases, name, time.Since(t0))
	}
	defer func() {
		if err == nil {
			r.log.Debug("oci: created", append([]any{"id", id, "class", spec.Class}, phases...)...)
		}
	}()
	if err := os.Mkdir(dir, 0o700); errors.Is(err, os.ErrExist) {
		return runtime.Status{}, fmt.Errorf("sandbox %q: %w", id, errdefs.ErrAlreadyExists)
	} else if err != nil {
		return runtime.Status{}, fmt.Errorf("oci: %w", err)
	}
	defer func() {
		if err != nil {
			if cerr := r.cleanup(context.WithoutCancel(ctx), id); cerr != nil {
				r.log.Error("oci: rollback of failed create left resources", "id", id, "err", cerr)
			}
		}
	}()
	rec := record{Spec: spec, Class: spec.Class, CreatedAt: time.Now().UTC()}
	if err := r.writeRecord(id, rec); err != nil {
		return runtime.Status{}, fmt.Errorf("oci: %w", err)
	}
	// The network is independent of the filesystem: set it up meanwhile.
	// The wait is deferred after the rollback, so it runs before it.
	netUp := r.setupNetwork(ctx, id)
	defer netUp()
	root, err := r.prepareRoot(ctx, spec, phase)
	if err != nil {
		return runtime.Status{}, err
	}
	rec.Layers = root.img.Layers
	// Everything but the hosts file (the sandbox's address) is written
	// while the network is still being set up.
	hostname, err := r.writeFiles(spec)
	if err != nil {
		return runtime.Status{}, err
	}
	bundle, netnsPath, err := r.writeBundle(spec, hostname, root)
	if err != nil {
		return runtime.Status{}, err
	}
	phase("bundle")

	att, err := netUp()
	if err != nil {
		return runtime.Status{}, err
	}
	if att.NetnsPath != netnsPath {
		return runtime.Status{}, fmt.Errorf("oci: network namespace of %s at %s, not %s: %w", id, att.NetnsPath, netnsPath, errdefs.ErrInternal)
	}
	phase("network")
	rec.IP = att.IP.String()
	if err := writeHosts(dir, att, hostname); err != nil {
		return runtime.Status{}, err
	}
	img := ""
	if spec.Checkpoint != "" {
		img = filepath.Join(r.checkpointDir(spec.Checkpoint), "image")
	}
	pid, err := r.start(ctx, spec, bundle, att.NetnsPath, img)
	if err != nil {
		return runtime.Status{}, err
	}
	phase("run")
	return r.complete(spec, root, pid, rec, phase)
}

// setupNetwork sets up sandbox id's network in the background, so that
// Create prepares the filesystem meanwhile. The function it returns waits
// for the setup and returns its attachment; it may be called again (the
// rollback's wait).
func (r *Runtime) setupNetwork(ctx context.Context, id string) func() (network.Attachment, error) {
	var att network.Attachment
	var err error
	done := make(chan struct{})
	go func() {
		defer close(done)
		att, err = r.net.Setup(ctx, id)
	}()
	return func() (network.Attachment, error) {
		<-done
		return att, err
	}
}

// complete ends the create of a started sandbox: the host's mount of its
// root is dropped (dropRootfs; not for runsc's), its processes are
// tracked, and its record is marked complete (New removes a sandbox
// whose record is not: a create that never ended).
func (r *Runtime) complete(spec runtime.Spec, root preparedRoot, pid int, rec record, phase func(string)) (runtime.Status, error) {
	id := spec.ID
	if r.kinds[spec.Class] != runscKind {
		r.dropRootfs(root.rootfs)
		phase("drop")
	}
	r.track(pid, id)
	r.trackHelpers(spec.Class, id, pid)
	rec.Complete = true
	if err := r.writeRecord(id, rec); err != nil {
		return runtime.Status{}, fmt.Errorf("oci: %w", err)
	}
	return runtime.Status{ID: id, State: runtime.StateRunning, Pid: pid, IP: rec.IP,
		Class: rec.Class, CreatedAt: rec.CreatedAt, Labels: spec.Labels}, nil
}

// writeHosts writes the sandbox's /etc/hosts, which names its address.
func writeHosts(dir string, att network.Attachment, hostname string) error {
	hosts := fmt.Appendf(nil, "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n%s\t%s\n", att.IP, hostname)
	if err := os.WriteFile(filepath.Join(dir, "files", "hosts"), hosts, 0o644); err != nil {
		return fmt.Errorf("oci: %w", err)
	}
	return nil
}

// preparedRoot is the container root prepareRoot mounted.
type preparedRoot struct {
	img     Rootfs
	rootfs  string          // the overlay mount point
	volumes []runtime.Mount // host binds of spec.Mounts (prepareVolumes)
}

// prepareRoot makes the sandbox's directories, the quota filesystem if
// there is a disk limit, the overlay root over the image layers, and the
// host side of its volumes.
func (r *Runtime) prepareRoot(ctx context.Context, spec runtime.Spec, phase func(string)) (preparedRoot, error) {
	id, dir := spec.ID, r.sandboxDir(spec.ID)
	img, err := r.images.Rootfs(ctx, id, spec.Image)
	if err != nil {
		return preparedRoot{}, fmt.Errorf("oci: image %q: %w", spec.Image, err)
	}
	disk := spec.Resources.DiskBytes
	if disk == 0 {
		disk = r.cfg.Resources.DiskBytes
	}
	dirs := []string{"rootfs", "bundle", "files"}
	if disk == 0 {
		dirs = append(dirs, "upper", "work")
	}
	for _, d := range dirs {
		if err := os.Mkdir(filepath.Join(dir, d), 0o700); err != nil {
			return preparedRoot{}, fmt.Errorf("oci: %w", err)
		}
	}
	if disk > 0 {
		if err := setupDisk(ctx, dir, disk); err != nil {
			return preparedRoot{}, err
		}
		phase("disk")
	} else if err := os.Chmod(filepath.Join(dir, "upper"), 0o755); err != nil {
		// The container root must be traversable by non-root users.
		return preparedRoot{}, fmt.Errorf("oci: %w", err)
	}
	rootfs := filepath.Join(dir, "rootfs")
	upper, work := writableDirs(dir)
	if err := image.MountRootfs(img.Layers, upper, work, rootfs); err != nil {
		return preparedRoot{}, fmt.Errorf("oci: %w", err)
	}
	// Private, so that the host's copy can be dropped after the start
	// (Runtime.dropRootfs) without the unmount reaching the sandbox's copy.
	if err := unix.Mount("", rootfs, "", unix.MS_PRIVATE, ""); err != nil {
		return preparedRoot{}, fmt.Errorf("oci: make %s private: %w", rootfs, err)
	}
	volumes, err := prepareVolumes(dir, spec.Mounts, func(name string) (string, error) { return r.vols.Acquire(ctx, name, id) })
	if err != nil {
		return preparedRoot{}, err
	}
	phase("mount")
	return preparedRoot{img: img, rootfs: rootfs, volumes: volumes}, nil
}

// writeFiles writes the sandbox's agent.json, hostname and resolv.conf
// and returns its hostname.
func (r *Runtime) writeFiles(spec runtime.Spec) (string, error) {
	files := filepath.Join(r.sandboxDir(spec.ID), "files")
	hostname := spec.ID
	if len(hostname) > 12 {
		hostname = strings.TrimRight(hostname[:12], "-")
	}
	agentConf, err := json.Marshal(agentproto.Config{Token: spec.AgentToken, Port: agentproto.Port})
	if err != nil {
		return "", err
	}
	for name, content := range map[string][]byte{
		"agent.json":  agentConf,
		"hostname":    []byte(hostname + "\n"),
		"resolv.conf": r.resolvConf(),
	} {
		perm := os.FileMode(0o644)
		if name == "agent.json" {
			perm = 0o600
		}
		if err := os.WriteFile(filepath.Join(files, name), content, perm); err != nil {
			return "", fmt.Errorf("oci: %w", err)
		}
	}
	return hostname, nil
}

// writeBundle writes the OCI bundle's config.json and returns the bundle
// directory and the network namespace path the config names.
func (r *Runtime) writeBundle(spec runtime.Spec, hostname string, root preparedRoot) (bundle, netnsPath string, err error) {
	id, dir := spec.ID, r.sandboxDir(spec.ID)
	files := filepath.Join(dir, "files")
	res := spec.Resources
	if res.CPUMillis == 0 {
		res.CPUMillis = r.cfg.Resources.CPUMillis
	}
	if res.MemoryBytes == 0 {
		res.MemoryBytes = r.cfg.Resources.MemoryBytes
	}
	if res.PidsLimit == 0 {
		res.PidsLimit = r.cfg.Resources.PidsLimit
	}
	if r.kinds[spec.Class] == runscKind && res.PidsLimit > 0 {
		res.PidsLimit += runscPidsHeadroom
	}
	cwd := spec.WorkingDir
	if cwd == "" {
		cwd = root.img.Config.WorkingDir
	}
	if cwd == "" {
		cwd = "/"
	}
	netnsPath = r.net.NetnsPath(id)
	ociSpec := buildSpec(bundleInput{
		ID:           id,
		Hostname:     hostname,
		Rootfs:       root.rootfs,
		Args:         processArgs(spec, root.img.Config),
		Env:          processEnv(root.img.Config.Env, spec.Env),
		Cwd:          cwd,
		AgentBin:     r.cfg.AgentPath,
		AgentConf:    filepath.Join(files, "agent.json"),
		HostsFile:    filepath.Join(files, "hosts"),
		HostnameFile: filepath.Join(files, "hostname"),
		ResolvConf:   filepath.Join(files, "resolv.conf"),
		NetnsPath:    netnsPath,
		CgroupsPath:  r.cgroupPath(id),
		Resources:    res,
		Volumes:      root.volumes,
	})
	if spec.Checkpoint != "" {
		if err := r.restoreProcess(spec.Checkpoint, ociSpec.Process); err != nil {
			return "", "", err
		}
	}
	data, err := json.Marshal(ociSpec)
	if err != nil {
		return "", "", err
	}
	bundle = filepath.Join(dir, "bundle")
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), data, 0o600); err != nil {
		return "", "", fmt.Errorf("oci: %w", err)
	}
	return bundle, netnsPath, nil
}

// start runs the container (`run --detach`, or a restore from the runsc
// image in directory img) with its output appended to agent.log, and
// returns the PID of its init.
func (r *Runtime) start(ctx context.Context, spec runtime.Spec, bundle, netnsPath, img string) (int, error) {
	id, dir := spec.ID, r.sandboxDir(spec.ID)
	logf, err := os.OpenFile(filepath.Join(dir, "agent.log"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return 0, fmt.Errorf("oci: %w", err)
	}
	defer logf.Close()
	pidFile := filepath.Join(dir, "pid")
	rc := r.runc(spec.Class)
	// One `run --detach` is a single exec of the runtime, measurably faster
	// than `create` followed by `start`.
	run := func() error {
		if img != "" {
			return r.restore(ctx, spec.Class, id, bundle, img, fileIO{logf}, pidFile)
		}
		_, err := rc.Run(ctx, id, bundle, &gorunc.CreateOpts{
			IO:      fileIO{logf},
			PidFile: pidFile,
			Detach:  true,
		})
		return err
	}
	if r.kinds[spec.Class] == runscKind {
		err = runscStart(netnsPath, run)
	} else {
		err = run()
	}
	if err != nil {
		return 0, fmt.Errorf("oci: start %s: %w: %s: %w", spec.Class, err, tail(filepath.Join(dir, "agent.log")), errdefs.ErrInternal)
	}
	return readPid(pidFile)
}

// resolvConf is the content of every sandbox's /etc/resolv.conf.
func (r *Runtime) resolvConf() []byte {
	var b strings.Builder
	if len(r.cfg.DNSServers) > 0 {
		for _, s := range r.cfg.DNSServers {
			fmt.Fprintf(&b, "nameserver %s\n", s)
		}
		return []byte(b.String())
	}
	host, _ := os.ReadFile("/etc/resolv.conf")
	for line := range strings.SplitSeq(string(host), "\n") {
		f := strings.Fields(line)
		// The host's loopback resolvers are unreachable from a sandbox.
		if len(f) >= 2 && f[0] == "nameserver" && (strings.HasPrefix(f[1], "127.") || f[1] == "::1") {
			continue
		}
		b.WriteString(line)
		b.WriteByte('\n')
	}
	return []byte(strings.TrimRight(b.String(), "\n") + "\n")
}

// fileIO hands a log file to the runtime as the container's stdout and
// stderr (stdin is /dev/null). With --detach the container inherits the
// descriptors directly, so no copying goroutine is involved.
type fileIO struct{ f *os.File }

func (fileIO) Close() error          { return nil }
func (fileIO) Stdin() io.WriteCloser { return nil }
func (fileIO) Stdout() io.ReadCloser { return nil }
func (fileIO) Stderr() io.ReadCloser { return nil }
func (i fileIO) Set(cmd *exec.Cmd)   { cmd.Stdout, cmd.Stderr = i.f, i.f }

// tail returns the last lines of a log file for error messages.
func tail(path string) string {
	data, _ := os.ReadFile(path)
	if len(data) > 2048 {
		data = data[len(data)-2048:]
	}
	return strings.TrimSpace(string(data))
}
