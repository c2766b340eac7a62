package httpapi_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/internal/gen/lifecycleapi"
	"github.com/moat-sandbox/moat/internal/gen/wirecheck"
	"github.com/moat-sandbox/moat/internal/sandbox"
)

const limited = `{"image":{"uri":"busybox"},"entrypoint":["sh"],"resourceLimits":{"cpu":"%s","memory":"%s"}}`

func TestQuotaExhaustion(t *testing.T) {
	ta := newTenantAPI(t, sandbox.Config{}, sandbox.Deps{})
	code, body := ta.do(t, "root", "PUT", "/v1/tenants/acme", `{"quota":{"sandboxes":2,"cpu":"2","memory":"1Gi"}}`)
	if code != 200 || fmt.Sprint(body["quota"]) != "map[cpu:2 memory:1Gi sandboxes:2]" {
		t.Fatalf("set quota: %d %v", code, body)
	}
	// Under a CPU and memory quota, limits are required.
	if code, body := ta.do(t, "acme-operator", "POST", "/v1/sandboxes", createBody); code != 400 || !strings.Contains(fmt.Sprint(body["message"]), "resourceLimits.cpu is required") {
		t.Errorf("create without limits: %d %v", code, body)
	}
	var ids []string
	for i := 0; i < 2; i++ {
		code, body := ta.do(t, "acme-operator", "POST", "/v1/sandboxes", fmt.Sprintf(limited, "1", "512Mi"))
		if code != 202 {
			t.Fatalf("create %d: %d %v", i, code, body)
		}
		ids = append(ids, body["id"].(string))
	}
	code, body = ta.do(t, "acme-operator", "POST", "/v1/sandboxes", fmt.Sprintf(limited, "100m", "8Mi"))
	if code != 403 || body["code"] != "TENANT::QUOTA_EXCEEDED" || !strings.Contains(body["message"].(string), "sandboxes 2 in use + 1 requested > quota 2") {
		t.Errorf("third create: %d %v", code, body)
	}
	if r := ta.audit.Last(); r.Status != 403 || r.Tenant != "acme" {
		t.Errorf("audit of the refused create: %+v", r)
	}
	// Every tenant's own quota: beta is not limited by acme's.
	if code, _ := ta.do(t, "beta-operator", "POST", "/v1/sandboxes", createBody); code != 202 {
		t.Errorf("beta create: %d", code)
	}
	code, body = ta.do(t, "acme-viewer", "GET", "/v1/tenants/acme", "")
	if code != 200 || fmt.Sprint(body["usage"]) != "map[cpu:2 memory:1Gi sandboxes:2]" {
		t.Errorf("usage: %d %v", code, body)
	}
	// A delete frees the room; CPU and memory are checked as sums.
	if code, _ := ta.do(t, "acme-operator", "DELETE", "/v1/sandboxes/"+ids[0], ""); code != 204 {
		t.Fatalf("delete: %d", code)
	}
	code, body = ta.do(t, "acme-operator", "POST", "/v1/sandboxes", fmt.Sprintf(limited, "1500m", "256Mi"))
	if code != 403 || !strings.Contains(body["message"].(string), "cpu 1000m in use + 1500m requested > quota 2000m") {
		t.Errorf("cpu over quota: %d %v", code, body)
	}
	code, body = ta.do(t, "acme-operator", "POST", "/v1/sandboxes", fmt.Sprintf(limited, "1", "768Mi"))
	if code != 403 || !strings.Contains(body["message"].(string), "memory 512Mi in use + 768Mi requested > quota 1024Mi") {
		t.Errorf("memory over quota: %d %v", code, body)
	}
	if code, body := ta.do(t, "acme-operator", "POST", "/v1/sandboxes", fmt.Sprintf(limited, "1", "512Mi")); code != 202 {
		t.Errorf("create after delete: %d %v", code, body)
	}
	// Batches are all or nothing against the quota.
	if code, body := ta.do(t, "root", "PUT", "/v1/tenants/acme", `{"quota":{"sandboxes":4}}`); code != 200 {
		t.Fatalf("raise quota: %d %v", code, body)
	}
	code, body = ta.do(t, "acme-operator", "POST", "/v1/sandboxes/batch", `{"count":3,"image":{"uri":"busybox"},"entrypoint":["sh"]}`)
	if code != 403 || body["code"] != "TENANT::QUOTA_EXCEEDED" {
		t.Errorf("batch over quota: %d %v", code, body)
	}
	if _, list := ta.do(t, "acme-viewer", "GET", "/v1/sandboxes", ""); list["pagination"].(map[string]any)["totalItems"].(float64) != 2 {
		t.Errorf("a refused batch left sandboxes: %v", list)
	}
	if code, body := ta.do(t, "acme-operator", "POST", "/v1/sandboxes/batch", `{"count":2,"image":{"uri":"busybox"},"entrypoint":["sh"]}`); code != 202 {
		t.Errorf("batch within quota: %d %v", code, body)
	}
	// Failed and terminated sandboxes do not count; the quota can be
	// lifted.
	if code, _ := ta.do(t, "root", "PUT", "/v1/tenants/acme", `{}`); code != 200 {
		t.Fatal("clear quota")
	}
	if code, _ := ta.do(t, "acme-operator", "POST", "/v1/sandboxes", createBody); code != 202 {
		t.Errorf("create without quota: %d", code)
	}
}

