package e2b_test

import (
	"encoding/json"
	"strings"
	"testing"
)

// fuzzRoutes are the E2B routes that decode a body.
var fuzzRoutes = []struct{ method, path string }{
	{"POST", "/v2/sandboxes"},
	{"POST", "/sandboxes"},
	{"POST", "/sandboxes/{id}/connect"},
	{"POST", "/v2/sandboxes/{id}/connect"},
	{"POST", "/sandboxes/{id}/timeout"},
	{"POST", "/sandboxes/{id}/refreshes"},
	{"POST", "/sandboxes/{id}/snapshots"},
	{"POST", "/sandboxes/{id}/resume"},
}

// FuzzE2BBodies feeds arbitrary bodies to every E2B route that decodes
// one: no panic, no 5xx but 501, and every refusal is E2B's {code, message}.
// Sandboxes a body creates are killed again.
func FuzzE2BBodies(f *testing.F) {
	for _, s := range []string{
		`{"templateID":"base","timeout":300,"metadata":{"a":"b"},"envVars":{"K":"V"}}`,
		`{"templateID":"base","autoPause":true,"secure":true,"allow_internet_access":false}`,
		`{"templateID":"","timeout":-1}`, `{"templateID":"base","timeout":1e400}`, `{"timeout":30}`,
		`{"duration":60}`, `{"name":"snap"}`, `{"metadata":null}`, `{"templateID":"base","network":{"allowOut":["a.test"],"denyOut":["0.0.0.0/0"]}}`,
		`[]`, `null`, `{"a":`, ``,
	} {
		for i := range fuzzRoutes {
			f.Add(uint8(i), []byte(s))
		}
	}
	h := newHarness(f)
	id := h.create(f, `{"templateID":"base","timeout":3600}`)
	f.Fuzz(func(t *testing.T, route uint8, body []byte) {
		r := fuzzRoutes[int(route)%len(fuzzRoutes)]
		path := strings.ReplaceAll(r.path, "{id}", id)
		res := h.do(t, rootKey, r.method, path, string(body), false)
		// 501 is a documented refusal (a feature this runtime lacks).
		if res.code >= 500 && res.code != 501 {
			t.Fatalf("%s %s %q: %d %s", r.method, path, body, res.code, res.raw)
		}
		if res.code >= 400 {
			var e struct {
				Code    int    `json:"code"`
				Message string `json:"message"`
			}
			if json.Unmarshal(res.raw, &e) != nil || e.Code != res.code || e.Message == "" {
				t.Fatalf("%s %s %q: %d without E2B's error body: %s", r.method, path, body, res.code, res.raw)
			}
			return
		}
		var created struct {
			SandboxID string `json:"sandboxID"`
		}
		if res.code == 201 && json.Unmarshal(res.raw, &created) == nil && created.SandboxID != "" && created.SandboxID != id {
			h.do(t, rootKey, "DELETE", "/sandboxes/"+created.SandboxID, "", false)
		}
	})
}
