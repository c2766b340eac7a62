package k8stest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/internal/agentproto"
	"github.com/moat-sandbox/moat/internal/runtime/fake/fakeagent"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
)

// Pod addresses with Options.Agents are loopback, so the stand-in agents
// can listen on the pod IPs and tests may dial them: a block 127.<b>.0.0/16
// (b in [firstBlock, firstBlock+blocks)) of the process's own, held by an
// flock on blockDir/<b> while the Env runs. Test processes running at the
// same time (another package, another helper's run) would otherwise hand
// out the same pod IPs and serve their stand-ins on one another's
// addresses: a sandbox's agent answering with another process's token.
const (
	blockDir   = "/run/moat-test/k8stest-loopback"
	firstBlock = 64
	blocks     = 64
)

// leaseBlock takes a free loopback block; close the file to give it back.
func leaseBlock() (int, *os.File, error) {
	if err := os.MkdirAll(blockDir, 0o755); err != nil {
		return 0, nil, err
	}
	start := rand.IntN(blocks)
	for i := range blocks {
		b := firstBlock + (start+i)%blocks
		f, err := os.OpenFile(filepath.Join(blockDir, strconv.Itoa(b)), os.O_CREATE|os.O_RDWR, 0o644)
		if err != nil {
			return 0, nil, err
		}
		if unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB) == nil {
			return b, f, nil
		}
		f.Close()
	}
	return 0, nil, fmt.Errorf("k8stest: every loopback block 127.%d-%d.0.0/16 is held by another test process", firstBlock, firstBlock+blocks-1)
}

// agents plays the kubelet's part for the agent: for every running pod
// with an IP it serves a stand-in of the agent (fakeagent.Agent) on
// podIP:agentproto.Port that checks the token against the pod's
// EXECD_ACCESS_TOKEN, read from its Secret like the kubelet would. It
// stops serving when the pod goes away.
type agents struct {
	cs kubernetes.Interface

	mu      sync.Mutex
	serving map[string]*agent // by pod IP
	// noSidecars: pods that start meanwhile get no stand-in egress
	// sidecar (Env.WithoutSidecars).
	noSidecars atomic.Bool
}

type agent struct {
	uid   types.UID
	srv   *http.Server
	agent *fakeagent.Agent
	// sidecar is the stand-in egress sidecar of a pod that has one.
	sidecar *standInSidecar
}

// Agent returns the stand-in agent serving pod IP ip (Options.Agents), to
// check what the server told it (its token, its environment).
func (e *Env) Agent(ip string) (*fakeagent.Agent, bool) {
	if e.agents == nil {
		return nil, false
	}
	e.agents.mu.Lock()
	defer e.agents.mu.Unlock()
	a, ok := e.agents.serving[ip]
	if !ok {
		return nil, false
	}
	return a.agent, true
}

func (a *agents) run(ctx context.Context) {
	defer a.closeAll()
	for ctx.Err() == nil {
		a.sync(ctx)
		select {
		case <-ctx.Done():
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func (a *agents) sync(ctx context.Context) {
	list, err := a.cs.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return
	}
	want := map[string]*corev1.Pod{}
	for i := range list.Items {
		p := &list.Items[i]
		if p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodRunning && p.Status.PodIP != "" {
			want[p.Status.PodIP] = p
		}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	for ip, ag := range a.serving {
		if p, ok := want[ip]; !ok || p.UID != ag.uid {
			ag.close()
			delete(a.serving, ip)
		}
	}
	for ip, p := range want {
		if _, ok := a.serving[ip]; ok {
			continue
		}
		token, ok := a.token(ctx, p)
		if !ok {
			continue // its Secret is not there yet: retry
		}
		ln, err := net.Listen("tcp", net.JoinHostPort(ip, strconv.Itoa(agentproto.Port)))
		if err != nil {
			continue // the previous owner of the IP is still closing
		}
		var sc *standInSidecar
		if hasSidecar(p) && !a.noSidecars.Load() {
			if sc, ok = a.sidecar(ctx, p, ip); !ok {
				ln.Close()
				continue
			}
		}
		ag := fakeagent.New(token)
		srv := &http.Server{Handler: ag, ReadHeaderTimeout: 5 * time.Second}
		go srv.Serve(ln)
		a.serving[ip] = &agent{uid: p.UID, srv: srv, agent: ag, sidecar: sc}
	}
}

func (ag *agent) close() {
	ag.srv.Close()
	if ag.sidecar != nil {
		ag.sidecar.srv.Close()
	}
}

// token resolves the EXECD_ACCESS_TOKEN of p's first container.
func (a *agents) token(ctx context.Context, p *corev1.Pod) (string, bool) {
	if len(p.Spec.Containers) == 0 {
		return "", true
	}
	return a.env(ctx, p, p.Spec.Containers[0], "EXECD_ACCESS_TOKEN")
}

// env resolves variable name of container c of pod p ("" if unset; not
// ok while its Secret cannot be read).
func (a *agents) env(ctx context.Context, p *corev1.Pod, c corev1.Container, name string) (string, bool) {
	for _, e := range c.Env {
		if e.Name != name {
			continue
		}
		if e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil {
			return e.Value, true
		}
		ref := e.ValueFrom.SecretKeyRef
		s, err := a.cs.CoreV1().Secrets(p.Namespace).Get(ctx, ref.Name, metav1.GetOptions{})
		if err != nil {
			return "", false
		}
		v, ok := s.Data[ref.Key]
		if !ok && (ref.Optional == nil || !*ref.Optional) {
			return "", false // the kubelet would not start the container
		}
		return string(v), true
	}
	return "", true
}

func (a *agents) closeAll() {
	a.mu.Lock()
	defer a.mu.Unlock()
	for ip, ag := range a.serving {
		ag.close()
		delete(a.serving, ip)
	}
}
