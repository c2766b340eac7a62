package httpapi_test

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/moat-sandbox/moat/internal/httpapi"
)

// TestSDKMetricsEvent covers POST /metrics/events, which the OpenSandbox JS
// SDK 0.1.11 sends after every create; moat used to answer 404.
func TestSDKMetricsEvent(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	h := httpapi.New(httpapi.Config{APIKey: "k"}, nil, log).Handler()
	post := func(path, body, key string) (int, string) {
		req := httptest.NewRequest("POST", path, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("User-Agent", "OpenSandbox-JS-SDK/0.1.11")
		if key != "" {
			req.Header.Set("OPEN-SANDBOX-API-KEY", key)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec.Code, rec.Body.String()
	}
	ok := `{"eventType":"sandbox.create","sandboxId":"s1","image":"busybox","createDurationMs":1842,"success":true}`
	for _, p := range []string{"/metrics/events", "/v1/metrics/events"} {
		if code, body := post(p, ok, "k"); code != http.StatusNoContent || body != "" {
			t.Errorf("%s: %d %q, want 204 and no body", p, code, body)
		}
	}
	if code, _ := post("/v1/metrics/events", `{"eventType":"sandbox.create","createDurationMs":0,"success":false}`, "k"); code != http.StatusNoContent {
		t.Errorf("failed-create event without sandboxId: %d, want 204", code)
	}
	for _, tc := range []struct{ name, body string }{
		{"no body", ""},
		{"not json", "{"},
		{"no eventType", `{"createDurationMs":1,"success":true}`},
		{"negative duration", `{"eventType":"sandbox.create","createDurationMs":-1,"success":true}`},
		{"no duration", `{"eventType":"sandbox.create","success":true}`},
		{"no success", `{"eventType":"sandbox.create","createDurationMs":1}`},
	} {
		if code, body := post("/v1/metrics/events", tc.body, "k"); code != http.StatusBadRequest || !strings.Contains(body, `"code"`) {
			t.Errorf("%s: %d %s, want 400 {code, message}", tc.name, code, body)
		}
	}
	if code, _ := post("/v1/metrics/events", ok, ""); code != http.StatusUnauthorized {
		t.Errorf("without API key: %d, want 401", code)
	}
}
