package httpapi

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/lifecycle"
	"github.com/moat-sandbox/moat/internal/web"
)

// The Diagnostics API (OpenSandbox specs/diagnostic-api.yml).
//
// With ?scope= the stable form answers a DiagnosticContentResponse with the
// text inline (upstream's open-source server answers 501
// DIAGNOSTICS_NOT_IMPLEMENTED there; the spec permits either, and a real
// answer is more useful). Without scope the legacy DevOps form answers
// text/plain with "Deprecation: true", as upstream does; legacy also has
// /inspect and /summary.
//
// Scopes: logs serves the console output (agent + entrypoint stdout and
// stderr) for container, process and all; events serves the sandbox's
// event ring for lifecycle, runtime and all. The other known scopes
// (network, and the ones of the other kind) answer empty content with a
// warning, and so does a scope moat does not know: upstream's spec lists
// the values it "includes", so a client may ask for a newer one. An empty
// scope is 400.

// maxDiagnosticBytes bounds an inline payload.
const maxDiagnosticBytes = 1 << 20

const textPlain = "text/plain; charset=utf-8"

// diagnosticContent is DiagnosticContentResponse (inline delivery only).
type diagnosticContent struct {
	SandboxID     string   `json:"sandboxId"`
	Kind          string   `json:"kind"`
	Scope         string   `json:"scope"`
	Delivery      string   `json:"delivery"`
	ContentType   string   `json:"contentType"`
	Content       string   `json:"content"`
	ContentLength int      `json:"contentLength"`
	Truncated     bool     `json:"truncated"`
	Warnings      []string `json:"warnings,omitempty"`
}

// scopeParam returns the scope query parameter and whether it was given.
func scopeParam(r *http.Request) (string, bool, error) {
	q := r.URL.Query()
	if _, ok := q["scope"]; !ok {
		return "", false, nil
	}
	sc := strings.ToLower(strings.TrimSpace(q.Get("scope")))
	if sc == "" {
		return "", true, errdefs.Invalid("SANDBOX::INVALID_PARAMETER",
			"scope is empty (use container, lifecycle, runtime, network, process or all, or omit it)")
	}
	return sc, true, nil
}

func (s *Server) diagnosticLogs(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	scope, stable, err := scopeParam(r)
	if err != nil {
		return err
	}
	if !stable {
		data, truncated, err := s.svc.Logs(r.Context(), id, maxDiagnosticBytes)
		if err != nil {
			return err
		}
		text := string(data)
		if truncated {
			text = "[older output truncated]\n" + text
		}
		writeLegacy(w, text)
		return nil
	}
	out := diagnosticContent{SandboxID: id, Kind: "logs", Scope: scope, Delivery: "inline", ContentType: textPlain}
	switch scope {
	case "container", "process", "all":
		data, truncated, err := s.svc.Logs(r.Context(), id, maxDiagnosticBytes)
		if err != nil {
			return err
		}
		out.Content, out.Truncated = string(data), truncated
		if scope == "all" {
			out.Warnings = append(out.Warnings, "logs hold the sandbox console output only; lifecycle and runtime history is under diagnostics/events")
		}
	default:
		if _, err := s.svc.Get(r.Context(), id); err != nil {
			return err
		}
		out.Warnings = []string{fmt.Sprintf("this server records no %s logs; see diagnostics/events", scope)}
	}
	out.ContentLength = len(out.Content)
	web.WriteJSON(w, http.StatusOK, out)
	return nil
}

func (s *Server) diagnosticEvents(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	scope, stable, err := scopeParam(r)
	if err != nil {
		return err
	}
	evs, dropped, err := s.svc.Events(r.Context(), id)
	if err != nil {
		return err
	}
	if !stable {
		writeLegacy(w, lifecycle.FormatEvents(evs))
		return nil
	}
	out := diagnosticContent{SandboxID: id, Kind: "events", Scope: scope, Delivery: "inline", ContentType: textPlain}
	switch scope {
	case "lifecycle", "runtime":
		var sel []lifecycle.Event
		for _, e := range evs {
			if e.Scope == scope {
				sel = append(sel, e)
			}
		}
		evs = sel
	case "all":
	default:
		evs = nil
		out.Warnings = append(out.Warnings, fmt.Sprintf("this server records no %s events; lifecycle and runtime events are available", scope))
	}
	out.Content = lifecycle.FormatEvents(evs)
	if len(out.Content) > maxDiagnosticBytes {
		out.Content, out.Truncated = out.Content[len(out.Content)-maxDiagnosticBytes:], true
	}
	if dropped > 0 && (scope == "lifecycle" || scope == "runtime" || scope == "all") {
		out.Warnings = append(out.Warnings, fmt.Sprintf("%d older events were dropped (the server keeps the last %d)", dropped, lifecycle.MaxEventsPerSandbox))
	}
	out.ContentLength = len(out.Content)
	web.WriteJSON(w, http.StatusOK, out)
	return nil
}

