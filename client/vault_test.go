package client

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
)

func TestCredentialVault(t *testing.T) {
	f, sb := agentFake(t)
	const base = "/sandboxes/{id}/proxy/18080/credential-vault"
	var bodies []string
	state := `{"revision":%d,"credentials":[{"name":"gh","sourceType":"inline","revision":1}],` +
		`"bindings":[{"name":"github","revision":1,"match":{"schemes":["https"],"ports":[443],"hosts":["api.test"],"methods":["GET"],"paths":["/*"]},"auth":{"type":"bearer"}}]}`
	f.handle(base, func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("OPENSANDBOX-EGRESS-AUTH") != egressToken {
			writeJSON(w, 401, map[string]string{"code": "CREDENTIAL_VAULT::UNAUTHORIZED", "message": "unauthorized"})
			return
		}
		b, _ := io.ReadAll(r.Body)
		bodies = append(bodies, string(b))
		switch r.Method {
		case "POST":
			w.WriteHeader(201)
			io.WriteString(w, strings.Replace(state, "%d", "1", 1))
		case "GET":
			io.WriteString(w, strings.Replace(state, "%d", "1", 1))
		case "PATCH":
			if strings.Contains(string(b), `"expectedRevision":9`) {
				writeJSON(w, 409, map[string]string{"code": "CREDENTIAL_VAULT::REVISION_CONFLICT", "message": "expectedRevision 9 does not match the current revision 1"})
				return
			}
			io.WriteString(w, strings.Replace(state, "%d", "2", 1))
		case "DELETE":
			w.WriteHeader(204)
		}
	})
	f.handle(base+"/credentials", func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, `{"revision":2,"credentials":[{"name":"gh","sourceType":"inline","revision":1}]}`)
	})
	f.handle(base+"/credentials/{name}", func(w http.ResponseWriter, r *http.Request) {
		if r.PathValue("name") != "a b" {
			writeJSON(w, 404, map[string]string{"code": "CREDENTIAL_VAULT::NOT_FOUND", "message": "credential not found"})
			return
		}
		io.WriteString(w, `{"name":"a b","sourceType":"inline","revision":3}`)
	})
	f.handle(base+"/bindings", func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, `{"revision":2,"bindings":[{"name":"github","revision":1,"match":{"hosts":["api.test"]},"auth":{"type":"apiKey","name":"X-Key"}}]}`)
	})
	f.handle(base+"/bindings/{name}", func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, `{"name":"github","revision":1,"match":{"hosts":["api.test"]},"auth":{"type":"apiKey","name":"key","in":"query"}}`)
	})
	ctx := context.Background()
	st, err := sb.CreateCredentialVault(ctx, CredentialVaultCreate{
		Credentials: []Credential{InlineCredential("gh", "v4lue")},
		Bindings:    []CredentialBinding{{Name: "github", Match: CredentialMatch{Hosts: []string{"api.test"}}, Auth: CredentialAuth{Type: "bearer", Credential: "gh"}}},
	})
	if err != nil || st.Revision != 1 || st.Bindings[0].Auth.Type != "bearer" || st.Bindings[0].Match.Ports[0] != 443 {
		t.Fatalf("create %+v %v", st, err)
	}
	var sent map[string]any
	json.Unmarshal([]byte(bodies[0]), &sent)
	if c := sent["credentials"].([]any)[0].(map[string]any); c["source"].(map[string]any)["value"] != "v4lue" {
		t.Fatalf("create body %s", bodies[0])
	}
	// Nil lists are sent as [] (the server requires both).
	if _, err := sb.CreateCredentialVault(ctx, CredentialVaultCreate{}); err != nil || bodies[1] != `{"credentials":[],"bindings":[]}` {
		t.Fatalf("empty create %q %v", bodies[1], err)
	}
	if st, err := sb.GetCredentialVault(ctx); err != nil || len(st.Credentials) != 1 {
		t.Fatalf("get %+v %v", st, err)
	}
	rev := int64(1)
	st, err = sb.PatchCredentialVault(ctx, CredentialVaultPatch{ExpectedRevision: &rev, Bindings: &BindingOps{Delete: []string{"github"}}})
	if err != nil || st.Revision != 2 || !strings.Contains(bodies[len(bodies)-1], `"bindings":{"delete":["github"]}`) {
		t.Fatalf("patch %+v %v %s", st, err, bodies[len(bodies)-1])
	}
	stale := int64(9)
	_, err = sb.PatchCredentialVault(ctx, CredentialVaultPatch{ExpectedRevision: &stale})
	if ae, ok := err.(*APIError); !ok || !IsConflict(err) || ae.Code != "CREDENTIAL_VAULT::REVISION_CONFLICT" {
		t.Fatalf("stale patch: %v", err)
	}
	if creds, rev, err := sb.ListCredentials(ctx); err != nil || rev != 2 || creds[0].Name != "gh" {
		t.Fatalf("list credentials %+v %d %v", creds, rev, err)
	}
	if c, err := sb.GetCredential(ctx, "a b"); err != nil || c.Revision != 3 {
		t.Fatalf("get credential %+v %v", c, err)
	}
	if _, err := sb.GetCredential(ctx, "nope"); !IsNotFound(err) {
		t.Fatalf("unknown credential: %v", err)
	}
	if bs, _, err := sb.ListBindings(ctx); err != nil || bs[0].Auth.Name != "X-Key" {
		t.Fatalf("list bindings %+v %v", bs, err)
	}
	if b, err := sb.GetBinding(ctx, "github"); err != nil || b.Auth.In != "query" {
		t.Fatalf("get binding %+v %v", b, err)
	}
	if err := sb.DeleteCredentialVault(ctx); err != nil {
		t.Fatalf("delete: %v", err)
	}
}
