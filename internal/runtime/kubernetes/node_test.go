package kubernetes_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	apiruntime "k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sbv1 "github.com/moat-sandbox/moat/api/v1alpha1"
	"github.com/moat-sandbox/moat/internal/k8s/kclient"
	"github.com/moat-sandbox/moat/internal/k8s/snapreg"
	"github.com/moat-sandbox/moat/internal/runtime"
	"github.com/moat-sandbox/moat/internal/runtime/kubernetes"
	"github.com/moat-sandbox/moat/internal/runtime/runtimetest"
	"github.com/moat-sandbox/moat/internal/testutil"
	"github.com/moat-sandbox/moat/internal/testutil/k8stest"
)

// nodeFixture is what the real-node tests share: the node, its images and
// a controller running against it.
type nodeFixture struct {
	node       *k8stest.Node
	image      string // busybox, from the node's loopback registry
	agentImage string // the moat binary at /moat
}

// startRealNode starts a real node for t with the test image pushed and
// moat's controller installed from the Helm chart (deploy/helm/moat), its
// image the release OCI image the node pulls from its loopback registry;
// the controller runs in a pod until t ends.
func startRealNode(t *testing.T) *nodeFixture {
	t.Helper()
	node := k8stest.StartTestNode(t)
	ctx := context.Background()
	f := &nodeFixture{node: node}
	var err error
	if f.image, err = node.Registry.PushDir(ctx, testutil.BusyboxRootfs(t), "busybox:test", []string{"PATH=/bin:/usr/bin:/sbin:/usr/sbin"}); err != nil {
		t.Fatal(err)
	}
	// The release image, pulled by the node from its loopback registry:
	// the controller's and, by the chart's default, the agent's.
	if f.agentImage, err = node.PushReleaseImage(ctx, testutil.MoatBinary(t), "v0.0.0-test"); err != nil {
		t.Fatal(err)
	}
	chart := filepath.Join(testutil.RepoRoot(t), "deploy", "helm", "moat")
	// Snapshots go to the node's loopback registry, which its containerd
	// pulls from.
	if err := node.InstallChart(ctx, chart, "moat", "moat-system", f.agentImage,
		"snapshots.registry="+node.Registry.Host, "snapshots.commitTimeout=2m"); err != nil {
		t.Fatal(err)
	}
	return f
}

// nodeNamespace makes a namespace on the node and waits for its default
// service account (pods are refused until the controller-manager made it).
func nodeNamespace(t *testing.T, f *nodeFixture) string {
	t.Helper()
	c, err := client.New(f.node.Config, client.Options{Scheme: kclient.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	ns := fmt.Sprintf("node%d", nsSeq.Add(1))
	ctx := context.Background()
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		var sa corev1.ServiceAccount
		if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "default"}, &sa); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("namespace %s: no default service account", ns)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return ns
}

func newNodeRuntime(t *testing.T, f *nodeFixture, ns string) *kubernetes.Runtime {
	t.Helper()
	rt, err := kubernetes.New(f.node.Config, kubernetes.Config{Namespace: ns, DeleteTimeout: 60 * time.Second, CreateTimeout: 2 * time.Minute,
		// The node has 2 CPUs: requests equal to the suite's limits would
		// not fit the concurrent sandboxes next to the controller.
		RequestFraction: 0.1,
		// The egress sidecars' DNS upstream: the pod's own loopback,
		// where nothing answers (the suite's egress case uses IP rules).
		DNSUpstreams: []string{"127.0.0.1:9"}})
	if err != nil {
		t.Fatal(err)
	}
	// Its informers' watches would hold the API server's shutdown at the
	// node's Stop for a minute (the HTTP server waits for them).
	t.Cleanup(func() { rt.Close() })
	return rt
}