// TestQuotaPoolClaims: idle pool sandboxes are not charged, claims are
// (single and batch), and a refused claim takes nothing from the pool.
func TestQuotaPoolClaims(t *testing.T) {
	ta := newTenantAPI(t, sandbox.Config{}, sandbox.Deps{})
	if code, body := ta.do(t, "acme-operator", "POST", "/v1/pools",
		`{"name":"warm","template":{"image":{"uri":"busybox"},"entrypoint":["sh"]},"capacitySpec":{"bufferMin":3,"bufferMax":3,"poolMin":0,"poolMax":10}}`); code != 201 {
		t.Fatalf("pool: %d %v", code, body)
	}
	waitAvailable(t, ta, "warm", 3)
	if code, _ := ta.do(t, "root", "PUT", "/v1/tenants/acme", `{"quota":{"sandboxes":2}}`); code != 200 {
		t.Fatal("quota")
	}
	// A pool's idle buffer may not exceed the quota on its own.
	code, body := ta.do(t, "acme-operator", "POST", "/v1/pools",
		`{"name":"big","template":{"image":{"uri":"busybox"},"entrypoint":["sh"]},"capacitySpec":{"bufferMin":1,"bufferMax":3,"poolMin":0,"poolMax":10}}`)
	if code != 403 || body["code"] != "TENANT::QUOTA_EXCEEDED" || !strings.Contains(fmt.Sprint(body["message"]), "pool big may keep 3 idle sandboxes") {
		t.Errorf("pool beyond the quota: %d %v", code, body)
	}
	code, body = ta.do(t, "acme-operator", "POST", "/v1/sandboxes/batch", `{"count":3,"extensions":{"poolRef":"warm"}}`)
	if code != 403 || body["code"] != "TENANT::QUOTA_EXCEEDED" {
		t.Errorf("claim of 3 over a quota of 2: %d %v", code, body)
	}
	waitAvailable(t, ta, "warm", 3)
	if code, body := ta.do(t, "acme-operator", "POST", "/v1/sandboxes/batch", `{"count":2,"extensions":{"poolRef":"warm"}}`); code != 202 {
		t.Fatalf("claim of 2: %d %v", code, body)
	}
	code, body = ta.do(t, "acme-operator", "POST", "/v1/sandboxes", `{"extensions":{"poolRef":"warm"},"entrypoint":["sh"]}`)
	if code != 403 || body["code"] != "TENANT::QUOTA_EXCEEDED" {
		t.Errorf("third claim: %d %v", code, body)
	}
}

