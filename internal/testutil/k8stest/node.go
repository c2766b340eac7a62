package k8stest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/vishvananda/netlink"
	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/moat-sandbox/moat/config/crd"
	"github.com/moat-sandbox/moat/internal/release"
	"github.com/moat-sandbox/moat/internal/testutil/localregistry"
)

// Node is a real single-node cluster for tests and `moat bench k8s`
// (PersistentVolumeClaims get hostPath volumes under its directory):
// kube-apiserver and etcd (envtest), kube-scheduler,
// kube-controller-manager, a kubelet and containerd 2 with runc and the
// CNI bridge plugin, all built from the Go module proxy by
// scripts/build-k8s-tools.sh (runc from Debian). Images come from an
// in-process loopback registry (Registry), the pod sandbox ("pause")
// image included: nothing is pulled from outside the machine.
//
// Isolation from the host and from other test runs: containerd and the
// kubelet run in a private mount namespace of their own (their mounts,
// the pods' network namespace files and the shim sockets vanish with it),
// where the kernel settings the kubelet insists on (vm.overcommit_memory,
// kernel.panic, ...) are stubbed, so the host's are never changed. Pods
// get addresses on a bridge and a /24 that no host route overlaps, their
// cgroups live under a cgroup root of their own, and every port is picked
// free on loopback. Stop removes all of it.
//
// Like a production cluster running sandboxes, the node enforces the
// ingress rules of NetworkPolicies (netpol.go) and gives pods no IPv6
// (the CNI chain's tuning plugin disables it in each pod's netns).
type Node struct {
	// Config is an admin client configuration.
	Config *rest.Config
	// Kubeconfig is a kubeconfig file for Config (for subprocesses).
	Kubeconfig string
	// Name is the node's name.
	Name string
	// Registry serves the images pods run (Host is 127.0.0.1:port).
	Registry *localregistry.Registry
	// Subnet is the pods' network; Gateway is the host's address on it.
	Subnet  *net.IPNet
	Gateway net.IP
	// ContainerdSocket is the CRI endpoint of the node's containerd.
	ContainerdSocket string
	// RuntimeClasses are the RuntimeClasses beyond the default (runc) the
	// node offers: "runsc" (gVisor) when runsc and its containerd shim,
	// containerd-shim-runsc-v1, are on PATH (scripts/build-runsc.sh).
	RuntimeClasses []string

	dir        string
	env0       []string
	env        *envtest.Environment
	bridge     string
	cgroupName string
	holder     *exec.Cmd
	procs      []*nodeProc
	stopOnce   sync.Once
	apiLog     *os.File
	// stopProvisioner ends the hostPath volume provisioner.
	stopProvisioner context.CancelFunc
	provWG          sync.WaitGroup
}

type nodeProc struct {
	name string
	cmd  *exec.Cmd
	log  *os.File
	done chan struct{}
}

// NodeTools are the binaries StartNode needs from AssetsDir.
var NodeTools = []string{"kube-apiserver", "etcd", "kube-scheduler", "kube-controller-manager", "kubelet",
	"containerd", "containerd-shim-runc-v2", "ctr", "crictl", "helm", "cni/bridge", "cni/host-local", "cni/loopback", "cni/tuning"}

// MissingNodeTools returns the node tools absent from AssetsDir (and
// runc, unshare and nsenter from the host), nil when all are present.
func MissingNodeTools() []string {
	var out []string
	for _, b := range NodeTools {
		if fi, err := os.Stat(filepath.Join(AssetsDir(), b)); err != nil || fi.Mode()&0o111 == 0 {
			out = append(out, b)
		}
	}
	for _, b := range []string{"runc", "unshare", "nsenter", "mount"} {
		if _, err := exec.LookPath(b); err != nil {
			out = append(out, b)
		}
	}
	return out
}

// NodeOptions tune StartNode.
type NodeOptions struct {
	// Name is used in the node, bridge and cgroup names (default
	// "moat"); keep it short and unique per concurrent test run.
	Name string
	// Bridge, Subnet and CgroupRoot override the pods' bridge name, their
	// network (a /24 or larger whose first address is the host's) and the
	// kubelet's cgroup root (tests pass a testnet lease's). Defaults:
	// "mkn-<Name>", a free 10.240.0.0/12 /24, /moat-kubenode-<dir>.
	Bridge     string
	Subnet     *net.IPNet
	CgroupRoot string
	// Env is added to every component's environment (a testnet marker).
	Env []string
	// PauseRootfs is a rootfs directory holding /bin/sleep (a static
	// busybox tree); the pod sandbox image is built from it.
	PauseRootfs string
	// Log receives the components' output when a start fails (default
	// os.Stderr).
	Log io.Writer
}