// TestRealNode runs against a real single-node cluster (kubelet,
// containerd, runc, CNI bridge; see k8stest.Node). Its subtests share the
// node, which takes a while to start.
func TestRealNode(t *testing.T) {
	f := startRealNode(t)
	t.Run("Conformance", func(t *testing.T) { testNodeConformance(t, f, "") })
	// gVisor: the node's runsc RuntimeClass, asked for per sandbox as on
	// the native runtime (extensions moat.runtime: runsc).
	t.Run("ConformanceRunsc", func(t *testing.T) {
		if !slices.Contains(f.node.RuntimeClasses, "runsc") {
			msg := "the node has no runsc RuntimeClass: runsc and containerd-shim-runsc-v1 are not on PATH (scripts/build-runsc.sh)"
			if os.Getenv(k8stest.RequireEnv) != "" {
				t.Fatal(msg)
			}
			t.Skip(msg)
		}
		testNodeConformance(t, f, "runsc")
	})
	t.Run("Tasks", func(t *testing.T) { testNodeTasks(t, f) })
	t.Run("Snapshot100MB", func(t *testing.T) { testNodeSnapshotSize(t, f) })
	t.Run("Pause", func(t *testing.T) { testNodePause(t, f, "") })
	t.Run("PauseRunsc", func(t *testing.T) {
		if !slices.Contains(f.node.RuntimeClasses, "runsc") {
			t.Skip("the node has no runsc RuntimeClass")
		}
		testNodePause(t, f, "runsc")
	})
}

// testNodePause: a paused sandbox's processes are frozen where they run
// (moat node, through the node's containerd): a ticker in it leaves a
// gap as long as the pause, and runs on afterwards as the same process
// in the same pod; a server restarted meanwhile (a new runtime) sees it
// paused and resumes it.
func testNodePause(t *testing.T, f *nodeFixture, class string) {
	ns := nodeNamespace(t, f)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("namespace %s:\n%s", ns, f.node.Describe(ns))
		}
	})
	rt := newNodeRuntime(t, f, ns)
	ctx := context.Background()
	id := runtimetest.NewID("pause")
	if _, err := rt.Create(ctx, runtime.Spec{ID: id, Image: f.image, Class: class, AgentToken: runtimetest.Token,
		Resources: runtime.Resources{CPUMillis: 500, MemoryBytes: 128 << 20}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Delete(context.Background(), id) })
	runtimetest.WaitAgent(t, ctx, rt, id, 60*time.Second)
	c, err := client.New(f.node.Config, client.Options{Scheme: kclient.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	podOf := func() corev1.Pod {
		t.Helper()
		var b sbv1.BatchSandbox
		if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: id}, &b); err != nil {
			t.Fatal(err)
		}
		var p corev1.Pod
		if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: b.AllocatedPods()[0]}, &p); err != nil {
			t.Fatal(err)
		}
		return p
	}
	before := podOf()
	out, _, err := runtimetest.Exec(ctx, rt, id, `sh -c 'while :; do cut -d" " -f1 /proc/uptime >> /tmp/ticks; sleep 0.05; done' >/dev/null 2>&1 & echo $!`)
	if err != nil {
		t.Fatal(err)
	}
	pid := strings.TrimSpace(out)
	time.Sleep(300 * time.Millisecond)

	start := time.Now()
	if err := rt.Pause(ctx, id); err != nil {
		t.Fatalf("Pause: %v", err)
	}
	t.Logf("pause took %v", time.Since(start))
	if st, err := rt.Status(ctx, id); err != nil || st.State != runtime.StatePaused {
		t.Fatalf("Status after Pause: %+v %v", st, err)
	}
	time.Sleep(1500 * time.Millisecond)
	// The server restarts while the sandbox is paused.
	rt2 := newNodeRuntime(t, f, ns)
	if st, err := rt2.Status(ctx, id); err != nil || st.State != runtime.StatePaused {
		t.Fatalf("Status through a new runtime: %+v %v", st, err)
	}
	start = time.Now()
	if err := rt2.Resume(ctx, id); err != nil {
		t.Fatalf("Resume: %v", err)
	}
	t.Logf("resume took %v", time.Since(start))
	time.Sleep(300 * time.Millisecond)

	out, code, err := runtimetest.Exec(ctx, rt2, id, "kill -0 "+pid+" && echo alive; cat /tmp/ticks")
	if err != nil || code != 0 {
		t.Fatalf("after resume: %q %d %v", out, code, err)
	}
	lines := strings.Fields(out)
	if len(lines) < 3 || lines[0] != "alive" {
		t.Fatalf("the ticker did not survive the pause: %q", out)
	}
	var prev, gap float64
	for i, l := range lines[1:] {
		var v float64
		if _, err := fmt.Sscan(l, &v); err != nil {
			t.Fatalf("tick %q: %v", l, err)
		}
		if i > 0 && v-prev > gap {
			gap = v - prev
		}
		prev = v
	}
	if gap < 1.4 {
		t.Errorf("longest gap between ticks %.2fs: the sandbox ran while paused", gap)
	}
	if after := podOf(); after.UID != before.UID || after.Status.ContainerStatuses[0].RestartCount != before.Status.ContainerStatuses[0].RestartCount {
		t.Errorf("pod changed: %s restarts %d, was %s restarts %d", after.UID, after.Status.ContainerStatuses[0].RestartCount,
			before.UID, before.Status.ContainerStatuses[0].RestartCount)
	}
}

