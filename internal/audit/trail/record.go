// Package trail keeps each sandbox's audit trail: who changed the sandbox
// (lifecycle calls), what ran in it (commands and terminal sessions, never
// their output), which files were written, moved or deleted, where it
// connected (egress decisions) and which credential was injected (the
// binding and host, never the value). Records are JSON lines in one file
// per sandbox under a directory, bounded per sandbox and in total, and
// kept after the sandbox is deleted for a retention period.
package trail

import (
	"slices"
	"time"

	"github.com/moat-sandbox/moat/internal/errdefs"
)

// Kind is a record's kind.
type Kind string

// Record kinds.
const (
	KindLifecycle  Kind = "lifecycle"  // an API call on the sandbox
	KindCommand    Kind = "command"    // a command run through the agent
	KindPTY        Kind = "pty"        // an interactive terminal session
	KindFile       Kind = "file"       // a file write, move or delete
	KindEgress     Kind = "egress"     // an egress decision
	KindCredential Kind = "credential" // a Credential Vault injection (or a withheld one)
)

// Kinds are every kind, in the order the API documents them.
var Kinds = []Kind{KindLifecycle, KindCommand, KindPTY, KindFile, KindEgress, KindCredential}

// ParseKind returns the kind named s, ErrInvalidArgument if there is none.
func ParseKind(s string) (Kind, error) {
	if k := Kind(s); slices.Contains(Kinds, k) {
		return k, nil
	}
	return "", errdefs.Newf(errdefs.ErrInvalidArgument, "kind %q is not one of lifecycle, command, pty, file, egress, credential", s)
}

// Record is one entry of a sandbox's trail. It never holds a request or
// response body, a header, an environment or command output.
type Record struct {
	// Seq numbers the sandbox's records from 1, in the order written.
	Seq       uint64    `json:"seq"`
	Time      time.Time `json:"time"`
	Kind      Kind      `json:"kind"`
	Action    string    `json:"action"`
	SandboxID string    `json:"sandboxId"`
	// Tenant owns the sandbox.
	Tenant string `json:"tenant,omitempty"`
	// Actor is the API key that asked (absent: the sandbox's own token,
	// or moat itself).
	Actor      *Actor      `json:"actor,omitempty"`
	RequestID  string      `json:"requestId,omitempty"`
	TraceID    string      `json:"traceId,omitempty"`
	SpanID     string      `json:"spanId,omitempty"`
	Status     int         `json:"status,omitempty"`
	DurationMS *float64    `json:"durationMs,omitempty"`
	Command    *Command    `json:"command,omitempty"`
	Files      []File      `json:"files,omitempty"`
	Egress     *Egress     `json:"egress,omitempty"`
	Credential *Credential `json:"credential,omitempty"`
	// Count is how many like events this record stands for (egress and
	// credential records are aggregated; absent: 1).
	Count int `json:"count,omitempty"`
}

// Actor is who asked: an API key's id (never the key), its tenant, role.
type Actor struct {
	KeyID  string `json:"keyId,omitempty"`
	Tenant string `json:"tenant,omitempty"`
	Role   string `json:"role,omitempty"`
}

// Command is a command or terminal session.
type Command struct {
	// Line is the command line (truncated to MaxLine bytes).
	Line       string `json:"line,omitempty"`
	Cwd        string `json:"cwd,omitempty"`
	UID        *int   `json:"uid,omitempty"`
	GID        *int   `json:"gid,omitempty"`
	Background bool   `json:"background,omitempty"`
	// Session is the agent's id of a terminal session.
	Session  string `json:"session,omitempty"`
	ExitCode *int   `json:"exitCode,omitempty"`
	// Error is why the command did not start or did not finish.
	Error string `json:"error,omitempty"`
}

// MaxLine bounds a recorded command line.
const MaxLine = 1024

// File is one path a file operation touched.
type File struct {
	Path string `json:"path"`
	// Dest is where a move put it.
	Dest string `json:"dest,omitempty"`
	// Size is the bytes written (uploads), when known.
	Size *int64 `json:"size,omitempty"`
}

// Egress is one egress decision.
type Egress struct {
	Host    string `json:"host"`
	Port    int    `json:"port,omitempty"`
	Allowed bool   `json:"allowed"`
	// Rule is the policy rule that decided (its target), or "default".
	Rule string `json:"rule"`
	// Layer is where it was decided: dns, proxy.
	Layer string `json:"layer"`
}

// Credential is a Credential Vault binding applied to (or withheld from)
// a request: the binding's name and the host, never the value.
type Credential struct {
	Binding  string `json:"binding"`
	Host     string `json:"host"`
	Injected bool   `json:"injected"`
}

// Audit actions that are not API calls.
const (
	ActionRun      = "run"      // a command
	ActionOpen     = "open"     // a terminal session created
	ActionAttach   = "attach"   // a terminal session attached (its duration)
	ActionClose    = "close"    // a terminal session deleted
	ActionWrite    = "write"    // files uploaded or written
	ActionMove     = "move"     // files moved
	ActionRemove   = "remove"   // files or directories deleted
	ActionMkdir    = "mkdir"    // directories created
	ActionChmod    = "chmod"    // permissions set
	ActionReplace  = "replace"  // contents replaced in place
	ActionAllow    = "allow"    // an egress connection or name allowed
	ActionDeny     = "deny"     // an egress connection or name denied
	ActionInject   = "inject"   // a credential injected
	ActionWithheld = "withheld" // a credential withheld
)
