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
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	sbv1 "github.com/moat-sandbox/moat/api/v1alpha1"
	"github.com/moat-sandbox/moat/internal/egress"
	"github.com/moat-sandbox/moat/internal/egress/dnsproxy"
	"github.com/moat-sandbox/moat/internal/egress/policy"
	"github.com/moat-sandbox/moat/internal/egress/sidecar"
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
func (r *Runtime) Egress() *Egress { return &Egress{rt: r} }

// Egress drives the egress sidecars of the backend's sandboxes through
// their egress API. It keeps no state: the sidecar holds the policy in
// force, the lifecycle's record the sandbox's own.
type Egress struct {
	rt *Runtime
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

// Detach does nothing: the sidecar goes with the pod.
func (e *Egress) Detach(context.Context, string) error { return nil }

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
	addr, err := e.rt.Endpoint(ctx, id, sidecar.Port)
	if err != nil {
		return policy.NetworkPolicy{}, err
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://"+addr+"/policy", bytes.NewReader(body))
	if err != nil {
		return policy.NetworkPolicy{}, err
	}
	req.Header.Set(egress.AuthHeader, tok)
	req.Header.Set("Content-Type", "application/json")
	// One connection, proved to be the sidecar's before the token goes.
	tr := &http.Transport{DialContext: dialSidecar(tok), DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr, Timeout: e.rt.cfg.EgressTimeout}).Do(req)
	if err != nil {
		if errors.Is(err, errNotSidecar) {
			return policy.NetworkPolicy{}, fmt.Errorf("sandbox %s: %w", id, err)
		}
		if errors.Is(err, syscall.ECONNREFUSED) {
			return policy.NetworkPolicy{}, fmt.Errorf("sandbox %s: egress sidecar not listening: %w", id, errdefs.ErrUnavailable)
		}
		return policy.NetworkPolicy{}, fmt.Errorf("sandbox %s: egress sidecar: %w: %v", id, errdefs.ErrUnavailable, err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	switch {
	case resp.StatusCode == http.StatusOK:
	case resp.StatusCode == http.StatusBadRequest:
		return policy.NetworkPolicy{}, errdefs.Newf(errdefs.ErrInvalidArgument, "%s", strings.TrimPrefix(strings.TrimSpace(string(data)), "invalid policy: "))
	default:
		return policy.NetworkPolicy{}, fmt.Errorf("sandbox %s: egress sidecar answered %d: %w", id, resp.StatusCode, errdefs.ErrUnavailable)
	}
	var st egress.PolicyStatusResponse
	if err := json.Unmarshal(data, &st); err != nil || st.Policy == nil {
		return policy.NetworkPolicy{}, fmt.Errorf("sandbox %s: egress sidecar answer: %w", id, errdefs.ErrUnavailable)
	}
	return *st.Policy, nil
}

// token reads sandbox id's egress token from its Secret.
func (e *Egress) token(ctx context.Context, id string) (string, error) {
	if !runtime.ValidID(id) {
		return "", fmt.Errorf("sandbox %q: %w", id, errdefs.ErrNotFound)
	}
	if tok, ok, err := e.claimToken(ctx, id, false); ok || err != nil {
		return tok, err
	}
	ns, err := e.rt.locate(ctx, id) // a tenant's namespace, with tenant namespaces
	if err != nil {
		return "", err
	}
	var sec corev1.Secret
	err = e.rt.c.Get(ctx, types.NamespacedName{Namespace: ns, Name: id + tokenSecretSufx}, &sec)
	if apierrors.IsNotFound(err) {
		// Claimed a moment ago by another replica?
		if tok, ok, err := e.claimToken(ctx, id, true); ok || err != nil {
			return tok, err
		}
	}
	if err != nil {
		return "", classify("sandbox "+id+" egress token", err)
	}
	tok := string(sec.Data[sbv1.EgressSecretToken])
	if tok == "" {
		return "", errdefs.Newf(errdefs.ErrNotImplemented, "sandbox %s was created without a network policy: its pod has no egress sidecar, and a pod's containers are fixed when it is made", id)
	}
	return tok, nil
}

// claimToken returns the egress token of sandbox id's pool pod when id
// was claimed from a pool (ok), read fresh from the API server when fresh
// is set (see Runtime.claimed).
func (e *Egress) claimToken(ctx context.Context, id string, fresh bool) (string, bool, error) {
	pool, pod, _, ok, err := e.rt.claimed(ctx, id, fresh)
	if err != nil || !ok {
		return "", false, err
	}
	tok := string(e.rt.tokens(pool)[alloc.EgressTokenKey(pod)])
	if tok == "" {
		return "", true, errdefs.Newf(errdefs.ErrNotImplemented, "sandbox %s was claimed from pool %s, whose pods have no egress sidecar (a pool of runtime class sandboxes, or made by hand without one)", id, pool.Name)
	}
	return tok, true, nil
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