func waitAvailable(t *testing.T, ta *tenantAPI, pool string, n float64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, body := ta.do(t, "acme-viewer", "GET", "/v1/pools/"+pool, "")
		st, _ := body["status"].(map[string]any)
		if st != nil && st["available"] == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("pool %s never had %v idle sandboxes: %v", pool, n, body)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestQuotaConcurrentCreates: concurrent creates cannot together overrun
// a quota (the charge is taken before provisioning, under one lock).
func TestQuotaConcurrentCreates(t *testing.T) {
	ta := newTenantAPI(t, sandbox.Config{}, sandbox.Deps{})
	if code, _ := ta.do(t, "root", "PUT", "/v1/tenants/acme", `{"quota":{"sandboxes":3}}`); code != 200 {
		t.Fatal("quota")
	}
	var mu sync.Mutex
	codes := map[int]int{}
	var wg sync.WaitGroup
	for i := 0; i < 12; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			code, _ := ta.do(t, "acme-operator", "POST", "/v1/sandboxes", createBody)
			mu.Lock()
			codes[code]++
			mu.Unlock()
		}()
	}
	wg.Wait()
	if codes[202] != 3 || codes[403] != 9 {
		t.Errorf("12 concurrent creates under a quota of 3: %v", codes)
	}
}

