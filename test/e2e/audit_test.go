package e2e

import (
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/internal/testutil"
)

// TestAuditTrailOverOTLP: through a real `moat serve` exporting to a real
// OpenTelemetry Collector, a create, a command run through the server
// proxy, the credential it got injected and the egress it was denied are
// in the sandbox's audit trail and arrive at the collector as log records
// linked by trace id to the spans of the requests that caused them. No
// credential value or API key is in either, and the trail is readable
// after the delete.
func TestAuditTrailOverOTLP(t *testing.T) {
	col := testutil.OtelCollector(t)
	srv := newServer(t)
	ref := startRegistry(t)
	env := newVaultEnv(t, srv)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", col.Endpoint)
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "200")
	t.Setenv("OTEL_BLRP_SCHEDULE_DELAY", "200")
	t.Setenv("OTEL_METRIC_EXPORT_INTERVAL", "1000")
	srv.start(env.flags...)
	v := newVaultSandbox(t, t, srv, ref, "runc", env.probe)
	v.mustVault(201, "POST", "/credential-vault", vaultCreate)

	// Through the server proxy, so that the server sees the command.
	base := "http://" + srv.addr + "/v1/sandboxes/" + v.id + "/proxy/44772"
	runCommand(t, base, map[string]string{"OPEN-SANDBOX-API-KEY": srv.key},
		"/tmp/tlsprobe https://api.vault.test/v1/audited; /tmp/tlsprobe https://denied.elsewhere.test/x; true")

	type rec struct {
		Kind, Action, TraceID, SpanID string
		Command                       *struct{ Line string }
		Egress                        *struct {
			Host    string
			Allowed bool
		}
		Credential *struct{ Binding, Host string }
	}
	read := func() []rec {
		var page struct{ Items []rec }
		srv.mustJSON(200, "GET", "/v1/sandboxes/"+v.id+"/audit?limit=1000", nil, &page)
		return page.Items
	}
	var create, cmd, inject, deny *rec
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		create, cmd, inject, deny = nil, nil, nil, nil
		recs := read()
		for i := range recs {
			r := &recs[i]
			switch {
			case r.Kind == "lifecycle" && r.Action == "create":
				create = r
			case r.Kind == "command" && r.Command != nil && strings.Contains(r.Command.Line, "/v1/audited"):
				cmd = r
			case r.Kind == "credential" && r.Action == "inject" && r.Credential.Binding == "api-v1":
				inject = r
			case r.Kind == "egress" && r.Action == "deny" && r.Egress.Host == "denied.elsewhere.test":
				deny = r
			}
		}
		if create != nil && cmd != nil && inject != nil && deny != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("trail: create %v, command %v, injection %v, denial %v in %+v", create, cmd, inject, deny, recs)
		}
	}
	if create.TraceID == "" || cmd.TraceID == "" || inject.TraceID != cmd.TraceID || deny.TraceID != cmd.TraceID {
		t.Fatalf("trace ids: create %q, command %q, injection %q, denial %q", create.TraceID, cmd.TraceID, inject.TraceID, deny.TraceID)
	}

	// At the collector: the log records with those trace ids, and the
	// spans they name.
	want := map[string]string{"moat.audit.lifecycle": create.TraceID, "moat.audit.command": cmd.TraceID,
		"moat.audit.credential": cmd.TraceID, "moat.audit.egress": cmd.TraceID}
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(500 * time.Millisecond) {
		logs, spans := map[string]bool{}, map[string]bool{}
		for _, line := range col.Lines(t) {
			walk(line, func(m map[string]any) {
				if ev, _ := m["eventName"].(string); ev != "" {
					logs[ev+" "+str(m["traceId"])] = true
				}
				if name, _ := m["name"].(string); name != "" && m["spanId"] != nil {
					spans[str(m["traceId"])+" "+str(m["spanId"])] = true
				}
			})
		}
		missing := ""
		for ev, tr := range want {
			if !logs[ev+" "+tr] {
				missing += " log " + ev
			}
		}
		for _, r := range []*rec{create, cmd} {
			if !spans[r.TraceID+" "+r.SpanID] {
				missing += " span of " + r.Kind
			}
		}
		if missing == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the collector did not receive:%s", missing)
		}
	}
	raw, err := os.ReadFile(col.File)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range append(vaultSecrets, srv.key) {
		if strings.Contains(string(raw), s) {
			t.Fatalf("the exported telemetry holds a secret %q", s)
		}
	}

	// Kept after the delete.
	if code, _, _ := srv.do("DELETE", "/v1/sandboxes/"+v.id, nil); code != 204 {
		t.Fatalf("delete: %d", code)
	}
	if recs := read(); len(recs) == 0 || recs[len(recs)-1].Action != "delete" {
		t.Fatalf("after delete: %+v", recs)
	}
	code, body, _ := srv.do("GET", "/v1/sandboxes/"+v.id+"/audit?cursor=bogus", nil)
	var e map[string]string
	if json.Unmarshal(body, &e); code != 400 || e["code"] != "SANDBOX::INVALID_CURSOR" {
		t.Fatalf("bad cursor: %d %s", code, body)
	}
}

// walk calls fn with every object nested in v.
func walk(v any, fn func(map[string]any)) {
	switch x := v.(type) {
	case map[string]any:
		fn(x)
		for _, e := range x {
			walk(e, fn)
		}
	case []any:
		for _, e := range x {
			walk(e, fn)
		}
	}
}

func str(v any) string { s, _ := v.(string); return s }