// kernelStubs are the sysctls the kubelet sets (or, with
// protectKernelDefaults, insists on), with the values it wants; the node
// shows it these values in its own mount namespace.
var kernelStubs = map[string]string{
	"vm/overcommit_memory":      "1",
	"vm/panic_on_oom":           "0",
	"kernel/panic":              "10",
	"kernel/panic_on_oops":      "1",
	"kernel/keys/root_maxkeys":  "1000000",
	"kernel/keys/root_maxbytes": "25000000",
}

// StartNode brings up the cluster; stop it with Stop (which also runs
// when the start fails).
func StartNode(ctx context.Context, o NodeOptions) (_ *Node, err error) {
	if m := MissingNodeTools(); len(m) > 0 {
		return nil, fmt.Errorf("k8stest: node tools missing: %s (run scripts/build-k8s-tools.sh)", strings.Join(m, ", "))
	}
	if o.Name == "" {
		o.Name = "moat"
	}
	if o.Log == nil {
		o.Log = os.Stderr
	}
	if o.PauseRootfs == "" {
		return nil, errors.New("k8stest: NodeOptions.PauseRootfs is required")
	}
	dir, err := os.MkdirTemp("", "moat-kubenode-")
	if err != nil {
		return nil, err
	}
	n := &Node{dir: dir, Name: "node-" + o.Name, env0: o.Env, cgroupName: strings.TrimPrefix(o.CgroupRoot, "/")}
	defer func() {
		if err != nil {
			fmt.Fprintf(o.Log, "k8stest: node start failed: %v\n%s", err, n.Logs())
			n.Stop()
		}
	}()
	if err := n.startNetwork(o.Name, o.Bridge, o.Subnet); err != nil {
		return nil, err
	}
	if err := n.startControlPlane(); err != nil {
		return nil, err
	}
	if n.Registry, err = localregistry.Start(); err != nil {
		return nil, err
	}
	pause, err := n.Registry.PushDirConfig(ctx, o.PauseRootfs, "pause:3.10", v1.Config{
		Entrypoint: []string{"/bin/sleep", "2147483647"},
	})
	if err != nil {
		return nil, err
	}
	if err := n.startRuntime(o.Name, pause); err != nil {
		return nil, err
	}
	if err := n.startKubelet(ctx); err != nil {
		return nil, err
	}
	if err := n.createRuntimeClasses(ctx); err != nil {
		return nil, err
	}
	for _, p := range n.procs {
		select {
		case <-p.done:
			return nil, fmt.Errorf("k8stest: %s exited: %v", p.name, p.cmd.ProcessState)
		default:
		}
	}
	pctx, cancel := context.WithCancel(context.Background())
	n.stopProvisioner = cancel
	n.provWG.Add(1)
	go func() { defer n.provWG.Done(); n.provisionVolumes(pctx) }()
	n.provWG.Add(1)
	go func() { defer n.provWG.Done(); n.enforcePolicies(pctx) }()
	return n, nil
}

// path returns a file of the node's directory.
func (n *Node) path(parts ...string) string {
	return filepath.Join(append([]string{n.dir}, parts...)...)
}

// startNetwork creates the pods' bridge with a free /24.
func (n *Node) startNetwork(name, bridge string, subnet *net.IPNet) error {
	if subnet == nil {
		var err error
		if subnet, err = freeSubnet(); err != nil {
			return err
		}
	}
	n.Subnet = subnet
	n.Gateway = append(net.IP(nil), subnet.IP.To4()...)
	n.Gateway[3]++
	n.bridge = bridge
	if n.bridge == "" {
		n.bridge = "mkn-" + name
	}
	if len(n.bridge) > 15 {
		n.bridge = n.bridge[:15]
	}
	if l, err := netlink.LinkByName(n.bridge); err == nil {
		netlink.LinkDel(l) // a leftover of a killed run of the same name
	}
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: n.bridge}}
	if err := netlink.LinkAdd(br); err != nil {
		n.bridge = ""
		return fmt.Errorf("k8stest: create bridge: %w", err)
	}
	addr := &netlink.Addr{IPNet: &net.IPNet{IP: n.Gateway, Mask: subnet.Mask}}
	if err := netlink.AddrAdd(br, addr); err != nil {
		return fmt.Errorf("k8stest: bridge address: %w", err)
	}
	return netlink.LinkSetUp(br)
}