// testNodeSnapshotSize: a snapshot of a sandbox holding 100 MB of new
// files (random, so nothing compresses them away) carries them whole to a
// sandbox made from its image; the log lines give the time of the
// snapshot (freeze, diff, thaw, push) and of the create from it (pull).
func testNodeSnapshotSize(t *testing.T, f *nodeFixture) {
	ns := nodeNamespace(t, f)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("namespace %s:\n%s", ns, f.node.Describe(ns))
		}
	})
	rt := newNodeRuntime(t, f, ns)
	ctx := context.Background()
	id := runtimetest.NewID("big")
	spec := runtime.Spec{ID: id, Image: f.image, AgentToken: runtimetest.Token,
		Resources: runtime.Resources{CPUMillis: 1000, MemoryBytes: 256 << 20}}
	if _, err := rt.Create(ctx, spec); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Delete(context.Background(), id) })
	runtimetest.WaitAgent(t, ctx, rt, id, 60*time.Second)
	const write = "mkdir -p /data && for i in 1 2 3 4; do head -c 26214400 /dev/urandom > /data/f$i; done && cat /data/f* | md5sum"
	out, code, err := runtimetest.Exec(ctx, rt, id, write)
	if err != nil || code != 0 || len(strings.Fields(out)) == 0 {
		t.Fatalf("write: %q %d %v", out, code, err)
	}
	sum := strings.Fields(out)[0]
	name := runtimetest.NewID("big-snap")
	t.Cleanup(func() { rt.RemoveSnapshotImage(context.Background(), name) })
	start := time.Now()
	img, err := rt.SnapshotImage(ctx, id, name)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("snapshot of 100 MB took %v", time.Since(start))
	dst := runtimetest.NewID("big-dst")
	spec.ID, spec.Image = dst, img
	start = time.Now()
	if _, err := rt.Create(ctx, spec); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Delete(context.Background(), dst) })
	t.Logf("create from it took %v", time.Since(start))
	runtimetest.WaitAgent(t, ctx, rt, dst, 60*time.Second)
	if out, _, err := runtimetest.Exec(ctx, rt, dst, "cat /data/f* | md5sum"); err != nil || !strings.HasPrefix(out, sum+" ") {
		t.Fatalf("files from the snapshot: %q %v, want %s", out, err, sum)
	}
}

// testNodeConformance runs the runtime conformance suite against the real
// node: every sandbox is a real pod whose container runs moat's agent
// (copied in by the init container from the agent image), and the suite
// talks to that agent at the pod IP. PersistentVolumeClaims are bound to
// hostPath volumes (k8stest.Node), so the Volumes case writes through real
// mounts, and the kubelet's own refusal of a subPath that leads out of the
// volume through a symlink fails Create at once (startFailure).
func testNodeConformance(t *testing.T, f *nodeFixture, class string) {
	runtimetest.Run(t, func(t *testing.T) runtime.Runtime {
		ns := nodeNamespace(t, f)
		t.Cleanup(func() {
			if t.Failed() {
				t.Logf("namespace %s:\n%s", ns, f.node.Describe(ns))
			}
		})
		rt := newNodeRuntime(t, f, ns)
		return nodeRuntime{rt, rt, rt, ns, rt}
	}, runtimetest.Options{
		Image:        f.image,
		Class:        class,
		AgentTimeout: 60 * time.Second,
		// The disk quota is the pod's ephemeral-storage limit, which the
		// kubelet enforces by evicting the pod.
		DiskQuotaEvicts: true,
		// Every sandbox is a pod the kubelet starts (and a refused one a
		// pod it tries to start): the Volumes case makes seven.
		CaseTimeout: 5 * time.Minute,
		Reopen: func(t *testing.T, rt runtime.Runtime) runtime.Runtime {
			ns := rt.(nodeRuntime).ns
			rt2 := newNodeRuntime(t, f, ns)
			return nodeRuntime{rt2, rt2, rt2, ns, rt2}
		},
		Egress: egressFor(f, class),
		Vault:  vaultFor(f, class),
		ImageExists: func(ctx context.Context, image string) (bool, error) {
			return snapreg.Registry{Host: f.node.Registry.Host}.Exists(ctx, image)
		},
		// gVisor keeps a sandbox's writes out of containerd's snapshot.
		SnapshotImagesOff: class == "runsc",
	})
}

