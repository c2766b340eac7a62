package e2b

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/moat-sandbox/moat/internal/agentproto"
	"github.com/moat-sandbox/moat/internal/lifecycle"
	"github.com/moat-sandbox/moat/internal/web"
)

// metricJSON is E2B's SandboxMetric.
type metricJSON struct {
	Timestamp     time.Time `json:"timestamp"`
	TimestampUnix int64     `json:"timestampUnix"`
	CPUCount      int       `json:"cpuCount"`
	CPUUsedPct    float64   `json:"cpuUsedPct"`
	MemUsed       int64     `json:"memUsed"`
	MemTotal      int64     `json:"memTotal"`
	MemCache      int64     `json:"memCache"`
	DiskUsed      int64     `json:"diskUsed"`
	DiskTotal     int64     `json:"diskTotal"`
}

// sample asks sandbox id's agent for its metrics now (the agent's
// GET /metrics); ok is false when it cannot answer (paused, a runtime
// without the agent's metrics).
func (a *API) sample(ctx context.Context, sb lifecycle.Sandbox) (metricJSON, bool) {
	if sb.Status.State != lifecycle.StateRunning {
		return metricJSON{}, false
	}
	ep, err := a.svc.Endpoint(ctx, sb.ID, agentproto.Port)
	if err != nil {
		return metricJSON{}, false
	}
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+ep.Address+"/metrics", nil)
	if err != nil {
		return metricJSON{}, false
	}
	for k, v := range ep.Headers {
		req.Header.Set(k, v)
	}
	resp, err := a.http.Do(req)
	if err != nil {
		return metricJSON{}, false
	}
	defer resp.Body.Close()
	var m struct {
		CPUCount    float64 `json:"cpu_count"`
		CPUUsedPct  float64 `json:"cpu_used_pct"`
		MemTotalMiB float64 `json:"mem_total_mib"`
		MemUsedMiB  float64 `json:"mem_used_mib"`
	}
	if resp.StatusCode != http.StatusOK || json.NewDecoder(http.MaxBytesReader(nil, resp.Body, 1<<16)).Decode(&m) != nil {
		return metricJSON{}, false
	}
	now := a.now()
	return metricJSON{Timestamp: now, TimestampUnix: now.Unix(), CPUCount: int(m.CPUCount + 0.999),
		CPUUsedPct: m.CPUUsedPct, MemUsed: int64(m.MemUsedMiB * (1 << 20)), MemTotal: int64(m.MemTotalMiB * (1 << 20)),
		DiskTotal: sb.Resources.DiskBytes}, true
}

// metrics answers the sandbox's metrics: moat keeps no history, so the
// answer is the current sample (none when the agent cannot give one).
func (a *API) metrics(w http.ResponseWriter, r *http.Request) error {
	sb, err := a.visible(r, r.PathValue("id"))
	if err != nil {
		return err
	}
	out := []metricJSON{}
	if m, ok := a.sample(r.Context(), sb); ok {
		out = append(out, m)
	}
	web.WriteJSON(w, http.StatusOK, out)
	return nil
}

// metricsMany is GET /sandboxes/metrics?sandbox_ids=a,b: the current
// sample of each (unknown ids are left out).
func (a *API) metricsMany(w http.ResponseWriter, r *http.Request) error {
	ids := strings.Split(r.URL.Query().Get("sandbox_ids"), ",")
	if len(ids) > 100 {
		return invalid("at most 100 sandbox_ids")
	}
	out := map[string]metricJSON{}
	for _, id := range ids {
		if id = strings.TrimSpace(id); id == "" {
			continue
		}
		sb, err := a.visible(r, id)
		if err != nil {
			continue
		}
		if m, ok := a.sample(r.Context(), sb); ok {
			out[id] = m
		}
	}
	web.WriteJSON(w, http.StatusOK, map[string]any{"sandboxes": out})
	return nil
}

// logLines returns the lines of the sandbox's console log (its
// entrypoint's output), at most limit of them from the end.
func (a *API) logLines(r *http.Request, limit int) (lifecycle.Sandbox, []string, error) {
	sb, err := a.visible(r, r.PathValue("id"))
	if err != nil {
		return sb, nil, err
	}
	data, _, err := a.svc.Logs(r.Context(), sb.ID, 1<<20)
	if err != nil {
		return sb, nil, nil // a runtime without console logs: none
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) == 1 && lines[0] == "" {
		lines = nil
	}
	if len(lines) > limit {
		lines = lines[len(lines)-limit:]
	}
	return sb, lines, nil
}

func logLimit(r *http.Request) (int, error) {
	v := r.URL.Query().Get("limit")
	if v == "" {
		return 1000, nil
	}
	var n int
	if _, err := fmt.Sscanf(v, "%d", &n); err != nil || n < 1 || n > 10000 {
		return 0, invalid("limit must be an integer between 1 and 10000")
	}
	return n, nil
}

type logEntry struct {
	Timestamp time.Time         `json:"timestamp"`
	Level     string            `json:"level"`
	Message   string            `json:"message"`
	Fields    map[string]string `json:"fields"`
}

// logsV1 is SandboxLogs: the lines, and the same as entries. moat's
// console log has no per-line time: every line carries the start time.
func (a *API) logsV1(w http.ResponseWriter, r *http.Request) error {
	limit, err := logLimit(r)
	if err != nil {
		return err
	}
	sb, lines, err := a.logLines(r, limit)
	if err != nil {
		return err
	}
	type line struct {
		Timestamp time.Time `json:"timestamp"`
		Line      string    `json:"line"`
	}
	out := struct {
		Logs       []line     `json:"logs"`
		LogEntries []logEntry `json:"logEntries"`
	}{Logs: []line{}, LogEntries: []logEntry{}}
	for _, l := range lines {
		out.Logs = append(out.Logs, line{Timestamp: sb.CreatedAt, Line: l})
		out.LogEntries = append(out.LogEntries, logEntry{Timestamp: sb.CreatedAt, Level: "info", Message: l, Fields: map[string]string{}})
	}
	web.WriteJSON(w, http.StatusOK, out)
	return nil
}

func (a *API) logsV2(w http.ResponseWriter, r *http.Request) error {
	limit, err := logLimit(r)
	if err != nil {
		return err
	}
	sb, lines, err := a.logLines(r, limit)
	if err != nil {
		return err
	}
	out := struct {
		Logs []logEntry `json:"logs"`
	}{Logs: []logEntry{}}
	for _, l := range lines {
		out.Logs = append(out.Logs, logEntry{Timestamp: sb.CreatedAt, Level: "info", Message: l, Fields: map[string]string{}})
	}
	web.WriteJSON(w, http.StatusOK, out)
	return nil
}
