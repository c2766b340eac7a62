package controller_test

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sbv1 "github.com/moat-sandbox/moat/api/v1alpha1"
	"github.com/moat-sandbox/moat/internal/k8s/controller"
	"github.com/moat-sandbox/moat/internal/k8s/node"
	"github.com/moat-sandbox/moat/internal/k8s/snapreg"
	"github.com/moat-sandbox/moat/internal/testutil/localregistry"
)

// fakeLayers is a node's content store holding one base image, whose
// Diff is a fixed tar; it records whether the container was frozen
// during each diff.
type fakeLayers struct {
	tasks *fakeTasks
	blobs map[string][]byte
	image node.Blob
	diff  node.Blob

	mu        sync.Mutex
	failWith  error
	diffs     int
	allFrozen bool
}

func newFakeLayers(t *testing.T, tasks *fakeTasks) *fakeLayers {
	t.Helper()
	base, err := mutate.AppendLayers(empty.Image, static.NewLayer(tarOf(t, "bin/sh", "base"), types.DockerLayer))
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeLayers{tasks: tasks, blobs: map[string][]byte{}, allFrozen: true}
	raw, _ := base.RawManifest()
	d, _ := base.Digest()
	f.blobs[d.String()] = raw
	f.image = node.Blob{MediaType: string(types.DockerManifestSchema2), Digest: d.String(), Size: int64(len(raw))}
	cfg, _ := base.RawConfigFile()
	cd, _ := base.ConfigName()
	f.blobs[cd.String()] = cfg
	ls, _ := base.Layers()
	for _, l := range ls {
		ld, _ := l.Digest()
		r, _ := l.Compressed()
		f.blobs[ld.String()], _ = io.ReadAll(r)
	}
	diff := tarOf(t, "work/file", "captured")
	h, _, _ := v1.SHA256(bytes.NewReader(diff))
	f.blobs[h.String()] = diff
	f.diff = node.Blob{MediaType: string(types.OCIUncompressedLayer), Digest: h.String(), Size: int64(len(diff))}
	return f
}

func tarOf(t *testing.T, name, content string) []byte {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(content)), Typeflag: tar.TypeReg})
	tw.Write([]byte(content))
	tw.Close()
	return b.Bytes()
}

func (f *fakeLayers) Diff(ctx context.Context, id string) (node.Layer, error) {
	frozen, _ := f.tasks.Frozen(ctx, id)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.diffs++
	f.allFrozen = f.allFrozen && frozen
	if f.failWith != nil {
		return node.Layer{}, f.failWith
	}
	return node.Layer{Diff: f.diff, Image: f.image, Release: func() {}}, nil
}

func (f *fakeLayers) Has(_ context.Context, d string) bool { _, ok := f.blobs[d]; return ok }

func (f *fakeLayers) Open(_ context.Context, d string) (io.ReadCloser, error) {
	b, ok := f.blobs[d]
	if !ok {
		return nil, errors.New("no blob " + d)
	}
	return io.NopCloser(bytes.NewReader(b)), nil
}

func (f *fakeLayers) fail(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failWith = err
}