// freeSubnet picks a 10.x.y.0/24 that no host route or address overlaps.
func freeSubnet() (*net.IPNet, error) {
	routes, err := netlink.RouteList(nil, netlink.FAMILY_V4)
	if err != nil {
		return nil, err
	}
	addrs, _ := netlink.AddrList(nil, netlink.FAMILY_V4)
	overlaps := func(c *net.IPNet) bool {
		for _, r := range routes {
			if r.Dst != nil && (r.Dst.Contains(c.IP) || c.Contains(r.Dst.IP)) {
				return true
			}
		}
		for _, a := range addrs {
			if a.IPNet.Contains(c.IP) || c.Contains(a.IP) {
				return true
			}
		}
		return false
	}
	// 10.240.0.0/12 down to 10.255: far from the ranges other moat tests use.
	for x := 240; x < 256; x++ {
		for y := 0; y < 256; y += 7 {
			c := &net.IPNet{IP: net.IPv4(10, byte(x), byte(y), 0).To4(), Mask: net.CIDRMask(24, 32)}
			if !overlaps(c) {
				return c, nil
			}
		}
	}
	return nil, errors.New("k8stest: no free /24 in 10.240.0.0/12")
}

func (n *Node) startControlPlane() error {
	crds, err := crd.Objects()
	if err != nil {
		return err
	}
	n.env = &envtest.Environment{
		BinaryAssetsDirectory:    AssetsDir(),
		CRDs:                     crds,
		ErrorIfCRDPathMissing:    true,
		ControlPlaneStartTimeout: 2 * time.Minute,
		ControlPlaneStopTimeout:  time.Minute,
	}
	// A real node needs service account tokens in its pods.
	n.env.ControlPlane.GetAPIServer().Configure().Disable("disable-admission-plugins")
	// Its output, for the failure report of a start or a stop.
	if n.apiLog, err = os.Create(n.path("kube-apiserver.log")); err != nil {
		return err
	}
	n.env.ControlPlane.GetAPIServer().Out, n.env.ControlPlane.GetAPIServer().Err = n.apiLog, n.apiLog
	if n.Config, err = n.env.Start(); err != nil {
		return fmt.Errorf("k8stest: start control plane: %w", err)
	}
	n.Config.QPS, n.Config.Burst = 1000, 2000
	n.Kubeconfig = n.path("kubeconfig")
	if err := writeAdminKubeconfig(n.env, n.Kubeconfig); err != nil {
		return err
	}
	ca := n.path("ca.crt")
	if err := os.WriteFile(ca, n.Config.CAData, 0o600); err != nil {
		return err
	}
	sched, err := freePort()
	if err != nil {
		return err
	}
	if err := n.start("kube-scheduler", nil, filepath.Join(AssetsDir(), "kube-scheduler"),
		"--kubeconfig="+n.Kubeconfig, "--leader-elect=false", "--bind-address=127.0.0.1", "--secure-port="+sched); err != nil {
		return err
	}
	kcm, err := freePort()
	if err != nil {
		return err
	}
	return n.start("kube-controller-manager", nil, filepath.Join(AssetsDir(), "kube-controller-manager"),
		"--kubeconfig="+n.Kubeconfig, "--leader-elect=false", "--bind-address=127.0.0.1", "--secure-port="+kcm,
		"--service-account-private-key-file="+filepath.Join(n.env.ControlPlane.APIServer.CertDir, "sa-signer.key"),
		"--root-ca-file="+ca, "--use-service-account-credentials=false",
		"--controllers=*,-csrsigning,-nodeipam")
}

