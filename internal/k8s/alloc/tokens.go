package alloc

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"maps"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Pool pods get an access token of their own: the pool's token Secret
// holds one key per pod (the pod name) and the pod's agent reads its key
// (TokenEnvVar). A token shared by the pool's pods would let the code of
// one claimed sandbox, which can read its agent's environment, reach
// every other free pod of the pool, and plant something in a pod that
// another tenant claims later.

// NewToken returns a random access token.
func NewToken() string {
	b := make([]byte, 16)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// TokenEnvVar is the agent token variable of pool pod pod.
func TokenEnvVar(pool, pod string) corev1.EnvVar {
	return corev1.EnvVar{Name: TokenEnv, ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
		LocalObjectReference: corev1.LocalObjectReference{Name: TokenSecretName(pool)}, Key: pod,
	}}}
}

// EgressTokenKey is the key of pool pod pod's egress API token in its
// pool's token Secret: the pods of a pool whose template names an egress
// Secret (sbv1.AnnoEgress) each get an egress sidecar with a token of its
// own, which only the sidecar reads (the sandbox container never sees it:
// it is the key to the pod's network policy). No pod name ends so (they
// end in a random suffix).
func EgressTokenKey(pod string) string { return pod + ".egress" }

// EgressTokenEnvVar is the variable name holding pool pod pod's egress
// token, for its egress sidecar.
func EgressTokenEnvVar(name, pool, pod string) corev1.EnvVar {
	return corev1.EnvVar{Name: name, ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
		LocalObjectReference: corev1.LocalObjectReference{Name: TokenSecretName(pool)}, Key: EgressTokenKey(pod),
	}}}
}

// EgressSecretName is the name of the egress Secret (sbv1.AnnoEgress) a
// pool's template names: the policy its pods start under and their DNS
// upstreams, shared by the pool's pods (their tokens are their own, in
// the token Secret). It goes with the pool's token Secret.
func EgressSecretName(pool string) string { return objectName(pool, "moat-egress") }

// AddTokens records a new token for each of pods in pool's token Secret
// (creating it if needed), and an egress token for each too when egress
// is set (EgressTokenKey), with one write guarded by the Secret's
// resourceVersion (retried on a conflict), and returns the agent tokens.
// Call it before creating the pods: a pod whose key is missing cannot
// start.
func AddTokens(ctx context.Context, c client.Client, pool types.NamespacedName, pods []string, egress bool) (map[string]string, error) {
	toks := make(map[string]string, len(pods))
	for _, p := range pods {
		toks[p] = NewToken()
	}
	return toks, updateTokens(ctx, c, pool, func(data map[string][]byte) bool {
		for p, t := range toks {
			data[p] = []byte(t)
			if egress {
				data[EgressTokenKey(p)] = []byte(NewToken())
			}
		}
		return true
	})
}

// RemoveTokens forgets the tokens of pods (deleted pods) in pool's token
// Secret.
func RemoveTokens(ctx context.Context, c client.Client, pool types.NamespacedName, pods []string) error {
	return updateTokens(ctx, c, pool, func(data map[string][]byte) bool {
		n := len(data)
		for _, p := range pods {
			delete(data, p)
			delete(data, EgressTokenKey(p))
		}
		return len(data) != n
	})
}

func updateTokens(ctx context.Context, c client.Client, pool types.NamespacedName, edit func(map[string][]byte) bool) error {
	key := types.NamespacedName{Namespace: pool.Namespace, Name: TokenSecretName(pool.Name)}
	for attempt := 0; attempt < 50; attempt++ {
		var s corev1.Secret
		err := c.Get(ctx, key, &s)
		switch {
		case apierrors.IsNotFound(err):
			s = corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name,
				Labels: map[string]string{LabelTokens: "true", LabelPoolData: "tokens"}, Annotations: map[string]string{AnnoPool: pool.Name}}}
			s.Data = map[string][]byte{}
			if !edit(s.Data) {
				return nil
			}
			err = c.Create(ctx, &s)
		case err != nil:
			return fmt.Errorf("pool %s tokens: %w", pool.Name, err)
		default:
			s.Data = maps.Clone(s.Data)
			if s.Data == nil {
				s.Data = map[string][]byte{}
			}
			if !edit(s.Data) {
				return nil
			}
			if s.Labels[LabelPoolData] != "tokens" {
				// Made before the label: the servers' caches select it.
				s.Labels = maps.Clone(s.Labels)
				if s.Labels == nil {
					s.Labels = map[string]string{}
				}
				s.Labels[LabelPoolData] = "tokens"
			}
			err = c.Update(ctx, &s)
		}
		if err == nil {
			return nil
		}
		if !apierrors.IsConflict(err) && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("pool %s tokens: %w", pool.Name, err)
		}
	}
	return fmt.Errorf("pool %s tokens: too much contention", pool.Name)
}
