// Package alloc is the allocation table of a Pool's warm pods: which pod
// belongs to which claim. Every allocator reads and writes it — `moat
// controller` for the BatchSandboxes users create, and every replica of
// `moat serve --runtime kubernetes` for claims made through the Lifecycle
// API — so that none of them hands out a pod another one took: an
// allocation is a write of the table guarded by the resourceVersion it was
// computed from, and that one write is the allocation (a conflict means
// someone else changed the table first, and the allocation is computed
// again from the newer table).
//
// The table of pool P is a ConfigMap in P's namespace (TableName), with
// data[TableKey] the JSON of Table: the owners of pods (a BatchSandbox,
// or one sandbox of a moat server scope) and the retired pods (released
// or being deleted: never handed out again). Free pods are the pool's
// ready pods that the table does not name. Concurrent changes of one
// table in one process are grouped into one write (Allocator.Apply).
//
// The pool's pods carry their own agent access token, one per pod, kept
// in the pool's token Secret (TokenSecretName), which the controller
// writes before it creates the pods; a claim hands the pod's token to the
// sandbox's owner, so no token is shared between sandboxes.
package alloc

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	sbv1 "github.com/moat-sandbox/moat/api/v1alpha1"
)

// Names, labels and keys of the objects of this package.
const (
	// TableKey is the data key of a table ConfigMap holding Table's JSON.
	TableKey = "table"
	// LabelTable marks table ConfigMaps ("true"); AnnoPool names the pool.
	LabelTable = "moat." + sbv1.Group + "/alloc-table"
	// LabelTokens marks pool token Secrets ("true"); AnnoPool names the pool.
	LabelTokens = "moat." + sbv1.Group + "/pool-tokens"
	// AnnoPool names the pool of a table or token Secret.
	AnnoPool = "moat." + sbv1.Group + "/pool"
	// TokenEnv is the agent's access token variable in a pod.
	TokenEnv = "EXECD_ACCESS_TOKEN"
)

// RetiredTTL is how long a retired pod stays in a table after it is gone
// from the pod cache of the process writing the table: longer than any
// other allocator's cache may lag, so that none sees the pod as free.
const RetiredTTL = 2 * time.Minute

// Table is the allocation record of one pool.
type Table struct {
	// Owners are the claims holding pods, by owner (see BatchOwner and
	// SandboxOwner).
	Owners map[string]Owned `json:"owners,omitempty"`
	// Retired are pods given up, with when: released by their owner, or
	// free pods the pool controller deletes. They are never handed out
	// again, and are forgotten RetiredTTL after they are gone.
	Retired map[string]time.Time `json:"retired,omitempty"`
}

// Owned is what one owner holds.
type Owned struct {
	Pods []string `json:"pods"`
	// At is when the owner was first given pods: a sandbox owner whose
	// server never recorded the sandbox (it died in between) is released
	// after a grace period counted from here.
	At time.Time `json:"at"`
}

// BatchOwner is the owner id of a BatchSandbox's pool pods.
func BatchOwner(name string) string { return "batchsandbox/" + name }

// SandboxOwner is the owner id of sandbox id of a moat server of scope
// (the server's --bridge name, which separates servers in a namespace).
func SandboxOwner(scope, id string) string { return "moat/" + scope + "/" + id }

// SandboxOf returns the sandbox id of an owner of scope, if it is one.
func SandboxOf(scope, owner string) (string, bool) {
	return strings.CutPrefix(owner, "moat/"+scope+"/")
}

// BatchOf returns the BatchSandbox name of an owner, if it is one.
func BatchOf(owner string) (string, bool) { return strings.CutPrefix(owner, "batchsandbox/") }

// TableName is the name of pool's table ConfigMap.
func TableName(pool string) string { return objectName(pool, "moat-alloc") }

// TokenSecretName is the name of pool's token Secret.
func TokenSecretName(pool string) string { return objectName(pool, "moat-tokens") }

// objectName joins pool and suffix into a valid object name (at most 253
// characters; long pool names are cut and made distinct with a hash).
func objectName(pool, suffix string) string {
	if max := 252 - len(suffix); len(pool) > max {
		sum := sha256.Sum256([]byte(pool))
		pool = pool[:max-9] + "-" + hex.EncodeToString(sum[:4])
	}
	return pool + "-" + suffix
}

// Parse reads a table from a ConfigMap's data (nil data: an empty table).
func Parse(data map[string]string) (Table, error) {
	var t Table
	if raw := data[TableKey]; raw != "" {
		if err := json.Unmarshal([]byte(raw), &t); err != nil {
			return Table{}, fmt.Errorf("allocation table: %w", err)
		}
	}
	if t.Owners == nil {
		t.Owners = map[string]Owned{}
	}
	if t.Retired == nil {
		t.Retired = map[string]time.Time{}
	}
	return t, nil
}