// startRuntime starts the mount namespace holder and containerd in it:
// the registry's hosts file, the CNI chain and containerd's config are
// written first (containerd reads them all at its start), then the
// namespace is made and containerd started in it.
func (n *Node) startRuntime(name, pauseImage string) error {
	for _, d := range []string{"containerd/root", "containerd/state", "containerd/opt", "net.d", "cni-data", "certs.d", "pods", "kubelet", "stubs"} {
		if err := os.MkdirAll(n.path(d), 0o755); err != nil {
			return err
		}
	}
	if err := n.writeRegistryHosts(); err != nil {
		return err
	}
	if err := n.writeCNIConfig(); err != nil {
		return err
	}
	if err := n.writeContainerdConfig(pauseImage); err != nil {
		return err
	}
	if err := n.startMountNamespace(); err != nil {
		return err
	}
	env := []string{"PATH=" + AssetsDir() + ":" + os.Getenv("PATH")}
	if err := n.start("containerd", env, "nsenter", n.nsenterArgs(filepath.Join(AssetsDir(), "containerd"), "--config", n.path("containerd.toml"))...); err != nil {
		return err
	}
	return waitFor(30*time.Second, "containerd socket", func() bool {
		c, err := net.Dial("unix", n.ContainerdSocket)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
}

// writeRegistryHosts tells containerd that the registry is plain HTTP on
// loopback.
func (n *Node) writeRegistryHosts() error {
	host := n.path("certs.d", n.Registry.Host)
	if err := os.MkdirAll(host, 0o755); err != nil {
		return err
	}
	hosts := fmt.Sprintf("server = \"http://%s\"\n\n[host.\"http://%s\"]\n  capabilities = [\"pull\", \"resolve\"]\n", n.Registry.Host, n.Registry.Host)
	return os.WriteFile(filepath.Join(host, "hosts.toml"), []byte(hosts), 0o644)
}

// writeCNIConfig writes the pods' CNI chain: the node's bridge and
// subnet, then the tuning plugin that gives pods no IPv6.
func (n *Node) writeCNIConfig() error {
	conflist := fmt.Sprintf(`{
  "cniVersion": "1.0.0",
  "name": "moat-kubenode",
  "plugins": [{
    "type": "bridge", "bridge": %q, "isGateway": true, "ipMasq": false, "hairpinMode": true,
    "ipam": {"type": "host-local", "dataDir": %q, "ranges": [[{"subnet": %q, "gateway": %q}]]}
  }, {
    "type": "tuning",
    "sysctl": {"net.ipv6.conf.all.disable_ipv6": "1", "net.ipv6.conf.default.disable_ipv6": "1"}
  }]
}`, n.bridge, n.path("cni-data"), n.Subnet.String(), n.Gateway.String())
	return os.WriteFile(n.path("net.d", "10-moat.conflist"), []byte(conflist), 0o644)
}

// writeContainerdConfig writes containerd's config: everything under the
// node's directory, runc (MOAT_K8STEST_RUNC, else runc on PATH), the
// pause image pinned, the CNI chain of writeCNIConfig.
func (n *Node) writeContainerdConfig(pauseImage string) error {
	runc, _ := exec.LookPath("runc")
	if w := os.Getenv("MOAT_K8STEST_RUNC"); w != "" {
		runc = w
	}
	runsc, err := n.runscHandler()
	if err != nil {
		return err
	}
	n.ContainerdSocket = n.path("containerd", "containerd.sock")
	cfg := fmt.Sprintf(`version = 3
root = %q
state = %q
disabled_plugins = ["io.containerd.nri.v1.nri", "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[grpc]
  address = %q

[plugins.'io.containerd.internal.v1.opt']
  path = %q

[plugins.'io.containerd.cri.v1.images']
  snapshotter = 'overlayfs'
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = %q
  [plugins.'io.containerd.cri.v1.images'.registry]
    config_path = %q

[plugins.'io.containerd.cri.v1.runtime']
  netns_mounts_under_state_dir = true
  # Lowering a process's OOM score needs CAP_SYS_RESOURCE, which CI's
  # root may lack: keep containers at or above containerd's own score.
  restrict_oom_score_adj = true
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = 'runc'
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = 'io.containerd.runc.v2'
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = %q
        SystemdCgroup = false
%s  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = [%q]
    conf_dir = %q

[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = '127.0.0.1'
  stream_server_port = '0'
`, n.path("containerd", "root"), n.path("containerd", "state"), n.ContainerdSocket, n.path("containerd", "opt"),
		pauseImage, n.path("certs.d"), runc, runsc, filepath.Join(AssetsDir(), "cni"), n.path("net.d"))
	return os.WriteFile(n.path("containerd.toml"), []byte(cfg), 0o644)
}

// runscHandler returns containerd's runsc runtime handler (for the
// config's runtimes table) when runsc and gVisor's containerd shim are on
// PATH, with the shim's own config file written; "" without them. runsc
// gets the flags moat's native runsc class uses (internal/runtime/oci).
func (n *Node) runscHandler() (string, error) {
	runsc, err := exec.LookPath("runsc")
	if err != nil {
		return "", nil
	}
	if _, err := exec.LookPath("containerd-shim-runsc-v1"); err != nil {
		return "", nil
	}
	shimCfg := fmt.Sprintf(`binary_name = %q
root = %q
[runsc_config]
  network = "sandbox"
  gso = "false"
  oci-seccomp = "true"
`, runsc, n.path("runsc"))
	if err := os.WriteFile(n.path("runsc.toml"), []byte(shimCfg), 0o644); err != nil {
		return "", err
	}
	n.RuntimeClasses = append(n.RuntimeClasses, "runsc")
	return fmt.Sprintf(`    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runsc]
      runtime_type = 'io.containerd.runsc.v1'
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runsc.options]
        TypeUrl = 'io.containerd.runsc.v1.options'
        ConfigPath = %q
`, n.path("runsc.toml")), nil
}

// createRuntimeClasses makes a RuntimeClass for each of RuntimeClasses,
// named as its containerd handler.
func (n *Node) createRuntimeClasses(ctx context.Context) error {
	cs, err := kubernetes.NewForConfig(n.Config)
	if err != nil {
		return err
	}
	for _, h := range n.RuntimeClasses {
		rc := &nodev1.RuntimeClass{ObjectMeta: metav1.ObjectMeta{Name: h}, Handler: h}
		if _, err := cs.NodeV1().RuntimeClasses().Create(ctx, rc, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("k8stest: RuntimeClass %s: %w", h, err)
		}
	}
	return nil
}

// startMountNamespace starts the mount namespace holder: containerd, its
// shims and the kubelet join it; its end (Stop) unmounts everything they
// mounted. In it /run/containerd is a tmpfs of its own and the kernel
// settings the kubelet insists on are stubbed (kernelStubs).
func (n *Node) startMountNamespace() error {
	n.holder = exec.Command("unshare", "--mount", "--propagation", "private", "--", "sleep", "infinity")
	n.holder.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := n.holder.Start(); err != nil {
		return fmt.Errorf("k8stest: mount namespace: %w", err)
	}
	// unshare execs sleep in the new namespace: wait until it did.
	deadline := time.Now().Add(5 * time.Second)
	self, _ := os.Readlink("/proc/self/ns/mnt")
	for {
		if ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", n.holder.Process.Pid)); err == nil && ns != self {
			break
		}
		if time.Now().After(deadline) {
			return errors.New("k8stest: the mount namespace did not appear")
		}
		time.Sleep(10 * time.Millisecond)
	}
	var script strings.Builder
	script.WriteString("set -e\nmkdir -p /run/containerd\nmount -t tmpfs -o mode=0711 moat-kubenode /run/containerd\n")
	for k, v := range kernelStubs {
		stub := n.path("stubs", strings.ReplaceAll(k, "/", "."))
		if err := os.WriteFile(stub, []byte(v+"\n"), 0o644); err != nil {
			return err
		}
		fmt.Fprintf(&script, "mount --bind %s /proc/sys/%s\n", stub, k)
	}
	if out, err := n.nsenter("sh", "-c", script.String()).CombinedOutput(); err != nil {
		return fmt.Errorf("k8stest: prepare the mount namespace: %v: %s", err, out)
	}
	return nil
}

func (n *Node) nsenterArgs(cmd ...string) []string {
	return append([]string{"--target", strconv.Itoa(n.holder.Process.Pid), "--mount", "--"}, cmd...)
}

func (n *Node) nsenter(cmd ...string) *exec.Cmd {
	return exec.Command("nsenter", n.nsenterArgs(cmd...)...)
}

func (n *Node) startKubelet(ctx context.Context) error {
	if n.cgroupName == "" {
		n.cgroupName = "moat-kubenode-" + filepath.Base(n.dir)
	}
	for _, m := range cgroupMounts() {
		if err := os.MkdirAll(filepath.Join(m, n.cgroupName), 0o755); err != nil {
			return fmt.Errorf("k8stest: cgroup root: %w", err)
		}
	}
	port, err := freePort()
	if err != nil {
		return err
	}
	cfg := fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: 127.0.0.1
port: %s
readOnlyPort: 0
healthzPort: 0
authentication:
  anonymous: {enabled: true}
  webhook: {enabled: false}
authorization:
  mode: AlwaysAllow
cgroupDriver: cgroupfs
cgroupsPerQOS: true
cgroupRoot: /%s
failCgroupV1: false
failSwapOn: false
containerRuntimeEndpoint: unix://%s
podLogsDir: %s
registerNode: true
serializeImagePulls: false
maxPods: 110
evictionHard:
  memory.available: 100Mi
  nodefs.available: "1%%"
  nodefs.inodesFree: "1%%"
  imagefs.available: "1%%"
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
resolvConf: /etc/resolv.conf
# No KUBE-FIREWALL or canary chains in the host's iptables.
makeIPTablesUtilChains: false
`, port, n.cgroupName, n.ContainerdSocket, n.path("pods"))
	if err := os.WriteFile(n.path("kubelet.yaml"), []byte(cfg), 0o644); err != nil {
		return err
	}
	if err := n.start("kubelet", nil, "nsenter", n.nsenterArgs(filepath.Join(AssetsDir(), "kubelet"),
		"--config="+n.path("kubelet.yaml"), "--kubeconfig="+n.Kubeconfig, "--root-dir="+n.path("kubelet"),
		"--hostname-override="+n.Name, "--node-ip="+n.Gateway.String(), "--v=1")...); err != nil {
		return err
	}
	cs, err := kubernetes.NewForConfig(n.Config)
	if err != nil {
		return err
	}
	return waitFor(3*time.Minute, "node Ready", func() bool {
		node, err := cs.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		if err != nil {
			return false
		}
		for _, c := range node.Status.Conditions {
			if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
				return true
			}
		}
		return false
	})
}

// start runs a component with its output in the node's directory.
func (n *Node) start(name string, env []string, bin string, args ...string) error {
	f, err := os.Create(n.path(name + ".log"))
	if err != nil {
		return err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.Env = append(append(os.Environ(), n.env0...), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		f.Close()
		return fmt.Errorf("k8stest: start %s: %w", name, err)
	}
	p := &nodeProc{name: name, cmd: cmd, log: f, done: make(chan struct{})}
	go func() { cmd.Wait(); close(p.done) }()
	n.procs = append(n.procs, p)
	return nil
}

// Logs returns the tail of every component's log.
func (n *Node) Logs() string {
	var b strings.Builder
	for _, p := range n.procs {
		data, _ := os.ReadFile(n.path(p.name + ".log"))
		if len(data) > 4000 {
			data = data[len(data)-4000:]
		}
		fmt.Fprintf(&b, "--- %s ---\n%s\n", p.name, data)
	}
	return b.String()
}

// Stop deletes every pod, stops the components and removes the node's
// network, cgroups, mounts and files.
func (n *Node) Stop() error {
	var errs []error
	n.stopOnce.Do(func() {
		if n.stopProvisioner != nil {
			n.stopProvisioner()
			n.provWG.Wait()
			if err := n.removePolicyTables(); err != nil {
				errs = append(errs, err)
			}
		}
		if n.Config != nil && n.holder != nil {
			n.drain()
		}
		if n.ContainerdSocket != "" {
			// Whatever the kubelet left: stop and remove the pod sandboxes
			// (their network namespaces and addresses go with them).
			cmd := exec.Command(filepath.Join(AssetsDir(), "crictl"), "--runtime-endpoint", "unix://"+n.ContainerdSocket, "--timeout", "20s", "rmp", "-fa")
			cmd.Run()
		}
		for i := len(n.procs) - 1; i >= 0; i-- {
			p := n.procs[i]
			syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
			select {
			case <-p.done:
			case <-time.After(10 * time.Second):
				syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
				<-p.done
			}
			p.log.Close()
		}
		if n.holder != nil {
			// Shims and containers that outlived containerd live in the
			// namespace too.
			killNamespace(n.holder.Process.Pid)
			n.holder.Process.Kill()
			n.holder.Wait()
		}
		if n.cgroupName != "" {
			for _, m := range cgroupMounts() {
				if err := removeCgroupTree(filepath.Join(m, n.cgroupName)); err != nil {
					errs = append(errs, err)
				}
			}
		}
		if n.bridge != "" {
			if l, err := netlink.LinkByName(n.bridge); err == nil {
				if err := netlink.LinkDel(l); err != nil {
					errs = append(errs, err)
				}
			}
		}
		if n.Registry != nil {
			n.Registry.Close()
		}
		if n.env != nil && n.env.ControlPlane.APIServer != nil {
			if err := n.env.Stop(); err != nil {
				data, _ := os.ReadFile(n.path("kube-apiserver.log"))
				if len(data) > 6000 {
					data = data[len(data)-6000:]
				}
				errs = append(errs, fmt.Errorf("%w\n--- kube-apiserver ---\n%s", err, data))
			}
		}
		if n.apiLog != nil {
			n.apiLog.Close()
		}
		if err := os.RemoveAll(n.dir); err != nil {
			errs = append(errs, err)
		}
	})
	return errors.Join(errs...)
}

// drain deletes every pod at once and waits (bounded) for the kubelet to
// stop them.
func (n *Node) drain() {
	cs, err := kubernetes.NewForConfig(n.Config)
	if err != nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	zero := int64(0)
	nss, err := cs.CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
	if err != nil {
		return
	}
	for _, ns := range nss.Items {
		cs.CoreV1().Pods(ns.Name).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: &zero}, metav1.ListOptions{})
	}
	waitFor(45*time.Second, "pods gone", func() bool {
		pods, err := cs.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
		return err == nil && len(pods.Items) == 0
	})
}

// killNamespace SIGKILLs every process in the mount namespace of pid
// (but pid itself).
func killNamespace(pid int) {
	want, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", pid))
	if err != nil {
		return
	}
	for range 3 {
		ents, _ := os.ReadDir("/proc")
		found := false
		for _, e := range ents {
			p, err := strconv.Atoi(e.Name())
			if err != nil || p == pid {
				continue
			}
			if ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", p)); err == nil && ns == want {
				syscall.Kill(p, syscall.SIGKILL)
				found = true
			}
		}
		if !found {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// cgroupMounts returns the mount points of the cgroup hierarchies.
func cgroupMounts() []string {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	var out []string
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		i := indexOf(f, "-")
		if i < 0 || i+1 >= len(f) {
			continue
		}
		if t := f[i+1]; t == "cgroup" || t == "cgroup2" {
			out = append(out, f[4])
		}
	}
	return out
}

func indexOf(f []string, s string) int {
	for i, x := range f {
		if x == s {
			return i
		}
	}
	return -1
}

// removeCgroupTree removes a cgroup and its children, deepest first.
func removeCgroupTree(root string) error {
	if _, err := os.Stat(root); err != nil {
		return nil
	}
	var dirs []string
	filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			dirs = append(dirs, p)
		}
		return nil
	})
	var last error
	for i := len(dirs) - 1; i >= 0; i-- {
		for try := 0; try < 20; try++ {
			if last = syscall.Rmdir(dirs[i]); last == nil || errors.Is(last, syscall.ENOENT) {
				last = nil
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	if last != nil {
		return fmt.Errorf("k8stest: remove cgroup %s: %w", root, last)
	}
	return nil
}

func freePort() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	_, port, _ := net.SplitHostPort(l.Addr().String())
	return port, nil
}

func waitFor(timeout time.Duration, what string, cond func() bool) error {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			return fmt.Errorf("k8stest: timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(100 * time.Millisecond)
	}
	return nil
}

// PushAgentImage pushes an image holding the moat binary at /moat (what the
// controller's agent init container runs) as moat-agent:test and returns
// its reference.
func (n *Node) PushAgentImage(ctx context.Context, moatBinary string) (string, error) {
	dir, err := os.MkdirTemp(n.dir, "agent-image-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(dir)
	data, err := os.ReadFile(moatBinary)
	if err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(dir, "moat"), data, 0o755); err != nil {
		return "", err
	}
	return n.Registry.PushDirConfig(ctx, dir, "moat-agent:test", v1.Config{Entrypoint: []string{"/moat"}})
}

// PushReleaseImage builds the release OCI image of moatBinary as `make
// release` does (internal/release: the binary at /moat, its entrypoint,
// under a multi-arch index, written as an OCI image layout), pushes the
// layout's index to the node's loopback registry as moat:<version> and
// returns the reference. The node's containerd pulls it from there.
func (n *Node) PushReleaseImage(ctx context.Context, moatBinary, version string) (string, error) {
	idx, err := release.Build(release.Image{Binaries: map[string]string{"linux/" + goruntime.GOARCH: moatBinary},
		Version: version, Created: time.Unix(0, 0).UTC()})
	if err != nil {
		return "", err
	}
	dir, err := os.MkdirTemp(n.dir, "release-image-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(dir)
	if err := release.WriteLayout(dir, "moat:"+version, idx); err != nil {
		return "", err
	}
	// What a user does with the release: copy the layout's image to a
	// registry (skopeo copy oci:DIR docker://REGISTRY/moat:TAG).
	p, err := layout.FromPath(dir)
	if err != nil {
		return "", err
	}
	top, err := p.ImageIndex()
	if err != nil {
		return "", err
	}
	im, err := top.IndexManifest()
	if err != nil {
		return "", err
	}
	if len(im.Manifests) != 1 {
		return "", fmt.Errorf("k8stest: release layout has %d entries, want 1", len(im.Manifests))
	}
	pushed, err := top.ImageIndex(im.Manifests[0].Digest)
	if err != nil {
		return "", err
	}
	ref := n.Registry.Host + "/moat:" + version
	tag, err := name.NewTag(ref, name.Insecure)
	if err != nil {
		return "", err
	}
	if err := remote.WriteIndex(tag, pushed, remote.WithContext(ctx)); err != nil {
		return "", fmt.Errorf("k8stest: push %s: %w", ref, err)
	}
	return ref, nil
}

// InstallChart installs the Helm chart at chartDir as release name into
// namespace ns (created), running the controller from image (a reference
// on the node's registry, PushReleaseImage), pulled by the node's
// containerd, and sandbox pods' agent from the same image (the chart's
// default), on the host network and talking to the API server on
// loopback (the node has no service proxy); set are further --set
// values. It returns once the controller is ready (helm --wait).
func (n *Node) InstallChart(ctx context.Context, chartDir, releaseName, ns, image string, set ...string) error {
	u, err := url.Parse(n.Config.Host)
	if err != nil {
		return err
	}
	metrics, err := freePort()
	if err != nil {
		return err
	}
	health, err := freePort()
	if err != nil {
		return err
	}
	i := strings.LastIndex(image, ":")
	if i < 0 || strings.Contains(image[i:], "/") {
		return fmt.Errorf("k8stest: image %q has no tag", image)
	}
	repo, tag := image[:i], image[i+1:]
	home := filepath.Join(n.dir, "helm")
	cmd := exec.CommandContext(ctx, filepath.Join(AssetsDir(), "helm"), "install", releaseName, chartDir,
		"--kubeconfig", n.Kubeconfig, "--namespace", ns, "--create-namespace", "--wait", "--timeout", "4m",
		"--set", "image.repository="+repo, "--set", "image.tag="+tag, "--set", "image.pullPolicy=IfNotPresent",
		"--set", "hostNetwork=true", "--set", "node.containerdSocket="+n.ContainerdSocket,
		"--set", "apiServer.host="+u.Hostname(), "--set-string", "apiServer.port="+u.Port(),
		"--set", "metricsPort="+metrics, "--set", "healthPort="+health)
	for _, kv := range set {
		cmd.Args = append(cmd.Args, "--set", kv)
	}
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+home, "HELM_CONFIG_HOME="+home, "HELM_DATA_HOME="+home)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("k8stest: helm install: %v: %s\n%s", err, out, n.Describe(ns))
	}
	return nil
}

// Describe summarizes the pods and events of namespace ns (for failure
// messages).
func (n *Node) Describe(ns string) string {
	cs, err := kubernetes.NewForConfig(n.Config)
	if err != nil {
		return err.Error()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var b strings.Builder
	pods, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err.Error()
	}
	for _, p := range pods.Items {
		fmt.Fprintf(&b, "pod %s: %s %s ip=%s\n", p.Name, p.Status.Phase, p.Status.Message, p.Status.PodIP)
		for _, s := range append(p.Status.InitContainerStatuses, p.Status.ContainerStatuses...) {
			fmt.Fprintf(&b, "  container %s ready=%v restarts=%d state=%+v last=%+v\n", s.Name, s.Ready, s.RestartCount, s.State, s.LastTerminationState)
		}
	}
	// Container logs, straight from the kubelet's log directory.
	logs, _ := filepath.Glob(n.path("pods", ns+"_*", "*", "*.log"))
	for _, f := range logs {
		data, _ := os.ReadFile(f)
		if len(data) > 2000 {
			data = data[len(data)-2000:]
		}
		fmt.Fprintf(&b, "log %s:\n%s\n", strings.TrimPrefix(f, n.path("pods")), data)
	}
	evs, err := cs.CoreV1().Events(ns).List(ctx, metav1.ListOptions{})
	if err == nil {
		for _, e := range evs.Items {
			fmt.Fprintf(&b, "event %s %s: %s %s\n", e.InvolvedObject.Name, e.Type, e.Reason, e.Message)
		}
	}
	return b.String()
}

// provisionVolumes binds every pending PersistentVolumeClaim to a new
// hostPath PersistentVolume under the node's directory (static
// provisioning, as single-node clusters do); the controller-manager's PV
// controller does the binding. It runs until ctx ends.
func (n *Node) provisionVolumes(ctx context.Context) {
	cs, err := kubernetes.NewForConfig(n.Config)
	if err != nil {
		return
	}
	made := map[string]bool{}
	for ctx.Err() == nil {
		pvcs, err := cs.CoreV1().PersistentVolumeClaims("").List(ctx, metav1.ListOptions{})
		if err == nil {
			for _, c := range pvcs.Items {
				if c.Spec.VolumeName != "" || c.Status.Phase != corev1.ClaimPending || made[string(c.UID)] || c.DeletionTimestamp != nil {
					continue
				}
				dir := n.path("pv", string(c.UID))
				if err := os.MkdirAll(dir, 0o777); err != nil {
					continue
				}
				hp := corev1.HostPathDirectoryOrCreate
				pv := &corev1.PersistentVolume{
					ObjectMeta: metav1.ObjectMeta{Name: "pv-" + string(c.UID)},
					Spec: corev1.PersistentVolumeSpec{
						Capacity:                      corev1.ResourceList{corev1.ResourceStorage: c.Spec.Resources.Requests[corev1.ResourceStorage]},
						AccessModes:                   c.Spec.AccessModes,
						PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimDelete,
						ClaimRef:                      &corev1.ObjectReference{Kind: "PersistentVolumeClaim", Namespace: c.Namespace, Name: c.Name, UID: c.UID},
						PersistentVolumeSource:        corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: dir, Type: &hp}},
					},
				}
				if c.Spec.StorageClassName != nil {
					pv.Spec.StorageClassName = *c.Spec.StorageClassName
				}
				if _, err := cs.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{}); err == nil {
					made[string(c.UID)] = true
				}
			}
		}
		select {
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond):
		}
	}
}
