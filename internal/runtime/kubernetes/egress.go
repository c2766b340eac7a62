package kubernetes

import (
	"bufio"
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	sbv1 "github.com/moat-sandbox/moat/api/v1alpha1"
	"github.com/moat-sandbox/moat/internal/egress"
	"github.com/moat-sandbox/moat/internal/egress/dnsproxy"
	"github.com/moat-sandbox/moat/internal/egress/mitm"
	"github.com/moat-sandbox/moat/internal/egress/policy"
	"github.com/moat-sandbox/moat/internal/egress/sidecar"
	"github.com/moat-sandbox/moat/internal/egress/vault"
	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/k8s/alloc"
	"github.com/moat-sandbox/moat/internal/runtime"
)

// Egress policies on this backend are enforced inside each pod by moat's
// egress sidecar (package sidecar), which the controller adds to the pods
// of templates that name an egress Secret (sbv1.AnnoEgress): the pod
// starts under the policy of Spec.Egress, kept in the sandbox's token
// Secret with the egress token and the DNS upstreams; a pool's pods
// start allowing everything (poolEgress). Egress (below) is
// the server's side: the lifecycle's live changes go to the sidecar's
// egress API with the sandbox's egress token.

// validateEgress refuses what the sidecar cannot enforce.
func (r *Runtime) validateEgress(spec runtime.Spec) error {
	if spec.Egress == nil {
		return nil
	}
	if spec.Egress.CredentialProxy && spec.Class != "" {
		// The credential proxy runs in the sidecar, whose intercept
		// table a sandbox runtime's kernel would not apply either.
		return errdefs.Newf(errdefs.ErrNotImplemented, "credentialProxy is not supported with runtime class %q on the kubernetes runtime (only the default class)", spec.Class)
	}
	if spec.Class != "" {
		// A sandbox runtime (gVisor) runs the sidecar inside its own
		// kernel, which does not filter the pod's network namespace.
		return errdefs.Newf(errdefs.ErrNotImplemented, "networkPolicy is not supported with runtime class %q on the kubernetes runtime (only the default class)", spec.Class)
	}
	if _, err := policy.Compile(spec.Egress.Policy); err != nil {
		return err
	}
	return nil
}

// egressSecret adds spec's egress keys to the data of its token Secret.
func (r *Runtime) egressSecret(spec runtime.Spec, data map[string]string) error {
	if spec.Egress == nil {
		return nil
	}
	p, err := json.Marshal(spec.Egress.Policy)
	if err != nil {
		return fmt.Errorf("egress policy: %w", err)
	}
	ups := r.cfg.DNSUpstreams
	if len(ups) == 0 {
		if ups, err = dnsproxy.UpstreamsFromResolvConf("/etc/resolv.conf"); err != nil || len(ups) == 0 {
			return errdefs.Newf(errdefs.ErrFailedPrecondition, "networkPolicy needs a DNS upstream for the egress sidecar (--dns-upstream)")
		}
	}
	data[sbv1.EgressSecretToken] = spec.Egress.Token
	data[sbv1.EgressSecretPolicy] = string(p)
	data[sbv1.EgressSecretDNS] = strings.Join(ups, ",")
	if spec.Egress.CredentialProxy {
		key := make([]byte, vault.KeySize)
		rand.Read(key)
		data[sbv1.EgressSecretVaultKey] = hex.EncodeToString(key)
		clear(key)
	}
	return nil
}

// poolEgress gives the pods of pool name (template tpl, runtime class
// class) an egress sidecar, so that a claim with a network policy stays
// warm: the pods start allowing everything (as a pool pod without a
// sidecar would), each with an egress token of its own in the pool's
// token Secret (alloc.EgressTokenKey, which the controller makes), and a
// claim sets its sandbox's policy through the sidecar's egress API
// (Egress.Attach). The shared part (the starting policy, the DNS
// upstreams) is the pool's egress Secret. Pools of a sandbox runtime
// class get none (see validateEgress), nor does a server with no DNS
// upstream for the sidecar: their claims with a policy are refused.
func (r *Runtime) poolEgress(ctx context.Context, name string, tpl *corev1.PodTemplateSpec, class string) error {
	if class != "" {
		return nil
	}
	data := map[string]string{}
	spec := runtime.Spec{Egress: &runtime.Egress{Token: alloc.NewToken(), Policy: policy.AllowAll()}}
	if err := r.egressSecret(spec, data); errdefs.IsFailedPrecondition(err) {
		return nil
	} else if err != nil {
		return err
	}
	key := types.NamespacedName{Namespace: r.cfg.Namespace, Name: alloc.EgressSecretName(name)}
	sec := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name,
			Labels:      map[string]string{labelScope: r.cfg.Scope, alloc.LabelPoolData: "egress"},
			Annotations: map[string]string{alloc.AnnoPool: name}},
		StringData: data,
	}
	err := r.c.Create(ctx, sec)
	if apierrors.IsAlreadyExists(err) {
		// The pool's update, or a pool made again: the DNS upstreams
		// may have changed; the token stays (pods use it to start).
		var cur corev1.Secret
		if err = r.c.Get(ctx, key, &cur); err == nil {
			if tok := cur.Data[sbv1.EgressSecretToken]; len(tok) > 0 {
				data[sbv1.EgressSecretToken] = string(tok)
			}
			cur.Data, cur.StringData = nil, data
			err = r.c.Update(ctx, &cur)
		}
	}
	if err != nil {
		return classify("pool "+name+" egress secret", err)
	}
	if tpl.Annotations == nil {
		tpl.Annotations = map[string]string{}
	}
	tpl.Annotations[sbv1.AnnoEgress] = key.Name
	return nil
}