// nodeRuntime is the kubernetes runtime seen through runtime.Runtime,
// runtime.Volumes and runtime.ImageSnapshotter, keeping the namespace
// for Reopen.
type nodeRuntime struct {
	runtime.Runtime
	runtime.Volumes
	runtime.ImageSnapshotter
	ns string
	k  *kubernetes.Runtime
}

// egressFor is the Egress harness of class: the default class enforces
// policies with the egress sidecar; runsc refuses them (its kernel does
// not filter the pod's network namespace; TestEgressValidate).
func egressFor(f *nodeFixture, class string) func(t *testing.T, rt runtime.Runtime) runtimetest.EgressHarness {
	if class != "" {
		return nil
	}
	return func(t *testing.T, rt runtime.Runtime) runtimetest.EgressHarness { return newNodeEgress(t, f, rt) }
}

// vaultFor is the Vault harness of class: the default class runs the
// credential proxy in the egress sidecar; runsc refuses it.
func vaultFor(f *nodeFixture, class string) func(t *testing.T, rt runtime.Runtime) runtimetest.VaultHarness {
	if class != "" {
		return nil
	}
	return func(t *testing.T, rt runtime.Runtime) runtimetest.VaultHarness {
		return &nodeVault{nodeEgress: newNodeEgress(t, f, rt).(*nodeEgress), gw: f.node.Gateway.String()}
	}
}

// testNodeTasks: a BatchSandbox with a taskTemplate runs its task in every
// sandbox through moat's agent (no sidecar); the counts reach the status,
// a failing shard is counted failed with its message, and with Release
// the finished sandboxes' pods are deleted.
func testNodeTasks(t *testing.T, f *nodeFixture) {
	ns := nodeNamespace(t, f)
	c, err := client.New(f.node.Config, client.Options{Scheme: kclient.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	three, release := int32(3), sbv1.TaskRelease
	b := &sbv1.BatchSandbox{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "tasks"},
		Spec: sbv1.BatchSandboxSpec{
			Replicas: &three,
			Template: &corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{{
				Name: "sandbox", Image: f.image, Command: []string{"sleep", "3600"},
			}}}},
			TaskTemplate: &sbv1.TaskTemplateSpec{Spec: sbv1.TaskSpec{Process: &sbv1.ProcessTask{
				Command: []string{"sh", "-c"}, Args: []string{"test \"$WHO\" = moat"},
				Env: []corev1.EnvVar{{Name: "WHO", Value: "moat"}},
			}}},
			ShardTaskPatches:                []apiruntime.RawExtension{{}, {}, {Raw: []byte(`{"spec":{"process":{"args":["exit 3"]}}}`)}},
			TaskResourcePolicyWhenCompleted: &release,
		},
	}
	if err := c.Create(ctx, b); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(3 * time.Minute)
	for {
		if err := c.Get(ctx, client.ObjectKeyFromObject(b), b); err != nil {
			t.Fatal(err)
		}
		st := b.Status
		if st.TaskSucceed == 2 && st.TaskFailed == 1 && st.TaskRunning == 0 && st.TaskPending == 0 {
			if !strings.Contains(st.TaskLastErrorMessage, "code 3") {
				t.Errorf("taskLastErrorMessage = %q", st.TaskLastErrorMessage)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("tasks did not finish: %+v", st)
		}
		time.Sleep(200 * time.Millisecond)
	}
	// Release: the finished sandboxes' pods go away, and are not replaced.
	for {
		var pods corev1.PodList
		if err := c.List(ctx, &pods, client.InNamespace(ns)); err != nil {
			t.Fatal(err)
		}
		if len(pods.Items) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d pods left after their tasks finished", len(pods.Items))
		}
		time.Sleep(200 * time.Millisecond)
	}
}
