package client

import (
	"context"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// Audit record kinds (AuditOptions.Kinds).
const (
	AuditKindLifecycle  = "lifecycle"
	AuditKindCommand    = "command"
	AuditKindPTY        = "pty"
	AuditKindFile       = "file"
	AuditKindEgress     = "egress"
	AuditKindCredential = "credential"
)

// AuditRecord is one entry of a sandbox's audit trail: who did what, when.
// It never holds command output, an environment or a credential value.
type AuditRecord struct {
	Seq        uint64           `json:"seq"`
	Time       time.Time        `json:"time"`
	Kind       string           `json:"kind"`
	Action     string           `json:"action"`
	SandboxID  string           `json:"sandboxId"`
	Tenant     string           `json:"tenant,omitempty"`
	Actor      *AuditActor      `json:"actor,omitempty"`
	RequestID  string           `json:"requestId,omitempty"`
	TraceID    string           `json:"traceId,omitempty"`
	Status     int              `json:"status,omitempty"`
	DurationMS *float64         `json:"durationMs,omitempty"`
	Command    *AuditCommand    `json:"command,omitempty"`
	Files      []AuditFile      `json:"files,omitempty"`
	Egress     *AuditEgress     `json:"egress,omitempty"`
	Credential *AuditCredential `json:"credential,omitempty"`
	// Count is how many like events an aggregated record stands for (0: 1).
	Count int `json:"count,omitempty"`
}

// AuditActor is the API key that asked (its id, never the key).
type AuditActor struct {
	KeyID  string `json:"keyId,omitempty"`
	Tenant string `json:"tenant,omitempty"`
	Role   string `json:"role,omitempty"`
}

// AuditCommand is a command or terminal session.
type AuditCommand struct {
	Line       string `json:"line,omitempty"`
	Cwd        string `json:"cwd,omitempty"`
	UID        *int   `json:"uid,omitempty"`
	GID        *int   `json:"gid,omitempty"`
	Background bool   `json:"background,omitempty"`
	Session    string `json:"session,omitempty"`
	ExitCode   *int   `json:"exitCode,omitempty"`
	Error      string `json:"error,omitempty"`
}

// AuditFile is a path a file operation touched.
type AuditFile struct {
	Path string `json:"path"`
	Dest string `json:"dest,omitempty"`
	Size *int64 `json:"size,omitempty"`
}

// AuditEgress is an egress decision.
type AuditEgress struct {
	Host    string `json:"host"`
	Port    int    `json:"port,omitempty"`
	Allowed bool   `json:"allowed"`
	Rule    string `json:"rule"`
	Layer   string `json:"layer"`
}

// AuditCredential is a Credential Vault binding applied to (or withheld
// from) a request.
type AuditCredential struct {
	Binding  string `json:"binding"`
	Host     string `json:"host"`
	Injected bool   `json:"injected"`
}

// AuditPage is one page of a trail, oldest first.
type AuditPage struct {
	Items []AuditRecord `json:"items"`
	// NextCursor is the Cursor of the next page ("" on the last).
	NextCursor string `json:"nextCursor,omitempty"`
}

// AuditOptions select records; zero values mean no filter.
type AuditOptions struct {
	Kinds        []string
	Since, Until time.Time
	Cursor       string
	Limit        int
}

// Audit returns one page of sandbox id's audit trail (readable after the
// sandbox is deleted, for the server's retention).
func (c *Client) Audit(ctx context.Context, id string, opts AuditOptions) (*AuditPage, error) {
	q := url.Values{}
	for _, k := range opts.Kinds {
		q.Add("kind", k)
	}
	if !opts.Since.IsZero() {
		q.Set("since", opts.Since.UTC().Format(time.RFC3339Nano))
	}
	if !opts.Until.IsZero() {
		q.Set("until", opts.Until.UTC().Format(time.RFC3339Nano))
	}
	if opts.Cursor != "" {
		q.Set("cursor", opts.Cursor)
	}
	if opts.Limit > 0 {
		q.Set("limit", strconv.Itoa(opts.Limit))
	}
	var out AuditPage
	if err := c.lc.json(ctx, &call{method: http.MethodGet, path: sandboxPath(id, "audit"), query: q}, nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}