// Egress returns the server's side of the backend's egress enforcement
// (lifecycle.Egress): calls to each sandbox's egress sidecar.
func (r *Runtime) Egress() *Egress { return r.egress }

// Egress drives the egress sidecars of the backend's sandboxes through
// their egress API. It keeps no policy: the sidecar holds the one in
// force, the lifecycle's record the sandbox's own. It keeps the watches
// of the credentials the sidecars' proxies withhold (withheld.go).
type Egress struct {
	rt *Runtime

	mu       sync.Mutex
	watching map[string]*withheldWatch // by sandbox ID
	wg       sync.WaitGroup
	stopped  bool
}

func newEgress(r *Runtime) *Egress {
	return &Egress{rt: r, watching: map[string]*withheldWatch{}}
}

// Attach sets p on sandbox id's sidecar. The pod started under the
// policy it was created with; this confirms it (a tenant guardrail may
// have changed since) and re-asserts it after a server restart. A
// sandbox claimed from a pool gets its policy so (poolEgress). A sandbox
// created cold without a policy has no sidecar, and a pod cannot gain
// one.
func (e *Egress) Attach(ctx context.Context, id string, _ netip.Addr, p policy.NetworkPolicy) error {
	_, err := e.put(ctx, id, p)
	return err
}

// Detach stops taking sandbox id's withheld credentials; the sidecar goes
// with the pod.
func (e *Egress) Detach(_ context.Context, id string) error {
	e.unwatch(id)
	return nil
}

// Get returns the policy in force in sandbox id.
func (e *Egress) Get(id string) (policy.NetworkPolicy, error) {
	ctx, cancel := context.WithTimeout(context.Background(), e.rt.cfg.EgressTimeout)
	defer cancel()
	return e.call(ctx, id, http.MethodGet, nil)
}

// Modify sets fn(the policy in force) in sandbox id. The lifecycle
// serializes the changes of one sandbox.
func (e *Egress) Modify(ctx context.Context, id string, fn func(policy.NetworkPolicy) (policy.NetworkPolicy, error)) (policy.NetworkPolicy, error) {
	cur, err := e.call(ctx, id, http.MethodGet, nil)
	if err != nil {
		return cur, err
	}
	next, err := fn(cur)
	if err != nil {
		return next, err
	}
	return e.put(ctx, id, next)
}

func (e *Egress) put(ctx context.Context, id string, p policy.NetworkPolicy) (policy.NetworkPolicy, error) {
	b, err := json.Marshal(p)
	if err != nil {
		return policy.NetworkPolicy{}, err
	}
	return e.call(ctx, id, http.MethodPut, b)
}

// call sends one /policy request to sandbox id's sidecar and returns the
// policy its answer reports.
func (e *Egress) call(ctx context.Context, id, method string, body []byte) (policy.NetworkPolicy, error) {
	tok, err := e.token(ctx, id)
	if err != nil {
		return policy.NetworkPolicy{}, err
	}
	code, data, err := e.send(ctx, id, tok, method, "/policy", body)
	if err != nil {
		return policy.NetworkPolicy{}, err
	}
	switch code {
	case http.StatusOK:
	case http.StatusBadRequest:
		return policy.NetworkPolicy{}, errdefs.Newf(errdefs.ErrInvalidArgument, "%s", strings.TrimPrefix(strings.TrimSpace(string(data)), "invalid policy: "))
	default:
		return policy.NetworkPolicy{}, fmt.Errorf("sandbox %s: egress sidecar answered %d: %w", id, code, errdefs.ErrUnavailable)
	}
	var st egress.PolicyStatusResponse
	if err := json.Unmarshal(data, &st); err != nil || st.Policy == nil {
		return policy.NetworkPolicy{}, fmt.Errorf("sandbox %s: egress sidecar answer: %w", id, errdefs.ErrUnavailable)
	}
	return *st.Policy, nil
}