// Encode returns the table as ConfigMap data.
func (t Table) Encode() map[string]string {
	b, _ := json.Marshal(t) // maps of strings and times: cannot fail
	return map[string]string{TableKey: string(b)}
}

// Clone deep-copies t.
func (t Table) Clone() Table {
	out := Table{Owners: make(map[string]Owned, len(t.Owners)), Retired: maps.Clone(t.Retired)}
	for k, o := range t.Owners {
		out.Owners[k] = Owned{Pods: slices.Clone(o.Pods), At: o.At}
	}
	if out.Retired == nil {
		out.Retired = map[string]time.Time{}
	}
	return out
}

// Index maps every pod the table names to its owner ("" for a retired
// pod).
func (t Table) Index() map[string]string {
	out := make(map[string]string, len(t.Retired)+len(t.Owners))
	for p := range t.Retired {
		out[p] = ""
	}
	for o, own := range t.Owners {
		for _, p := range own.Pods {
			out[p] = o
		}
	}
	return out
}

// Change is one modification of a pool's table. Changes of one group
// commit are applied in order.
type Change struct {
	// Owner receives Want free pods and gives up Release (or all its pods
	// with ReleaseAll).
	Owner string
	// Want is the number of free pods to give Owner. It gets fewer when
	// the pool has fewer free pods (Result.Pods says which it got).
	Want int
	// Adopt are pods to record as Owner's as they are (the controller
	// re-recording the pool pods of a batch record written before the
	// table existed); a pod the table names already is skipped.
	Adopt []string
	// Release are pods of Owner to retire; ReleaseAll retires all of them
	// and forgets Owner.
	Release    []string
	ReleaseAll bool
	// Retire are free pods to retire (the pool controller is deleting
	// them); a pod the table names already is skipped (Result.Retired
	// says which were retired).
	Retire []string
}

// Result is what a Change did.
type Result struct {
	// Pods are the free pods given to the owner (Want of them at most).
	Pods []string
	// Retired are the pods of Change.Retire that were free and are now
	// retired.
	Retired []string
	// Held are all the pods the owner holds after the change.
	Held []string
}

// apply applies changes to t (in place) at time now and returns their
// results. free lists candidate free pods (ready, of the current
// revision), in the order they should be handed out; a pod the table
// names is skipped. gone reports whether a pod is gone from the pool (for
// the clean-up of retired entries).
func (t *Table) apply(changes []Change, free []string, gone func(string) bool, now time.Time) []Result {
	taken := t.Index()
	out := make([]Result, len(changes))
	fi := 0
	for i, ch := range changes {
		own, had := t.Owners[ch.Owner]
		var rel []string
		if ch.ReleaseAll {
			rel = slices.Clone(own.Pods) // own.Pods shrinks below
		} else {
			rel = ch.Release
		}
		for _, p := range rel {
			if taken[p] == ch.Owner && ch.Owner != "" {
				t.Retired[p] = now
				taken[p] = ""
				own.Pods = slices.DeleteFunc(own.Pods, func(q string) bool { return q == p })
			}
		}
		for _, p := range ch.Retire {
			if _, named := taken[p]; !named {
				t.Retired[p] = now
				taken[p] = ""
				out[i].Retired = append(out[i].Retired, p)
			}
		}
		for _, p := range ch.Adopt {
			if _, named := taken[p]; !named && ch.Owner != "" {
				own.Pods = append(own.Pods, p)
				taken[p] = ch.Owner
			}
		}
		for len(out[i].Pods) < ch.Want && fi < len(free) {
			p := free[fi]
			fi++
			if _, named := taken[p]; named {
				continue
			}
			own.Pods = append(own.Pods, p)
			taken[p] = ch.Owner
			out[i].Pods = append(out[i].Pods, p)
		}
		if ch.Owner == "" {
			continue
		}
		if len(own.Pods) == 0 {
			delete(t.Owners, ch.Owner)
			continue
		}
		if !had || own.At.IsZero() {
			own.At = now
		}
		t.Owners[ch.Owner] = own
		out[i].Held = slices.Clone(own.Pods)
	}
	for p, at := range t.Retired {
		if now.Sub(at) > RetiredTTL && gone(p) {
			delete(t.Retired, p)
		}
	}
	return out
}

// equal reports whether t and o hold the same record.
func (t Table) equal(o Table) bool {
	a, _ := json.Marshal(t)
	b, _ := json.Marshal(o)
	return string(a) == string(b)
}
