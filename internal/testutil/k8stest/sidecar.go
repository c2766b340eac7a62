package k8stest

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/moat-sandbox/moat/internal/egress"
	"github.com/moat-sandbox/moat/internal/egress/mitm"
	"github.com/moat-sandbox/moat/internal/egress/policy"
	"github.com/moat-sandbox/moat/internal/egress/sidecar"
)

// standInSidecar plays moat's egress sidecar for a pod that has one: its
// egress API (egress.NewHandler) over a policy held in memory, with the
// sidecar's proof of its token, on podIP:sidecar.Port. Its token and the
// policy it starts under are the pod's, read from its Secrets like the
// kubelet would. It enforces nothing (kwok's pods run nothing). A pod
// with a vault key takes the server's vault pushes (unopened: it counts
// them) and serves the withheld credentials a test reports
// (Env.SidecarWithhold) as the sidecar does.
type standInSidecar struct {
	srv      *http.Server
	withheld *sidecar.WithheldQueue // nil: no vault key
	mu       sync.Mutex
	pol      policy.NetworkPolicy
	set      int // policies set through the API
	vaults   int // vault pushes
}

func hasSidecar(p *corev1.Pod) bool {
	for _, c := range p.Spec.InitContainers {
		if c.Name == sidecar.ContainerName {
			return true
		}
	}
	return false
}

// sidecar starts the stand-in sidecar of pod p on ip (not ok: its
// Secrets are not readable yet, or its port is still taken).
func (a *agents) sidecar(ctx context.Context, p *corev1.Pod, ip string) (*standInSidecar, bool) {
	var c corev1.Container
	for _, ic := range p.Spec.InitContainers {
		if ic.Name == sidecar.ContainerName {
			c = ic
		}
	}
	token, ok := a.env(ctx, p, c, sidecar.EnvToken)
	if !ok || token == "" {
		return nil, false
	}
	raw, ok := a.env(ctx, p, c, sidecar.EnvPolicy)
	if !ok {
		return nil, false
	}
	sc := &standInSidecar{}
	if err := json.Unmarshal([]byte(raw), &sc.pol); err != nil {
		return nil, false
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(ip, strconv.Itoa(sidecar.Port)))
	if err != nil {
		return nil, false
	}
	mux := http.NewServeMux()
	mux.Handle("/", egress.NewHandler(sc, p.Name, egress.HandlerOptions{Token: token}))
	mux.HandleFunc("GET "+sidecar.ProofPath, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set(sidecar.ProofHeader, sidecar.Proof(token, r.URL.Query().Get("nonce")))
		w.WriteHeader(http.StatusNoContent)
	})
	if key, _ := a.env(ctx, p, c, sidecar.EnvVaultKey); key != "" {
		sc.withheld = sidecar.NewWithheldQueue()
		mux.Handle(sidecar.WithheldPath, sidecar.WithheldHandler(token, sc.withheld))
		mux.HandleFunc("PUT "+sidecar.VaultPath, func(w http.ResponseWriter, r *http.Request) {
			if r.Header.Get(egress.AuthHeader) != token {
				w.WriteHeader(http.StatusUnauthorized)
				return
			}
			sc.mu.Lock()
			sc.vaults++
			sc.mu.Unlock()
			w.WriteHeader(http.StatusNoContent)
		})
	}
	sc.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go sc.srv.Serve(ln)
	return sc, true
}

func (s *standInSidecar) Get(string) (policy.NetworkPolicy, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pol, nil
}

func (s *standInSidecar) Modify(_ context.Context, _ string, fn func(policy.NetworkPolicy) (policy.NetworkPolicy, error)) (policy.NetworkPolicy, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	next, err := fn(s.pol)
	if err != nil {
		return s.pol, err
	}
	if _, err := policy.Compile(next); err != nil {
		return s.pol, err
	}
	s.pol = next
	s.set++
	return next, nil
}

// SidecarPolicy returns the policy in force in the stand-in egress
// sidecar of the pod with IP ip (Options.Agents) and how many times it
// was set through its egress API; not ok when the pod has none.
func (e *Env) SidecarPolicy(ip string) (policy.NetworkPolicy, int, bool) {
	if e.agents == nil {
		return policy.NetworkPolicy{}, 0, false
	}
	e.agents.mu.Lock()
	ag, ok := e.agents.serving[ip]
	e.agents.mu.Unlock()
	if !ok || ag.sidecar == nil {
		return policy.NetworkPolicy{}, 0, false
	}
	ag.sidecar.mu.Lock()
	defer ag.sidecar.mu.Unlock()
	return ag.sidecar.pol, ag.sidecar.set, true
}

// SidecarWithhold has the stand-in egress sidecar of the pod with IP ip
// report w as its credential proxy would, once the server has pushed a
// vault to it; not ok when the pod has no sidecar with a vault key or no
// push came yet.
func (e *Env) SidecarWithhold(ip string, w mitm.Withheld) bool {
	sc := e.standIn(ip)
	if sc == nil || sc.withheld == nil {
		return false
	}
	sc.mu.Lock()
	pushed := sc.vaults > 0
	sc.mu.Unlock()
	if pushed {
		sc.withheld.Report(context.Background(), w)
	}
	return pushed
}

func (e *Env) standIn(ip string) *standInSidecar {
	if e.agents == nil {
		return nil
	}
	e.agents.mu.Lock()
	defer e.agents.mu.Unlock()
	if ag, ok := e.agents.serving[ip]; ok {
		return ag.sidecar
	}
	return nil
}

// WithoutSidecars has the pods that start until t ends run no stand-in
// egress sidecar (as if theirs never answered).
func (e *Env) WithoutSidecars(t interface{ Cleanup(func()) }) {
	if e.agents == nil {
		return
	}
	e.agents.noSidecars.Store(true)
	t.Cleanup(func() { e.agents.noSidecars.Store(false) })
}