// startSnapshotNodes runs moat node for every fake node with snapshots
// on; the returned function stops them.
func startSnapshotNodes(t *testing.T, tasks *fakeTasks, layers *fakeLayers, reg snapreg.Registry) func() {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, name := range env.Nodes {
		mgr, err := node.New(env.Config, node.Options{NodeName: name, Tasks: tasks, Layers: layers, Registry: reg, Log: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() { defer wg.Done(); mgr.Start(ctx) }()
	}
	var once sync.Once
	stop := func() { once.Do(func() { cancel(); wg.Wait() }) }
	t.Cleanup(stop)
	return stop
}

func waitSnapshot(t *testing.T, c client.Client, s *sbv1.SandboxSnapshot, phase sbv1.SandboxSnapshotPhase) {
	t.Helper()
	eventually(t, 30*time.Second, "snapshot "+string(phase), func() (bool, string) {
		if err := c.Get(context.Background(), client.ObjectKeyFromObject(s), s); err != nil {
			return false, err.Error()
		}
		return s.Status.Phase == phase, fmt.Sprintf("%+v", s.Status)
	})
}

// TestSnapshot: a SandboxSnapshot is committed by moat node on the pod's
// node (the container frozen during the diff, thawed after) and pushed
// as the base image plus one layer; it ends Succeed with Ready and the
// digest, and deleting it deletes the image. A node that fails and a
// node that does not answer end it Failed with a clear condition, the
// container thawed and no image left.
func TestSnapshot(t *testing.T) {
	c, ns := setup(t)
	reg, err := localregistry.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { reg.Close() })
	registry := snapreg.Registry{Host: reg.Host}
	startControllerWith(t, controller.Options{AgentImage: "moat:test", Namespace: ns, SnapshotRegistry: registry, CommitTimeout: 2 * time.Second})
	tasks := &fakeTasks{frozen: map[string]bool{}}
	layers := newFakeLayers(t, tasks)
	stopNodes := startSnapshotNodes(t, tasks, layers, registry)
	ctx := context.Background()
	b := &sbv1.BatchSandbox{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "p"},
		Spec: sbv1.BatchSandboxSpec{Replicas: ptr(int32(1)), Template: template()}}
	if err := c.Create(ctx, b); err != nil {
		t.Fatal(err)
	}
	b = waitBatch(t, c, ns, "p")
	pods, _, _ := allocation(t, b)

	snap := &sbv1.SandboxSnapshot{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "s1"}, Spec: sbv1.SandboxSnapshotSpec{SandboxName: "p"}}
	if err := c.Create(ctx, snap); err != nil {
		t.Fatal(err)
	}
	waitSnapshot(t, c, snap, sbv1.SnapshotSucceed)
	if snap.Status.SourcePodName != pods[0] || snap.Status.SourceNodeName == "" || len(snap.Status.Containers) != 1 {
		t.Fatalf("status %+v", snap.Status)
	}
	ci := snap.Status.Containers[0]
	if ci.ContainerName != "main" || ci.ImageURI != registry.ImageRef(ns, "s1", "main") || !strings.HasPrefix(ci.ImageDigest, "sha256:") {
		t.Errorf("container %+v", ci)
	}
	if !meta.IsStatusConditionTrue(snap.Status.Conditions, "Ready") {
		t.Errorf("conditions %+v", snap.Status.Conditions)
	}
	if layers.diffs != 1 || !layers.allFrozen || tasks.count() != 0 {
		t.Errorf("diffs %d, frozen during them %v, frozen after %d", layers.diffs, layers.allFrozen, tasks.count())
	}
	ref, err := name.ParseReference(ci.ImageURI)
	if err != nil {
		t.Fatal(err)
	}
	img, err := remote.Image(ref, remote.WithContext(ctx))
	if err != nil {
		t.Fatal(err)
	}
	if ls, _ := img.Layers(); len(ls) != 2 {
		t.Errorf("snapshot image has %d layers, want the base's and the diff", len(ls))
	}
	if d, _ := img.Digest(); d.String() != ci.ImageDigest {
		t.Errorf("pushed %s, status says %s", d, ci.ImageDigest)
	}

	// Deleting the snapshot deletes its image.
	if err := c.Delete(ctx, snap); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "snapshot and image gone", func() (bool, string) {
		err := c.Get(ctx, client.ObjectKeyFromObject(snap), &sbv1.SandboxSnapshot{})
		ok, rerr := registry.Exists(ctx, ci.ImageURI)
		pinned, perr := registry.Exists(ctx, snapreg.Pinned(ci.ImageURI, ci.ImageDigest))
		return client.IgnoreNotFound(err) == nil && err != nil && !ok && rerr == nil && !pinned && perr == nil,
			fmt.Sprintf("get %v, image %v %v, by digest %v %v", err, ok, rerr, pinned, perr)
	})

	failed := func(name, reason, msg string) {
		t.Helper()
		s := &sbv1.SandboxSnapshot{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: sbv1.SandboxSnapshotSpec{SandboxName: "p"}}
		if err := c.Create(ctx, s); err != nil {
			t.Fatal(err)
		}
		waitSnapshot(t, c, s, sbv1.SnapshotFailed)
		f := meta.FindStatusCondition(s.Status.Conditions, "Failed")
		if f == nil || f.Status != metav1.ConditionTrue || f.Reason != reason || !strings.Contains(f.Message, msg) {
			t.Errorf("%s: Failed condition %+v, want %s with %q", name, f, reason, msg)
		}
		if ok, err := registry.Exists(ctx, registry.ImageRef(ns, name, "main")); ok || err != nil {
			t.Errorf("%s: image left behind (%v)", name, err)
		}
		if n := tasks.count(); n != 0 {
			t.Errorf("%s: %d containers left frozen", name, n)
		}
		eventually(t, 10*time.Second, name+" event", func() (bool, string) {
			var evs corev1.EventList
			if err := c.List(ctx, &evs, client.InNamespace(ns)); err != nil {
				return false, err.Error()
			}
			for _, e := range evs.Items {
				if e.InvolvedObject.Name == name && e.Reason == reason && e.Type == corev1.EventTypeWarning {
					return true, ""
				}
			}
			return false, fmt.Sprintf("%d events", len(evs.Items))
		})
	}
	// The node cannot diff: its words reach the condition.
	layers.fail(errors.New("the snapshotter refused"))
	failed("s2", "CommitFailed", "the snapshotter refused")
	// No node answers: Failed within the commit timeout, naming moat node.
	layers.fail(nil)
	stopNodes()
	failed("s3", "NodeTimeout", "moat node")
	// No such sandbox.
	s4 := &sbv1.SandboxSnapshot{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "s4"}, Spec: sbv1.SandboxSnapshotSpec{SandboxName: "nope"}}
	if err := c.Create(ctx, s4); err != nil {
		t.Fatal(err)
	}
	waitSnapshot(t, c, s4, sbv1.SnapshotFailed)
	if f := meta.FindStatusCondition(s4.Status.Conditions, "Failed"); f == nil || f.Reason != "SandboxNotFound" {
		t.Errorf("s4: %+v", s4.Status.Conditions)
	}
}
