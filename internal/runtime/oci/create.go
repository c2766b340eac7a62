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
	if err := os.Mkdir(dir, 0o700); err != nil {
		if errors.Is(err, os.ErrExist) {
			return runtime.Status{}, fmt.Errorf("sandbox %q: %w", id, errdefs.ErrAlreadyExists)
		}
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
	var att network.Attachment
	var netErr error
	netDone := make(chan struct{})
	go func() {
		defer close(netDone)
		att, netErr = r.net.Setup(ctx, id)
	}()
	defer func() { <-netDone }()
	img, err := r.images.Rootfs(ctx, id, spec.Image)
	if err != nil {
		return runtime.Status{}, fmt.Errorf("oci: image %q: %w", spec.Image, err)
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
			return runtime.Status{}, fmt.Errorf("oci: %w", err)
		}
	}
	if disk > 0 {
		if err := setupDisk(ctx, dir, disk); err != nil {
			return runtime.Status{}, err
		}
		phase("disk")
	} else if err := os.Chmod(filepath.Join(dir, "upper"), 0o755); err != nil {
		// The container root must be traversable by non-root users.
		return runtime.Status{}, fmt.Errorf("oci: %w", err)
	}
	rootfs := filepath.Join(dir, "rootfs")
	upper, work := writableDirs(dir)
	if err := image.MountRootfs(img.Layers, upper, work, rootfs); err != nil {
		return runtime.Status{}, fmt.Errorf("oci: %w", err)
	}
	// Private, so that the host's copy can be dropped after the start
	// (Runtime.dropRootfs) without the unmount reaching the sandbox's copy.
	if err := unix.Mount("", rootfs, "", unix.MS_PRIVATE, ""); err != nil {
		return runtime.Status{}, fmt.Errorf("oci: make %s private: %w", rootfs, err)
	}
	volumes, err := prepareVolumes(dir, spec.Mounts, func(name string) (string, error) { return r.vols.Acquire(ctx, name, id) })
	if err != nil {
		return runtime.Status{}, err
	}
	phase("mount")
	rec.Layers = img.Layers

	// Everything but the hosts file (the sandbox's address) is written
	// while the network is still being set up.
	files := filepath.Join(dir, "files")
	hostname := id
	if len(hostname) > 12 {
		hostname = strings.TrimRight(hostname[:12], "-")
	}
	agentConf, err := json.Marshal(agentproto.Config{Token: spec.AgentToken, Port: agentproto.Port})
	if err != nil {
		return runtime.Status{}, err
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
			return runtime.Status{}, fmt.Errorf("oci: %w", err)
		}
	}

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
		cwd = img.Config.WorkingDir
	}
	if cwd == "" {
		cwd = "/"
	}
	netnsPath := r.net.NetnsPath(id)
	ociSpec := buildSpec(bundleInput{
		ID:           id,
		Hostname:     hostname,
		Rootfs:       rootfs,
		Args:         processArgs(spec, img.Config),
		Env:          processEnv(img.Config.Env, spec.Env),
		Cwd:          cwd,
		AgentBin:     r.cfg.AgentPath,
		AgentConf:    filepath.Join(files, "agent.json"),
		HostsFile:    filepath.Join(files, "hosts"),
		HostnameFile: filepath.Join(files, "hostname"),
		ResolvConf:   filepath.Join(files, "resolv.conf"),
		NetnsPath:    netnsPath,
		CgroupsPath:  r.cgroupPath(id),
		Resources:    res,
		Volumes:      volumes,
	})
	if spec.Checkpoint != "" {
		if err := r.restoreProcess(spec.Checkpoint, ociSpec.Process); err != nil {
			return runtime.Status{}, err
		}
	}
	data, err := json.Marshal(ociSpec)
	if err != nil {
		return runtime.Status{}, err
	}
	bundle := filepath.Join(dir, "bundle")
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), data, 0o600); err != nil {
		return runtime.Status{}, fmt.Errorf("oci: %w", err)
	}
	phase("bundle")

	<-netDone
	if netErr != nil {
		return runtime.Status{}, netErr
	}
	if att.NetnsPath != netnsPath {
		return runtime.Status{}, fmt.Errorf("oci: network namespace of %s at %s, not %s: %w", id, att.NetnsPath, netnsPath, errdefs.ErrInternal)
	}
	phase("network")
	rec.IP = att.IP.String()
	hosts := fmt.Appendf(nil, "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n%s\t%s\n", att.IP, hostname)
	if err := os.WriteFile(filepath.Join(files, "hosts"), hosts, 0o644); err != nil {
		return runtime.Status{}, fmt.Errorf("oci: %w", err)
	}

	logf, err := os.OpenFile(filepath.Join(dir, "agent.log"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return runtime.Status{}, fmt.Errorf("oci: %w", err)
	}
	defer logf.Close()
	pidFile := filepath.Join(dir, "pid")
	rc := r.runc(spec.Class)
	// One `run --detach` is a single exec of the runtime, measurably faster
	// than `create` followed by `start`.
	run := func() error {
		if spec.Checkpoint != "" {
			return r.restore(ctx, spec.Class, id, bundle, spec.Checkpoint, fileIO{logf}, pidFile)
		}
		_, err := rc.Run(ctx, id, bundle, &gorunc.CreateOpts{
			IO:      fileIO{logf},
			PidFile: pidFile,
			Detach:  true,
		})
		return err
	}
	if r.kinds[spec.Class] == runscKind {
		err = runscStart(att.NetnsPath, run)
	} else {
		err = run()
	}
	if err != nil {
		return runtime.Status{}, fmt.Errorf("oci: start %s: %w: %s: %w", spec.Class, err, tail(filepath.Join(dir, "agent.log")), errdefs.ErrInternal)
	}
	phase("run")
	pid, err := readPid(pidFile)
	if err != nil {
		return runtime.Status{}, err
	}
	if r.kinds[spec.Class] != runscKind {
		r.dropRootfs(rootfs)
		phase("drop")
	}
	r.track(pid, id)
	r.trackHelpers(spec.Class, id, pid)
	rec.Complete = true
	if err := r.writeRecord(id, rec); err != nil {
		return runtime.Status{}, fmt.Errorf("oci: %w", err)
	}
	return runtime.Status{
		ID:        id,
		State:     runtime.StateRunning,
		Pid:       pid,
		IP:        rec.IP,
		Class:     rec.Class,
		CreatedAt: rec.CreatedAt,
		Labels:    spec.Labels,
	}, nil
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