// A sidecar that refuses connections is retried every refusedRetry for
// refusedGrace before the call fails.
const (
	refusedGrace = 2 * time.Second
	refusedRetry = 50 * time.Millisecond
)

// send sends one request of the egress API to sandbox id's sidecar, with
// token tok, on a connection the sidecar proved its own, and returns the
// answer's status and body.
func (e *Egress) send(ctx context.Context, id, tok, method, path string, body []byte) (int, []byte, error) {
	return e.sendWithin(ctx, id, tok, method, path, body, e.rt.cfg.EgressTimeout)
}

// sendWithin is send with the answer due within timeout.
func (e *Egress) sendWithin(ctx context.Context, id, tok, method, path string, body []byte, timeout time.Duration) (int, []byte, error) {
	addr, err := e.rt.Endpoint(ctx, id, sidecar.Port)
	if err != nil {
		return 0, nil, err
	}
	// One connection, proved to be the sidecar's before the token goes.
	tr := &http.Transport{DialContext: dialSidecar(tok), DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	var resp *http.Response
	for start := time.Now(); ; {
		var req *http.Request
		req, err = http.NewRequestWithContext(ctx, method, "http://"+addr+path, bytes.NewReader(body))
		if err != nil {
			return 0, nil, err
		}
		req.Header.Set(egress.AuthHeader, tok)
		req.Header.Set("Content-Type", "application/json")
		resp, err = (&http.Client{Transport: tr, Timeout: timeout}).Do(req)
		// A refused connection is a sidecar restarting (it is started and
		// probed before the pod's containers): ride over it a moment.
		if err == nil || !errors.Is(err, syscall.ECONNREFUSED) || time.Since(start) > refusedGrace || ctx.Err() != nil {
			break
		}
		time.Sleep(refusedRetry)
	}
	if err != nil {
		if errors.Is(err, errNotSidecar) {
			return 0, nil, fmt.Errorf("sandbox %s: %w", id, err)
		}
		if errors.Is(err, syscall.ECONNREFUSED) {
			return 0, nil, fmt.Errorf("sandbox %s: egress sidecar not listening: %w", id, errdefs.ErrUnavailable)
		}
		return 0, nil, fmt.Errorf("sandbox %s: egress sidecar: %w: %v", id, errdefs.ErrUnavailable, err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	return resp.StatusCode, data, nil
}

// AttachProxy implements credvault.CredentialProxy: it pushes sandbox
// id's CA and vault to the credential proxy of its sidecar, and has
// withheld (nil: none) told of the credentials the proxy withholds
// (watchWithheld).
func (e *Egress) AttachProxy(ctx context.Context, id string, ca *mitm.CA, state *vault.State, withheld func(context.Context, mitm.Withheld)) error {
	if err := e.SetProxyRules(ctx, id, ca, state); err != nil {
		return err
	}
	if withheld != nil {
		e.watchWithheld(id, withheld)
	}
	return nil
}

// SetProxyRules implements credvault.CredentialProxy: it seals ca's key
// and state under the sandbox's own vault key and PUTs them to its
// sidecar, which answers once the rules are in force.
func (e *Egress) SetProxyRules(ctx context.Context, id string, ca *mitm.CA, state *vault.State) error {
	sec, err := e.secret(ctx, id)
	if err != nil {
		return err
	}
	body, err := sealForSidecar(sec[sbv1.EgressSecretVaultKey], ca, state, e.rt.cfg.VaultUpstreamCA)
	if err != nil {
		return fmt.Errorf("sandbox %s: %w", id, err)
	}
	code, _, err := e.send(ctx, id, string(sec[sbv1.EgressSecretToken]), http.MethodPut, sidecar.VaultPath, body)
	if err != nil {
		return err
	}
	switch code {
	case http.StatusNoContent:
		return nil
	case http.StatusNotImplemented:
		return fmt.Errorf("sandbox %s: its egress sidecar runs no credential proxy: %w", id, errdefs.ErrNotImplemented)
	default:
		return fmt.Errorf("sandbox %s: egress sidecar answered %d to the vault: %w", id, code, errdefs.ErrUnavailable)
	}
}

// sealForSidecar is the body of a PUT of sidecar.VaultPath: ca, state
// and upstreamCA (PEM, nil: none) sealed under hexKey, a pod's vault key
// (sbv1.EgressSecretVaultKey).
func sealForSidecar(hexKey []byte, ca *mitm.CA, state *vault.State, upstreamCA []byte) ([]byte, error) {
	if len(hexKey) == 0 {
		return nil, fmt.Errorf("created without credentialProxy, its pod has no vault key: %w", errdefs.ErrNotImplemented)
	}
	key, err := vault.ParseKey(string(hexKey))
	if err != nil {
		return nil, fmt.Errorf("pod vault key: %w", err)
	}
	sl, err := vault.NewSealer(key)
	clear(key)
	if err != nil {
		return nil, err
	}
	der, err := ca.KeyDER()
	if err != nil {
		return nil, err
	}
	defer clear(der)
	sealed, err := vault.SealState(sl, sidecar.VaultAD, state, der)
	if err != nil {
		return nil, err
	}
	req := sidecar.VaultRequest{CACert: ca.CertPEM(), Sealed: sealed}
	if len(upstreamCA) > 0 {
		req.UpstreamCA = sl.Seal(sidecar.UpstreamCAAD, upstreamCA)
	}
	return json.Marshal(req)
}

// token reads sandbox id's egress token from its Secret.
func (e *Egress) token(ctx context.Context, id string) (string, error) {
	sec, err := e.secret(ctx, id)
	if err != nil {
		return "", err
	}
	return string(sec[sbv1.EgressSecretToken]), nil
}

// secret reads the egress keys of sandbox id's token Secret; it has an
// egress token.
func (e *Egress) secret(ctx context.Context, id string) (map[string][]byte, error) {
	if !runtime.ValidID(id) {
		return nil, fmt.Errorf("sandbox %q: %w", id, errdefs.ErrNotFound)
	}
	if keys, ok, err := e.claimToken(ctx, id, false); ok || err != nil {
		return keys, err
	}
	ns, err := e.rt.locate(ctx, id) // a tenant's namespace, with tenant namespaces
	if err != nil {
		return nil, err
	}
	var sec corev1.Secret
	err = e.rt.c.Get(ctx, types.NamespacedName{Namespace: ns, Name: id + tokenSecretSufx}, &sec)
	if apierrors.IsNotFound(err) {
		// Claimed a moment ago by another replica?
		if keys, ok, err := e.claimToken(ctx, id, true); ok || err != nil {
			return keys, err
		}
	}
	if err != nil {
		return nil, classify("sandbox "+id+" egress token", err)
	}
	if len(sec.Data[sbv1.EgressSecretToken]) == 0 {
		return nil, errdefs.Newf(errdefs.ErrNotImplemented, "sandbox %s was created without a network policy: its pod has no egress sidecar, and a pod's containers are fixed when it is made", id)
	}
	return sec.Data, nil
}

// claimToken returns the egress keys of sandbox id's pool pod when id
// was claimed from a pool (ok): its egress token (claims have no vault),
// read fresh from the API server when fresh is set (see Runtime.claimed).
func (e *Egress) claimToken(ctx context.Context, id string, fresh bool) (map[string][]byte, bool, error) {
	pool, pod, _, ok, err := e.rt.claimed(ctx, id, fresh)
	if err != nil || !ok {
		return nil, false, err
	}
	tok := e.rt.tokens(pool)[alloc.EgressTokenKey(pod)]
	if len(tok) == 0 {
		return nil, true, errdefs.Newf(errdefs.ErrNotImplemented, "sandbox %s was claimed from pool %s, whose pods have no egress sidecar (a pool of runtime class sandboxes, or made by hand without one)", id, pool.Name)
	}
	return map[string][]byte{sbv1.EgressSecretToken: tok}, true, nil
}

// errNotSidecar: what listens on the egress API port did not prove it
// holds the sandbox's egress token (sidecar.Proof).
var errNotSidecar = fmt.Errorf("the egress API port is not answered by the sandbox's egress sidecar: %w", errdefs.ErrUnavailable)

// dialSidecar dials the egress API and, before the connection carries the
// token, has its peer prove it holds it: a sandbox process that bound the
// port while its sidecar restarted learns nothing and is not believed.
func dialSidecar(token string) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		if d, ok := ctx.Deadline(); ok {
			c.SetDeadline(d)
		}
		var b [16]byte
		rand.Read(b[:])
		nonce := hex.EncodeToString(b[:])
		resp, err := func() (*http.Response, error) {
			if _, err := fmt.Fprintf(c, "GET %s?nonce=%s HTTP/1.1\r\nHost: %s\r\n\r\n", sidecar.ProofPath, nonce, addr); err != nil {
				return nil, err
			}
			return http.ReadResponse(bufio.NewReader(c), nil)
		}()
		if err != nil {
			c.Close()
			return nil, err
		}
		io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
		resp.Body.Close()
		if !hmac.Equal([]byte(resp.Header.Get(sidecar.ProofHeader)), []byte(sidecar.Proof(token, nonce))) {
			c.Close()
			return nil, errNotSidecar
		}
		c.SetDeadline(time.Time{})
		return c, nil
	}
}
