package httpapi

import (
	"net/http"

	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/web"
)

// sdkEvent is upstream's MetricsEvent: best-effort telemetry the
// OpenSandbox SDKs (JS 0.1.11, Python) POST to /metrics/events after every
// create, fire-and-forget. The SDK name and version are in User-Agent.
type sdkEvent struct {
	EventType        string   `json:"eventType"`
	SandboxID        string   `json:"sandboxId"`
	Image            string   `json:"image"`
	CreateDurationMs *float64 `json:"createDurationMs"`
	Success          *bool    `json:"success"`
}

// metricsEvent accepts an SDK telemetry event (204) and logs it at debug.
// moat records nothing else: the server already measures create latency.
func (s *Server) metricsEvent(w http.ResponseWriter, r *http.Request) error {
	var ev sdkEvent
	if err := web.DecodeJSON(r, &ev, false); err != nil {
		return err
	}
	switch {
	case ev.EventType == "":
		return errdefs.Invalid("SANDBOX::INVALID_PARAMETER", "eventType is required")
	case ev.CreateDurationMs == nil || *ev.CreateDurationMs < 0:
		return errdefs.Invalid("SANDBOX::INVALID_PARAMETER", "createDurationMs must be a number >= 0")
	case ev.Success == nil:
		return errdefs.Invalid("SANDBOX::INVALID_PARAMETER", "success is required")
	}
	s.log.DebugContext(r.Context(), "sdk event", "type", ev.EventType, "sandbox", ev.SandboxID,
		"duration_ms", *ev.CreateDurationMs, "success", *ev.Success, "user_agent", r.UserAgent())
	w.WriteHeader(http.StatusNoContent)
	return nil
}