func TestAdminAPI(t *testing.T) {
	ta := newTenantAPI(t, sandbox.Config{}, sandbox.Deps{})
	code, raw := rawBody(t, ta.srv, "POST", "/v1/keys", `{"tenant":"gamma","role":"operator","name":"ci runner"}`)
	if code != 201 {
		t.Fatalf("create key: %d %s", code, raw)
	}
	wirecheck.Response[lifecycleapi.CreatedKey](t, "POST /v1/keys", raw)
	var ck lifecycleapi.CreatedKey
	if err := json.Unmarshal(raw, &ck); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(ck.Key, "moat_"+ck.ID+"_") || ck.Tenant != "gamma" || ck.Role != "operator" || !ck.Active || ck.CreatedBy == nil || *ck.CreatedBy != "root" {
		t.Errorf("created key: %+v", ck)
	}
	ta.keys["gamma"] = ck.Key
	// The new key works at once, in its tenant.
	code, raw = rawBody(t, ta.srv, "GET", "/v1/whoami", "")
	wirecheck.Response[lifecycleapi.Principal](t, "GET /v1/whoami", raw)
	if code != 200 || !strings.Contains(string(raw), `"keyId":"root"`) {
		t.Errorf("whoami (root): %d %s", code, raw)
	}
	if code, body := ta.do(t, "gamma", "GET", "/v1/whoami", ""); code != 200 || body["tenant"] != "gamma" || body["role"] != "operator" || body["allTenants"] != false {
		t.Errorf("whoami (gamma): %d %v", code, body)
	}
	// Listing never shows a key or a digest.
	code, raw = rawBody(t, ta.srv, "GET", "/v1/keys", "")
	wirecheck.Response[lifecycleapi.ListKeysResponse](t, "GET /v1/keys", raw)
	if code != 200 || strings.Contains(string(raw), ck.Key[len(ck.Key)-64:]) || strings.Contains(string(raw), "digest") || !strings.Contains(string(raw), `"id":"root"`) {
		t.Errorf("list keys: %d %s", code, raw)
	}
	if code, body := ta.do(t, "root", "GET", "/v1/keys?tenant=gamma", ""); code != 200 || len(body["items"].([]any)) != 1 {
		t.Errorf("list gamma keys: %d %v", code, body)
	}
	code, raw = rawBody(t, ta.srv, "GET", "/v1/keys/"+ck.ID, "")
	wirecheck.Response[lifecycleapi.APIKey](t, "GET /v1/keys/{id}", raw)
	if code != 200 {
		t.Errorf("get key: %d %s", code, raw)
	}
	// Tenants with quota and usage.
	code, raw = rawBody(t, ta.srv, "PUT", "/v1/tenants/delta", `{"quota":{"sandboxes":5,"memory":"2Gi"}}`)
	wirecheck.Response[lifecycleapi.Tenant](t, "PUT /v1/tenants/{name}", raw)
	if code != 201 {
		t.Errorf("create tenant: %d %s", code, raw)
	}
	code, raw = rawBody(t, ta.srv, "GET", "/v1/tenants", "")
	if code != 200 {
		t.Errorf("list tenants: %d %s", code, raw)
	}
	wirecheck.Response[lifecycleapi.ListTenantsResponse](t, "GET /v1/tenants", raw)
	for _, want := range []string{`"name":"default"`, `"name":"acme"`, `"name":"delta"`, `"name":"gamma"`} {
		if !strings.Contains(string(raw), want) {
			t.Errorf("tenants lack %s: %s", want, raw)
		}
	}
	// Bad input: clear {code, message}, nothing created.
	for i, tc := range []struct{ method, path, body, code string }{
		{"POST", "/v1/keys", `{"tenant":"gamma","role":"superuser"}`, "KEY::INVALID_ROLE"},
		{"POST", "/v1/keys", `{"role":"viewer"}`, "KEY::INVALID_TENANT"},
		{"POST", "/v1/keys", `{"tenant":"Not A Label","role":"viewer"}`, "TENANT::INVALID_NAME"},
		{"POST", "/v1/keys", `{"tenant":"gamma","role":"viewer","expiresAt":"2001-01-01T00:00:00Z"}`, "KEY::INVALID_EXPIRATION"},
		{"POST", "/v1/keys", `{"tenant":"gamma","role":"viewer","expiresAt":"tomorrow"}`, "SANDBOX::INVALID_PARAMETER"},
		{"POST", "/v1/keys", `[1,2]`, "SANDBOX::INVALID_PARAMETER"},
		{"PUT", "/v1/tenants/delta", `{"quota":{"sandboxes":-1}}`, "TENANT::INVALID_QUOTA"},
		{"PUT", "/v1/tenants/delta", `{"quota":{"cpu":"lots"}}`, "TENANT::INVALID_QUOTA"},
		{"PUT", "/v1/tenants/delta", `{"quota":{"memory":"-1Gi"}}`, "TENANT::INVALID_QUOTA"},
		{"PUT", "/v1/tenants/UPPER", `{}`, "TENANT::INVALID_NAME"},
		{"GET", "/v1/keys?tenant=a/b", ``, "TENANT::INVALID_NAME"},
	} {
		code, body := ta.do(t, "root", tc.method, tc.path, tc.body)
		if code != 400 || body["code"] != tc.code || body["message"] == "" {
			t.Errorf("%d: %s %s %s: %d %v, want 400 %s", i, tc.method, tc.path, tc.body, code, body, tc.code)
		}
	}
	if code, body := ta.do(t, "root", "GET", "/v1/keys/ffffffffffffffff", ""); code != 404 || body["code"] != "KEY::NOT_FOUND" {
		t.Errorf("unknown key: %d %v", code, body)
	}
	if code, body := ta.do(t, "root", "DELETE", "/v1/keys/root", ""); code != 409 || body["code"] != "KEY::NOT_REVOCABLE" {
		t.Errorf("revoke root: %d %v", code, body)
	}
	// A tenant with an active key, or with sandboxes, is not deleted.
	if code, body := ta.do(t, "root", "DELETE", "/v1/tenants/gamma", ""); code != 409 || body["code"] != "TENANT::IN_USE" {
		t.Errorf("delete tenant with a key: %d %v", code, body)
	}
	code, body := ta.do(t, "gamma", "POST", "/v1/sandboxes", createBody)
	if code != 202 {
		t.Fatalf("gamma create: %d %v", code, body)
	}
	if code, _ := ta.do(t, "root", "DELETE", "/v1/keys/"+ck.ID, ""); code != 204 {
		t.Fatal("revoke")
	}
	if code, body := ta.do(t, "gamma", "GET", "/v1/whoami", ""); code != 401 {
		t.Errorf("revoked key: %d %v", code, body)
	}
	if code, body := ta.do(t, "root", "DELETE", "/v1/tenants/gamma", ""); code != 409 || !strings.Contains(fmt.Sprint(body["message"]), "1 sandboxes") {
		t.Errorf("delete tenant with a sandbox: %d %v", code, body)
	}
	ta.do(t, "root", "DELETE", "/v1/sandboxes/"+body["id"].(string), "")
	if code, body := ta.do(t, "root", "DELETE", "/v1/tenants/gamma", ""); code != 204 {
		t.Errorf("delete tenant: %d %v", code, body)
	}
	if code, body := ta.do(t, "root", "DELETE", "/v1/tenants/default", ""); code != 409 || body["code"] != "TENANT::NOT_DELETABLE" {
		t.Errorf("delete default: %d %v", code, body)
	}
}
