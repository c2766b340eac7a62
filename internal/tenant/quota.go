package tenant

import (
	"fmt"
	"strings"

	"github.com/moat-sandbox/moat/internal/errdefs"
)

// CodeQuotaExceeded is the API code of a create or claim refused by a
// tenant quota (403, as Kubernetes answers a ResourceQuota refusal: a
// retry does not help until something is deleted or the quota raised).
const CodeQuotaExceeded = "TENANT::QUOTA_EXCEEDED"

// Quota bounds what a tenant's live sandboxes may hold at once. A zero
// field is unlimited.
type Quota struct {
	// Sandboxes is the number of live (not Failed or Terminated)
	// sandboxes. Idle warm-pool sandboxes do not count until claimed.
	Sandboxes int `json:"sandboxes,omitempty"`
	// CPUMillis is the sum of the sandboxes' CPU limits, in millicores.
	CPUMillis int64 `json:"cpuMillis,omitempty"`
	// MemoryBytes is the sum of the sandboxes' memory limits, in bytes.
	MemoryBytes int64 `json:"memoryBytes,omitempty"`
}

// Zero reports whether q limits nothing.
func (q Quota) Zero() bool { return q == Quota{} }

// Validate rejects negative limits.
func (q Quota) Validate() error {
	if q.Sandboxes < 0 || q.CPUMillis < 0 || q.MemoryBytes < 0 {
		return errdefs.Invalid("TENANT::INVALID_QUOTA", "quota values must not be negative (0 or absent = unlimited)")
	}
	return nil
}

// Usage is what a tenant's live sandboxes hold.
type Usage struct {
	Sandboxes   int   `json:"sandboxes"`
	CPUMillis   int64 `json:"cpuMillis"`
	MemoryBytes int64 `json:"memoryBytes"`
}

// Add returns u plus n sandboxes of cpu millicores and mem bytes each.
func (u Usage) Add(n int, cpu, mem int64) Usage {
	return Usage{Sandboxes: u.Sandboxes + n, CPUMillis: u.CPUMillis + int64(n)*cpu, MemoryBytes: u.MemoryBytes + int64(n)*mem}
}

// Admit checks that tenant, using used, may add n sandboxes with the given
// CPU (millicores) and memory (bytes) limits each. A sandbox without a
// limit (0) cannot be counted against a CPU or memory quota, so a tenant
// with such a quota must set the limit (as Kubernetes requires limits in
// a namespace with a ResourceQuota). Errors carry public messages.
func (q Quota) Admit(tenant string, used Usage, n int, cpu, mem int64) error {
	if q.Zero() {
		return nil
	}
	if q.CPUMillis > 0 && cpu <= 0 {
		return errdefs.Invalid("SANDBOX::INVALID_PARAMETER",
			fmt.Sprintf("tenant %s has a CPU quota: resourceLimits.cpu is required", tenant))
	}
	if q.MemoryBytes > 0 && mem <= 0 {
		return errdefs.Invalid("SANDBOX::INVALID_PARAMETER",
			fmt.Sprintf("tenant %s has a memory quota: resourceLimits.memory is required", tenant))
	}
	want := used.Add(n, cpu, mem)
	var over []string
	if q.Sandboxes > 0 && want.Sandboxes > q.Sandboxes {
		over = append(over, fmt.Sprintf("sandboxes %d in use + %d requested > quota %d", used.Sandboxes, n, q.Sandboxes))
	}
	if q.CPUMillis > 0 && want.CPUMillis > q.CPUMillis {
		over = append(over, fmt.Sprintf("cpu %dm in use + %dm requested > quota %dm", used.CPUMillis, int64(n)*cpu, q.CPUMillis))
	}
	if q.MemoryBytes > 0 && want.MemoryBytes > q.MemoryBytes {
		over = append(over, fmt.Sprintf("memory %s in use + %s requested > quota %s", mib(used.MemoryBytes), mib(int64(n)*mem), mib(q.MemoryBytes)))
	}
	if len(over) == 0 {
		return nil
	}
	return errdefs.WithPublic(fmt.Errorf("tenant %s quota: %w", tenant, errdefs.ErrPermissionDenied),
		CodeQuotaExceeded, fmt.Sprintf("tenant %s quota exceeded: %s", tenant, strings.Join(over, "; ")))
}

// mib formats bytes in MiB (exact bytes when not a whole MiB).
func mib(b int64) string {
	if b%(1<<20) == 0 {
		return fmt.Sprintf("%dMi", b>>20)
	}
	return fmt.Sprintf("%dB", b)
}
