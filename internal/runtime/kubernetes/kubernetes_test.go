package kubernetes_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sbv1 "github.com/moat-sandbox/moat/api/v1alpha1"
	"github.com/moat-sandbox/moat/internal/agentproto"
	"github.com/moat-sandbox/moat/internal/k8s/controller"
	"github.com/moat-sandbox/moat/internal/k8s/kclient"
	"github.com/moat-sandbox/moat/internal/runtime"
	"github.com/moat-sandbox/moat/internal/runtime/kubernetes"
	"github.com/moat-sandbox/moat/internal/runtime/runtimetest"
	"github.com/moat-sandbox/moat/internal/testutil/k8stest"
)

var env *k8stest.Env

// The pods get loopback IPs with stand-in agents on them (k8stest
// Options.Agents), so the conformance suite's agent checks run too.
func TestMain(m *testing.M) { k8stest.Main(m, &env, k8stest.Options{Agents: true}) }

var nsSeq atomic.Int32

// startController runs `moat controller` in-process for the test.
func startController(t *testing.T) {
	t.Helper()
	mgr, err := controller.New(env.Config, controller.Options{AgentImage: "moat:test"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("controller: %v", err)
		}
	})
}

func namespace(t *testing.T) string {
	t.Helper()
	c, err := client.New(env.Config, client.Options{Scheme: kclient.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	ns := fmt.Sprintf("rt%d", nsSeq.Add(1))
	if err := c.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	return ns
}

func newRuntime(t *testing.T, ns string) *kubernetes.Runtime {
	t.Helper()
	rt, err := kubernetes.New(env.Config, kubernetes.Config{Namespace: ns, Classes: []string{"gvisor"}, DeleteTimeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Close() })
	return rt
}

// TestConformance runs the whole runtime conformance suite. On kwok's
// fake nodes no container runs: the agent answering /ping at the pod IP is
// the harness's stand-in (it checks the token from the sandbox's Secret),
// so this proves the endpoint and token plumbing, not the real agent in a
// pod (that needs a real kubelet).
func TestConformance(t *testing.T) {
	k8stest.Require(t, env)
	startController(t)
	startNodes(t)
	runtimetest.Run(t, func(t *testing.T) runtime.Runtime {
		return newRuntime(t, namespace(t))
	}, runtimetest.Options{
		Image: "busybox:test",
		Reopen: func(t *testing.T, rt runtime.Runtime) runtime.Runtime {
			// A new backend over the same namespace (the server restarted).
			return newRuntime(t, rt.(*kubernetes.Runtime).Namespace())
		},
		// kwok runs no containers: the Volumes case checks the PVCs and
		// pod templates, not writes inside the sandbox.
		NoCommands: true,
		// The controller has no snapshot registry (TestRealNode's has).
		SnapshotImagesOff: true,
	})
}

func adminClient(t *testing.T) client.Client {
	t.Helper()
	c, err := client.New(env.Config, client.Options{Scheme: kclient.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func waitRunning(t *testing.T, rt runtime.Runtime, id string) runtime.Status {
	t.Helper()
	return runtimetest.WaitState(t, context.Background(), rt, id, runtime.StateRunning, 30*time.Second)
}

// TestPodSpec: the sandbox's pod carries the spec: token from a Secret,
// limits, runtime class, entrypoint under the agent.
func TestPodSpec(t *testing.T) {
	k8stest.Require(t, env)
	startController(t)
	ns := namespace(t)
	rt := newRuntime(t, ns)
	ctx := context.Background()
	// The RuntimeClass admission plugin rejects pods of unknown classes.
	rc := &nodev1.RuntimeClass{ObjectMeta: metav1.ObjectMeta{Name: "gvisor"}, Handler: "runsc"}
	if err := adminClient(t).Create(ctx, rc); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	spec := runtime.Spec{ID: "spec-1", Image: "busybox:test", Class: "gvisor", AgentToken: "tok",
		Entrypoint: []string{"sleep", "1000"}, Env: map[string]string{"X": "y"},
		Resources: runtime.Resources{CPUMillis: 250, MemoryBytes: 64 << 20}}
	if _, err := rt.Create(ctx, spec); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Delete(context.Background(), spec.ID) })
	st := waitRunning(t, rt, spec.ID)
	ep, err := rt.Endpoint(ctx, spec.ID, agentproto.Port)
	if err != nil || ep != st.IP+":44772" {
		t.Errorf("Endpoint = %q, %v (ip %s)", ep, err, st.IP)
	}
	c := adminClient(t)
	var b sbv1.BatchSandbox
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: spec.ID}, &b); err != nil {
		t.Fatal(err)
	}
	var pod corev1.Pod
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: b.AllocatedPods()[0]}, &pod); err != nil {
		t.Fatal(err)
	}
	main := pod.Spec.Containers[0]
	if got := fmt.Sprint(main.Command); got != "[/opt/moat/moat-agent execd --port 44772 -- sleep 1000]" {
		t.Errorf("command = %s", got)
	}
	if pod.Spec.RuntimeClassName == nil || *pod.Spec.RuntimeClassName != "gvisor" {
		t.Errorf("runtimeClassName = %v", pod.Spec.RuntimeClassName)
	}
	if main.Resources.Limits.Cpu().MilliValue() != 250 || main.Resources.Limits.Memory().Value() != 64<<20 {
		t.Errorf("limits = %v", main.Resources.Limits)
	}
	var tokenRef string
	for _, e := range main.Env {
		if e.Name == "EXECD_ACCESS_TOKEN" && e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
			tokenRef = e.ValueFrom.SecretKeyRef.Name
		}
	}
	var sec corev1.Secret
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: tokenRef}, &sec); err != nil || string(sec.Data["token"]) != "tok" {
		t.Errorf("token secret %q: %v %v", tokenRef, err, sec.Data)
	}
	// Made before the batch (so that no pod starts without it), then
	// owned by it (so that the garbage collector removes it with the batch).
	if o := metav1.GetControllerOf(&sec); o == nil || o.UID != b.UID || o.Kind != "BatchSandbox" {
		t.Errorf("token secret owner = %+v, want the BatchSandbox %s", o, b.UID)
	}
	if err := rt.Delete(ctx, spec.ID); err != nil {
		t.Fatal(err)
	}
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: tokenRef}, &sec); err == nil {
		t.Errorf("token secret %s left after Delete", tokenRef)
	}
}

