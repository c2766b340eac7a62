package controller

import (
	"encoding/json"
	"fmt"
	"slices"

	sbv1 "github.com/moat-sandbox/moat/api/v1alpha1"
)

// claim is one sandbox of a batch, as the ledger records it.
type claim struct {
	// Pod is the claim's pod ("" while it has none: not allocated yet, or
	// its pod was deleted and a replacement is due).
	Pod string
	// Pool: the pod is a warm pod of the batch's pool (else it was created
	// for the batch).
	Pool bool
	// IP is the pod's address once it ran ("" before).
	IP string
	// Done: the pod ended, or finished its task and was released; the
	// claim is never given another pod.
	Done bool
}

// record is the allocation of a batch. It is persisted in the batch's
// annotations, in OpenSandbox's shapes plus moat's own keys:
//
//	alloc-status  {"pods":[claim pods...], "pool":[indices of warm pods], "done":[indices]}
//	endpoints     [claim IPs...]
//	alloc-release {"pods":[released pods...]}
//
// OpenSandbox's clients read "pods" and the endpoints and ignore the rest.
type record struct {
	Claims []claim
	// Released are pods the batch gave up while it lives (deleted and
	// replaced, ended with TaskRelease, or past a lowered replicas); they
	// are deleted and never handed out again.
	Released []string
}

type allocStatus struct {
	Pods []string `json:"pods"`
	Pool []int    `json:"pool,omitempty"`
	Done []int    `json:"done,omitempty"`
}

type allocRelease struct {
	Pods []string `json:"pods"`
}

// clone deep-copies r.
func (r record) clone() record {
	return record{Claims: slices.Clone(r.Claims), Released: slices.Clone(r.Released)}
}

// equal reports whether r and o persist the same annotations.
func (r record) equal(o record) bool {
	return slices.Equal(r.Claims, o.Claims) && slices.Equal(r.Released, o.Released)
}

// parseRecord reads a batch's record from its annotations (ok false: it
// has none yet).
func parseRecord(ann map[string]string) (record, bool, error) {
	raw, ok := ann[sbv1.AnnoAllocStatus]
	if !ok || raw == "" {
		return record{}, false, nil
	}
	var st allocStatus
	if err := json.Unmarshal([]byte(raw), &st); err != nil {
		return record{}, false, fmt.Errorf("annotation %s: %w", sbv1.AnnoAllocStatus, err)
	}
	r := record{Claims: make([]claim, len(st.Pods))}
	for i, p := range st.Pods {
		r.Claims[i].Pod = p
	}
	for _, i := range st.Pool {
		if i >= 0 && i < len(r.Claims) {
			r.Claims[i].Pool = true
		}
	}
	for _, i := range st.Done {
		if i >= 0 && i < len(r.Claims) {
			r.Claims[i].Done = true
		}
	}
	if raw := ann[sbv1.AnnoEndpoints]; raw != "" {
		var ips []string
		if err := json.Unmarshal([]byte(raw), &ips); err == nil {
			for i := range min(len(ips), len(r.Claims)) {
				r.Claims[i].IP = ips[i]
			}
		}
	}
	if raw := ann[sbv1.AnnoAllocRelease]; raw != "" {
		var rel allocRelease
		if err := json.Unmarshal([]byte(raw), &rel); err != nil {
			return record{}, false, fmt.Errorf("annotation %s: %w", sbv1.AnnoAllocRelease, err)
		}
		r.Released = rel.Pods
	}
	return r, true, nil
}

// annotate writes r into ann.
func (r record) annotate(ann map[string]string) {
	st := allocStatus{Pods: make([]string, len(r.Claims))}
	ips := make([]string, len(r.Claims))
	for i, c := range r.Claims {
		st.Pods[i], ips[i] = c.Pod, c.IP
		if c.Pool {
			st.Pool = append(st.Pool, i)
		}
		if c.Done {
			st.Done = append(st.Done, i)
		}
	}
	b, _ := json.Marshal(st)
	ann[sbv1.AnnoAllocStatus] = string(b)
	b, _ = json.Marshal(ips)
	ann[sbv1.AnnoEndpoints] = string(b)
	if len(r.Released) > 0 {
		b, _ = json.Marshal(allocRelease{Pods: r.Released})
		ann[sbv1.AnnoAllocRelease] = string(b)
	} else {
		delete(ann, sbv1.AnnoAllocRelease)
	}
}