// diagnosticInspect is the legacy plain-text dump of a sandbox record
// (no secrets: tokens and env values are left out).
func (s *Server) diagnosticInspect(w http.ResponseWriter, r *http.Request) error {
	sb, err := s.svc.Get(r.Context(), r.PathValue("id"))
	if err != nil {
		return err
	}
	var b strings.Builder
	line := func(k string, v any) { fmt.Fprintf(&b, "%-16s %v\n", k+":", v) }
	line("id", sb.ID)
	if sb.Image != "" {
		line("image", sb.Image)
	}
	if sb.SnapshotID != "" {
		line("snapshotId", sb.SnapshotID)
	}
	line("state", sb.Status.State)
	line("reason", sb.Status.Reason)
	if sb.Status.Message != "" {
		line("message", sb.Status.Message)
	}
	line("lastTransition", sb.Status.LastTransitionAt.Format(time.RFC3339))
	line("createdAt", sb.CreatedAt.Format(time.RFC3339))
	if sb.ExpiresAt != nil {
		line("expiresAt", sb.ExpiresAt.Format(time.RFC3339))
	} else {
		line("expiresAt", "never (manual cleanup)")
	}
	line("runtime", s.svc.Deps().Runtime.Name()+"/"+sb.Class)
	line("entrypoint", strings.Join(sb.Entrypoint, " "))
	env := make([]string, 0, len(sb.Env))
	for k := range sb.Env {
		env = append(env, k)
	}
	line("env", strings.Join(slices.Sorted(slices.Values(env)), ","))
	line("resources", fmt.Sprintf("cpu=%dm memory=%d pids=%d disk=%d", sb.Resources.CPUMillis, sb.Resources.MemoryBytes, sb.Resources.PidsLimit, sb.Resources.DiskBytes))
	line("metadata", fmtMap(sb.Metadata))
	if sb.Pool != "" {
		line("pool", sb.Pool)
	}
	line("networkPolicy", sb.NetworkPolicy != nil)
	line("secureAccess", sb.AccessToken != "")
	writeLegacy(w, b.String())
	return nil
}

// diagnosticSummary is the legacy plain-text overview: status, the last
// events and the end of the console log.
func (s *Server) diagnosticSummary(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	sb, err := s.svc.Get(r.Context(), id)
	if err != nil {
		return err
	}
	evs, _, err := s.svc.Events(r.Context(), id)
	if err != nil {
		return err
	}
	if len(evs) > 10 {
		evs = evs[len(evs)-10:]
	}
	var b strings.Builder
	fmt.Fprintf(&b, "sandbox %s: %s (%s)", sb.ID, sb.Status.State, sb.Status.Reason)
	if sb.Status.Message != "" {
		fmt.Fprintf(&b, ": %s", sb.Status.Message)
	}
	b.WriteString("\n\n== recent events ==\n")
	b.WriteString(lifecycle.FormatEvents(evs))
	b.WriteString("\n== console log (tail) ==\n")
	data, _, err := s.svc.Logs(r.Context(), id, 4<<10)
	switch {
	case errdefs.IsNotFound(err):
		return err
	case err != nil:
		b.WriteString("(unavailable)\n")
	default:
		b.Write(data)
	}
	writeLegacy(w, b.String())
	return nil
}

// writeLegacy answers the legacy plain-text form.
func writeLegacy(w http.ResponseWriter, text string) {
	w.Header().Set("Content-Type", textPlain)
	w.Header().Set("Deprecation", "true")
	w.WriteHeader(http.StatusOK)
	w.Write([]byte(text))
}

func fmtMap(m map[string]string) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, k+"="+m[k])
	}
	return strings.Join(parts, ",")
}