// TestPoolBacked: with Config.Pool, a sandbox equal to the pool template
// is a warm pool pod; one with extra env is created cold.
func TestPoolBacked(t *testing.T) {
	k8stest.Require(t, env)
	startController(t)
	ns := namespace(t)
	c := adminClient(t)
	ctx := context.Background()
	tpl := &corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "sandbox", Image: "busybox:test"}}}}
	if err := c.Create(ctx, &sbv1.Pool{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "warm"},
		Spec: sbv1.PoolSpec{Template: tpl, CapacitySpec: sbv1.CapacitySpec{PoolMin: 2, PoolMax: 2}}}); err != nil {
		t.Fatal(err)
	}
	rt, err := kubernetes.New(env.Config, kubernetes.Config{Namespace: ns, Pool: "warm"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Close() })
	// Wait for the pool to be warm.
	deadline := time.Now().Add(30 * time.Second)
	for {
		var p sbv1.Pool
		if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "warm"}, &p); err == nil && p.Status.Available == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("pool not warm")
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, tc := range []struct {
		id   string
		env  map[string]string
		warm bool
	}{{"warm-1", nil, true}, {"cold-1", map[string]string{"K": "v"}, false}} {
		if _, err := rt.Create(ctx, runtime.Spec{ID: tc.id, Image: "busybox:test", Env: tc.env}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { rt.Delete(context.Background(), tc.id) })
		waitRunning(t, rt, tc.id)
		var b sbv1.BatchSandbox
		if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: tc.id}, &b); err != nil {
			t.Fatal(err)
		}
		pods := b.AllocatedPods()
		var pod corev1.Pod
		if len(pods) != 1 {
			t.Fatalf("%s: pods %v", tc.id, pods)
		}
		if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: pods[0]}, &pod); err != nil {
			t.Fatal(err)
		}
		if got := pod.Labels[sbv1.LabelPool] == "warm"; got != tc.warm {
			t.Errorf("%s: pod %s labels %v, want warm %v", tc.id, pod.Name, pod.Labels, tc.warm)
		}
	}
}

// TestTokenSweep: a new backend deletes the agent token Secrets a server
// stopped between the Secret and the BatchSandbox left behind (no owner,
// no sandbox), and keeps those of sandboxes and those another label owns.
func TestTokenSweep(t *testing.T) {
	k8stest.Require(t, env)
	startController(t)
	ns := namespace(t)
	rt := newRuntime(t, ns)
	c := adminClient(t)
	ctx := context.Background()
	spec := runtime.Spec{ID: "sweep-live", Image: "busybox:test", AgentToken: "tok"}
	if _, err := rt.Create(ctx, spec); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Delete(context.Background(), spec.ID) })
	mk := func(name string, labels map[string]string) {
		t.Helper()
		sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels}, StringData: map[string]string{"token": "x"}}
		if err := c.Create(ctx, sec); err != nil {
			t.Fatal(err)
		}
	}
	var live corev1.Secret
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "sweep-live-agent"}, &live); err != nil {
		t.Fatal(err)
	}
	mine := map[string]string{kubernetes.LabelToken: "true"}
	for k, v := range live.Labels {
		mine[k] = v
	}
	mk("sweep-orphan-agent", mine)
	// A Secret of a sandbox that exists but is not owned yet (a Create in
	// flight) stays.
	if err := c.Patch(ctx, &live, client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"ownerReferences":null}}`))); err != nil {
		t.Fatal(err)
	}
	mk("other-agent", map[string]string{"app": "other"})
	kubernetes.SweepTokens(ctx, rt, 0)
	for name, want := range map[string]bool{"sweep-orphan-agent": false, "sweep-live-agent": true, "other-agent": true} {
		var s corev1.Secret
		err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &s)
		if got := err == nil; got != want {
			t.Errorf("secret %s present = %v (%v), want %v", name, got, err, want)
		}
	}
}
