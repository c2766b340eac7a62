package vault

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/moat-sandbox/moat/internal/errdefs"
)

// secretValue is planted in requests; no error, view or log may show it.
const secretValue = "sk-live-SECRET-0123456789"

func mustCreate(t *testing.T, body string) *State {
	t.Helper()
	req, err := DecodeCreate([]byte(body))
	if err != nil {
		t.Fatalf("decode: %v", err)
	}
	s, err := New(req, nil)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return s
}

const fullCreate = `{
  "credentials": [
    {"name": "gh", "source": {"type": "inline", "value": "` + secretValue + `"}},
    {"name": "user", "source": {"value": "dXNlcjpwYXNz"}},
    {"name": "key", "source": {"type": "inline", "value": "k e y&="}},
    {"name": "org", "source": {"type": "inline", "value": "org-1"}}
  ],
  "bindings": [
    {"name": "github", "match": {"hosts": ["api.github.test"]}, "auth": {"type": "bearer", "credential": "gh"}},
    {"name": "registry", "match": {"hosts": ["*.registry.test"], "schemes": ["https", "http"], "methods": ["get"], "paths": ["/v2/*"]},
     "auth": {"type": "basic", "credential": "user"}},
    {"name": "maps", "match": {"hosts": ["maps.test"]}, "auth": {"type": "apiKey", "name": "key", "in": "query", "credential": "key"}},
    {"name": "llm", "match": {"hosts": ["llm.test"]}, "auth": {"type": "apiKey", "name": "x-api-key", "credential": "key"}},
    {"name": "multi", "match": {"hosts": ["multi.test"], "paths": ["/a/*/c", "/exact"]},
     "auth": {"type": "customHeaders", "headers": [{"name": "X-Org", "credential": "org"}, {"name": "x-token", "credential": "gh"}]}}
  ]
}`

func TestCreateViewIsSanitized(t *testing.T) {
	s := mustCreate(t, fullCreate)
	v := s.View()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	for _, leak := range []string{secretValue, "dXNlcjpwYXNz", "org-1", "k e y", `"credential"`} {
		if bytes.Contains(b, []byte(leak)) {
			t.Errorf("view leaks %q: %s", leak, b)
		}
	}
	if v.Revision != 1 || len(v.Credentials) != 4 || len(v.Bindings) != 5 {
		t.Fatalf("view %s", b)
	}
	gh, err := s.Binding("github")
	if err != nil {
		t.Fatal(err)
	}
	// Defaults are filled in, as upstream shows them.
	want := Match{Schemes: []string{"https"}, Ports: []int{443}, Hosts: []string{"api.github.test"},
		Methods: []string{"GET", "POST", "PUT", "PATCH", "DELETE"}, Paths: []string{"/*"}}
	if fmt.Sprint(gh.Match) != fmt.Sprint(want) || gh.Auth.Type != "bearer" || gh.Auth.Name != "" {
		t.Fatalf("github binding %+v", gh)
	}
	reg, _ := s.Binding("registry")
	if fmt.Sprint(reg.Match.Ports) != "[80 443]" || fmt.Sprint(reg.Match.Methods) != "[GET]" {
		t.Fatalf("registry binding %+v", reg)
	}
	maps, _ := s.Binding("maps")
	if maps.Auth != (AuthMeta{Type: "apiKey", Name: "key", In: "query"}) {
		t.Fatalf("maps auth %+v", maps.Auth)
	}
	llm, _ := s.Binding("llm")
	if llm.Auth != (AuthMeta{Type: "apiKey", Name: "X-Api-Key"}) {
		t.Fatalf("llm auth %+v", llm.Auth)
	}
	c, err := s.Credential("user")
	if err != nil || c != (CredentialMeta{Name: "user", SourceType: "inline", Revision: 1}) {
		t.Fatalf("credential user: %+v %v", c, err)
	}
	if _, err := s.Credential("nope"); !errdefs.IsNotFound(err) {
		t.Fatalf("unknown credential: %v", err)
	}
	if _, err := s.Binding("nope"); !errdefs.IsNotFound(err) {
		t.Fatalf("unknown binding: %v", err)
	}
}

func TestBadInputIsRefusedWithoutLeaking(t *testing.T) {
	cred := `{"name":"c","source":{"type":"inline","value":"` + secretValue + `"}}`
	binding := func(match, auth string) string {
		return `{"credentials":[` + cred + `],"bindings":[{"name":"b","match":` + match + `,"auth":` + auth + `}]}`
	}
	bearer := `{"type":"bearer","credential":"c"}`
	hosts := `{"hosts":["api.test"]}`
	big := strings.Repeat("x", MaxValueBytes+1)
	many := func(n int, f func(i int) string) string {
		parts := make([]string, n)
		for i := range parts {
			parts[i] = f(i)
		}
		return strings.Join(parts, ",")
	}
	for i, tc := range []struct {
		body, want string
	}{
		{`{"credentials":[],"bindings":[]`, "end of input"},
		{`{"credentials":[],"bindings":[]]`, "syntax error at byte"},
		{`{"credentials":[],"bindings":[],"extra":1}`, "unknown field"},
		{`{"credentials":[]}`, "required"},
		{`{"bindings":null}`, "required"},
		{`{"credentials":[{"name":"c","source":{"value":12}}],"bindings":[]}`, "JSON string"},
		{`{"credentials":[{"name":"c","source":{"type":"vault","value":"` + secretValue + `"}}],"bindings":[]}`, "source type"},
		{`{"credentials":[{"name":"c","source":{"value":""}}],"bindings":[]}`, "empty"},
		{`{"credentials":[{"name":"c","source":{"value":"` + big + `"}}],"bindings":[]}`, "larger than"},
		{`{"credentials":[{"name":"c","source":{"value":"` + secretValue + `\r\nX-Evil: 1"}}],"bindings":[]}`, "control character"},
		{`{"credentials":[{"name":"a/b","source":{"value":"v"}}],"bindings":[]}`, "name"},
		{`{"credentials":[` + cred + `,` + cred + `],"bindings":[]}`, "twice"},
		{`{"credentials":[` + many(MaxCredentials+1, func(i int) string { return fmt.Sprintf(`{"name":"c%d","source":{"value":"v"}}`, i) }) + `],"bindings":[]}`, "at most"},
		{binding(hosts, `{"type":"oauth2","credential":"c"}`), "unsupported auth type"},
		{binding(hosts, `{"type":"passthrough","credential":"c"}`), "only substitutions"},
		{binding(hosts, `{"type":"passthrough","substitutions":[{"placeholder":"P","in":["body"]}]}`), "needs a credential name"},
		{binding(hosts, `{"type":"passthrough","substitutions":[{"credential":"c","in":["body"]}]}`), "needs a placeholder"},
		{binding(hosts, `{"type":"passthrough","substitutions":[{"credential":"c","placeholder":"a b","in":["body"]}]}`), "without spaces"},
		{binding(hosts, `{"type":"passthrough","substitutions":[{"credential":"c","placeholder":"P"}]}`), "needs \"in\""},
		{binding(hosts, `{"type":"passthrough","substitutions":[{"credential":"c","placeholder":"P","in":["cookie"]}]}`), "unsupported surface"},
		{binding(hosts, `{"type":"passthrough","substitutions":[{"credential":"c","placeholder":"P","in":["body"]},{"credential":"c","placeholder":"P","in":["path"]}]}`), "appears twice"},
		{binding(hosts, `{"type":"passthrough","substitutions":[{"credential":"missing","placeholder":"P","in":["body"]}]}`), "does not exist"},
		{binding(hosts, `{"type":"bearer","credential":"c","substitutions":[{"credential":"c","placeholder":"`+strings.Repeat("p", MaxPlaceholderBytes+1)+`","in":["body"]}]}`), "longer than"},
		{binding(hosts, `{"type":"passthrough","substitutions":[`+many(MaxSubstitutions+1, func(i int) string { return fmt.Sprintf(`{"credential":"c","placeholder":"P%d","in":["body"]}`, i) })+`]}`), "at most"},
		{binding(hosts, `{"credential":"c"}`), "auth.type is required"},
		{binding(hosts, `{"type":"bearer","credential":"missing"}`), "does not exist"},
		{binding(hosts, `{"type":"bearer"}`), "needs a credential"},
		{binding(hosts, `{"type":"apiKey","name":"bad header","credential":"c"}`), "invalid header name"},
		{binding(hosts, `{"type":"apiKey","name":"Host","credential":"c"}`), "reserved"},
		{binding(hosts, `{"type":"apiKey","name":"k","in":"cookie","credential":"c"}`), "in must be"},
		{binding(hosts, `{"type":"apiKey","name":"a&b","in":"query","credential":"c"}`), "query parameter name"},
		{binding(hosts, `{"type":"customHeaders","headers":[]}`), "1 to"},
		{binding(hosts, `{"type":"customHeaders","headers":[{"name":"X-A","credential":"c"},{"name":"x-a","credential":"c"}]}`), "twice"},
		{binding(`{"hosts":[]}`, bearer), "hosts must not be empty"},
		{binding(`{"hosts":["https://api.test/v1"]}`, bearer), "not a valid host pattern"},
		{binding(`{"hosts":["api.*.test"]}`, bearer), "not a valid host pattern"},
		{binding(`{"hosts":["10.0.0.1"]}`, bearer), "not IP addresses"},
		{binding(`{"hosts":["*"]}`, bearer), "not a valid host pattern"},
		{binding(`{"hosts":["api.test"],"schemes":["ftp"]}`, bearer), "unsupported scheme"},
		{binding(`{"hosts":["api.test"],"ports":[8443]}`, bearer), "not an intercepted port"},
		{binding(`{"hosts":["api.test"],"paths":["v1/*"]}`, bearer), "must start with /"},
		{binding(`{"hosts":["api.test"],"paths":["/v1?x"]}`, bearer), "may not contain"},
		{binding(`{"hosts":["api.test"],"methods":["GE T"]}`, bearer), "invalid method"},
		{binding(`{"hosts":["api.test"],"trustedCidrs":["10.0.0.1"]}`, bearer), "not a CIDR prefix"},
		{binding(`{"hosts":["api.test"],"trustedCidrs":["0.0.0.0/0"]}`, bearer), "trusts every address"},
		{binding(`{"hosts":["api.test"],"trustedCidrs":["::/0"]}`, bearer), "trusts every address"},
		{`{"credentials":[` + cred + `],"bindings":[{"name":"a","match":{"hosts":["api.test"]},"auth":` + bearer + `},{"name":"b","match":{"hosts":["api.test"],"paths":["/v1/*"]},"auth":` + bearer + `}]}`, "can match the same request"},
		{`{"credentials":[` + cred + `],"bindings":[{"name":"a","match":{"hosts":["*.a.test"]},"auth":` + bearer + `},{"name":"b","match":{"hosts":["*.x.a.test"]},"auth":` + bearer + `}]}`, "can match the same request"},
	} {
		var err error
		req, derr := DecodeCreate([]byte(tc.body))
		if derr != nil {
			err = derr
		} else {
			_, err = New(req, nil)
		}
		if err == nil {
			t.Errorf("%d: accepted %s", i, tc.body)
			continue
		}
		p, ok := errdefs.PublicOf(err)
		if !errdefs.IsInvalidArgument(err) || !ok || p.Code != CodeInvalid {
			t.Errorf("%d: error %v is not a public invalid-argument error", i, err)
			continue
		}
		if !strings.Contains(p.Message, tc.want) {
			t.Errorf("%d: message %q does not mention %q", i, p.Message, tc.want)
		}
		if strings.Contains(err.Error(), "SECRET") || strings.Contains(p.Message, "SECRET") {
			t.Errorf("%d: error leaks the credential value: %q", i, p.Message)
		}
	}
}

func TestBindingHostsMustBeAllowedByPolicy(t *testing.T) {
	req, err := DecodeCreate([]byte(fullCreate))
	if err != nil {
		t.Fatal(err)
	}
	allowed := func(h string) bool { return h != "llm.test" }
	_, err = New(req, allowed)
	if p, ok := errdefs.PublicOf(err); !ok || !strings.Contains(p.Message, `host "llm.test" is not allowed`) {
		t.Fatalf("uncovered host: %v", err)
	}
	if _, err := New(req, func(string) bool { return true }); err != nil {
		t.Fatal(err)
	}
}

func TestPatchRevisionsAndOperations(t *testing.T) {
	s := mustCreate(t, fullCreate)
	patch := func(s *State, body string) (*State, error) {
		t.Helper()
		req, err := DecodePatch([]byte(body))
		if err != nil {
			return nil, err
		}
		return s.Apply(req, nil)
	}
	// A stale revision is a conflict and changes nothing.
	if _, err := patch(s, `{"expectedRevision":7,"bindings":{"delete":["llm"]}}`); !errdefs.IsConflict(err) {
		t.Fatalf("stale revision: %v", err)
	} else if p, _ := errdefs.PublicOf(err); p.Code != CodeConflict {
		t.Fatalf("stale revision code %+v", p)
	}
	s2, err := patch(s, `{"expectedRevision":1,
	  "credentials":{"replace":[{"name":"org","source":{"type":"inline","value":"org-2"}}],"add":[{"name":"new","source":{"value":"n"}}]},
	  "bindings":{"delete":["llm"],"replace":[{"name":"maps","match":{"hosts":["maps.test"]},"auth":{"type":"bearer","credential":"new"}}],
	              "add":[{"name":"llm2","match":{"hosts":["llm2.test"]},"auth":{"type":"apiKey","name":"X-Key","credential":"key"}}]}}`)
	if err != nil {
		t.Fatal(err)
	}
	if s.Revision != 1 || len(s.Bindings) != 5 || s.Credentials["org"].Value.Reveal() != "org-1" {
		t.Fatal("Apply changed the original state")
	}
	if s2.Revision != 2 {
		t.Fatalf("revision %d", s2.Revision)
	}
	if c, _ := s2.Credential("org"); c.Revision != 2 {
		t.Fatalf("replaced credential revision %d", c.Revision)
	}
	if c, _ := s2.Credential("gh"); c.Revision != 1 {
		t.Fatalf("untouched credential revision %d", c.Revision)
	}
	if _, err := s2.Binding("llm"); !errdefs.IsNotFound(err) {
		t.Fatal("deleted binding still there")
	}
	if b, _ := s2.Binding("maps"); b.Revision != 2 || b.Auth.Type != "bearer" {
		t.Fatalf("replaced binding %+v", b)
	}
	if b, _ := s2.Binding("github"); b.Revision != 1 {
		t.Fatalf("untouched binding %+v", b)
	}
	// An empty patch still makes a revision (as upstream).
	s3, err := patch(s2, `{}`)
	if err != nil || s3.Revision != 3 {
		t.Fatalf("empty patch: %v", err)
	}
	for i, tc := range []struct{ body, want string }{
		{`{"credentials":{"delete":["gh"]}}`, "does not exist"}, // still used by bindings
		{`{"credentials":{"delete":["nope"]}}`, "does not exist"},
		{`{"credentials":{"replace":[{"name":"nope","source":{"value":"v"}}]}}`, "does not exist"},
		{`{"credentials":{"add":[{"name":"gh","source":{"value":"v"}}]}}`, "already exists"},
		{`{"credentials":{"delete":["org"],"add":[{"name":"org","source":{"value":"v"}}]}}`, "more than one operation"},
		{`{"bindings":{"delete":["nope"]}}`, "does not exist"},
		{`{"bindings":{"add":[{"name":"github","match":{"hosts":["x.test"]},"auth":{"type":"bearer","credential":"gh"}}]}}`, "already exists"},
		{`{"bindings":{"add":[{"name":"dup","match":{"hosts":["api.github.test"]},"auth":{"type":"bearer","credential":"gh"}}]}}`, "same request"},
		{`{"bindings":{"add":[{"name":"x","match":{"hosts":["x.test"]},"auth":{"type":"digest","credential":"gh"}}]}}`, "unsupported auth type"},
		{`{"expectedRevision":"2"}`, "expected int64"},
	} {
		_, err := patch(s2, tc.body)
		p, ok := errdefs.PublicOf(err)
		if !errdefs.IsInvalidArgument(err) || !ok || !strings.Contains(p.Message, tc.want) {
			t.Errorf("%d: %s: got %v, want invalid %q", i, tc.body, err, tc.want)
		}
	}
}

func TestRulesMatchAndInject(t *testing.T) {
	r := mustCreate(t, fullCreate).Compile()
	for i, tc := range []struct {
		scheme, host string
		port         int
		method, path string
		binding      string // "" = none
	}{
		{"https", "api.github.test", 443, "GET", "/repos", "github"},
		{"https", "API.GitHub.Test.", 443, "POST", "/", "github"},
		{"http", "api.github.test", 80, "GET", "/", ""},    // https only
		{"https", "api.github.test", 443, "HEAD", "/", ""}, // method not listed
		{"https", "evil-api.github.test", 443, "GET", "/", ""},
		{"https", "a.registry.test", 443, "GET", "/v2/lib/manifests/1", "registry"},
		{"http", "a.b.registry.test", 80, "GET", "/v2/x", "registry"},
		{"https", "registry.test", 443, "GET", "/v2/x", ""}, // the apex is not a subdomain
		{"https", "a.registry.test", 443, "GET", "/v1/x", ""},
		{"https", "a.registry.test", 443, "GET", "/v2/../admin", ""}, // dot segments
		{"https", "a.registry.test", 443, "GET", "/v2/a%2Fb", ""},    // escaped slash
		{"https", "a.registry.test", 443, "GET", "/v2//x", ""},       // empty segment
		{"https", "multi.test", 443, "GET", "/a/b/c", "multi"},       // inner *
		{"https", "multi.test", 443, "GET", "/a/b/x/c", "multi"},     // * spans /
		{"https", "multi.test", 443, "GET", "/a/b/c/d", ""},          // must end in /c
		{"https", "multi.test", 443, "GET", "/exact", "multi"},
		{"https", "multi.test", 443, "GET", "/exact/", ""},
		{"https", "maps.test", 443, "GET", "/geo/../x", "maps"}, // "/*" matches any path
	} {
		inj := r.Match(tc.scheme, tc.host, tc.port, tc.method, tc.path)
		got := ""
		if inj != nil {
			got = inj.Binding
		}
		if got != tc.binding {
			t.Errorf("%d: %s://%s:%d %s %s matched %q, want %q", i, tc.scheme, tc.host, tc.port, tc.method, tc.path, got, tc.binding)
		}
		if tc.binding != "" && !r.Intercepts(tc.scheme, tc.host, tc.port) {
			t.Errorf("%d: Intercepts is false for a matching request", i)
		}
	}
	if r.Intercepts("https", "other.test", 443) || r.Intercepts("http", "api.github.test", 80) || r.Intercepts("https", "registry.test", 443) {
		t.Fatal("Intercepts is true for an unbound host")
	}

	apply := func(host, path string, hdr http.Header) (http.Header, *url.URL) {
		t.Helper()
		u, _ := url.Parse("https://" + host + path)
		inj := r.Match("https", host, 443, "GET", u.EscapedPath())
		if inj == nil {
			t.Fatalf("%s%s: no match", host, path)
		}
		if hdr == nil {
			hdr = http.Header{}
		}
		inj.Apply(hdr, u)
		return hdr, u
	}
	h, _ := apply("api.github.test", "/", http.Header{"Authorization": {"Bearer sandbox-made-this-up"}})
	if got := h.Values("Authorization"); len(got) != 1 || got[0] != "Bearer "+secretValue {
		t.Fatalf("bearer: %q", got)
	}
	h, _ = apply("x.registry.test", "/v2/", nil)
	if h.Get("Authorization") != "Basic dXNlcjpwYXNz" {
		t.Fatalf("basic: %q", h.Get("Authorization"))
	}
	_, u := apply("maps.test", "/geo?q=1&key=fake", nil)
	if q := u.Query(); q.Get("key") != "k e y&=" || q.Get("q") != "1" || len(q["key"]) != 1 {
		t.Fatalf("apiKey query: %q", u.RawQuery)
	}
	h, _ = apply("llm.test", "/", nil)
	if h.Get("X-Api-Key") != "k e y&=" {
		t.Fatalf("apiKey header: %v", h)
	}
	h, _ = apply("multi.test", "/exact", nil)
	if h.Get("X-Org") != "org-1" || h.Get("X-Token") != secretValue {
		t.Fatalf("customHeaders: %v", h)
	}
	sec := strings.Join(r.Secrets(), "|")
	for _, want := range []string{secretValue, "dXNlcjpwYXNz", "k e y&=", url.QueryEscape("k e y&=")} { // "org-1" is under 6 bytes
		if !strings.Contains(sec, want) {
			t.Errorf("Secrets lacks %q", want)
		}
	}
	short := mustCreate(t, `{"credentials":[{"name":"c","source":{"value":"abc"}}],"bindings":[{"name":"b","match":{"hosts":["s.test"]},"auth":{"type":"apiKey","name":"K","credential":"c"}}]}`).Compile()
	if got := short.Secrets(); len(got) != 0 {
		t.Fatalf("a 3-byte value is scrubbed: %q", got)
	}
	var nilRules *Rules
	if nilRules.Match("https", "api.github.test", 443, "GET", "/") != nil || nilRules.Intercepts("https", "a", 443) {
		t.Fatal("nil rules matched")
	}
}

func TestSecretNeverFormats(t *testing.T) {
	s := NewSecret(secretValue)
	c := Credential{Name: "c", Source: Source{Type: "inline", Value: s}}
	var logs bytes.Buffer
	slog.New(slog.NewJSONHandler(&logs, nil)).Info("x", "secret", s, "credential", c)
	js, _ := json.Marshal(c)
	for _, out := range []string{
		fmt.Sprint(s), fmt.Sprintf("%s %q %x %X %+v %#v %v", s, s, s, s, c, c, &c), logs.String(), string(js),
	} {
		if strings.Contains(out, "SECRET") || strings.Contains(out, fmt.Sprintf("%x", secretValue)) {
			t.Fatalf("secret shown: %s", out)
		}
		if !strings.Contains(out, redacted) {
			t.Fatalf("no redaction marker in %s", out)
		}
	}
}

func TestSealRoundTrip(t *testing.T) {
	key := bytes.Repeat([]byte{7}, KeySize)
	sl, err := NewSealer(key)
	if err != nil {
		t.Fatal(err)
	}
	s := mustCreate(t, fullCreate)
	blob, err := SealState(sl, "sb1", s, []byte("ca-key"))
	if err != nil {
		t.Fatal(err)
	}
	for _, plain := range []string{secretValue, "org-1", "ca-key", "github"} {
		if bytes.Contains(blob, []byte(plain)) {
			t.Fatalf("sealed blob contains %q", plain)
		}
	}
	got, extra, err := OpenState(sl, "sb1", blob)
	if err != nil {
		t.Fatal(err)
	}
	if string(extra) != "ca-key" || got.Revision != 1 || got.Credentials["gh"].Value.Reveal() != secretValue {
		t.Fatalf("round trip: %+v %q", got.View(), extra)
	}
	a, _ := json.Marshal(s.View())
	b, _ := json.Marshal(got.View())
	if !bytes.Equal(a, b) {
		t.Fatalf("views differ:\n%s\n%s", a, b)
	}
	if fmt.Sprint(s.Compile().Secrets()) != fmt.Sprint(got.Compile().Secrets()) {
		t.Fatal("compiled secrets differ after the round trip")
	}
	if _, _, err := OpenState(sl, "sb2", blob); err == nil {
		t.Fatal("a blob opened for another sandbox")
	}
	other, _ := NewSealer(bytes.Repeat([]byte{8}, KeySize))
	if _, _, err := OpenState(other, "sb1", blob); err == nil {
		t.Fatal("a blob opened with another key")
	}
	empty, err := SealState(sl, "sb1", nil, []byte("ca-key"))
	if err != nil {
		t.Fatal(err)
	}
	if st, extra, err := OpenState(sl, "sb1", empty); err != nil || st != nil || string(extra) != "ca-key" {
		t.Fatalf("no-vault round trip: %v %v %q", st, err, extra)
	}
	if _, err := NewSealer([]byte("short")); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("short key: %v", err)
	}
}

func TestLoadOrCreateKey(t *testing.T) {
	p := t.TempDir() + "/sub/vault.key"
	k1, err := LoadOrCreateKey(p)
	if err != nil || len(k1) != KeySize {
		t.Fatalf("create: %v", err)
	}
	k2, err := LoadOrCreateKey(p)
	if err != nil || !bytes.Equal(k1, k2) {
		t.Fatalf("reload: %v", err)
	}
	if _, err := ParseKey("zz"); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("bad key: %v", err)
	}
}

// null is the empty list wherever an empty list is valid (the Go SDK sends
// {"credentials":null,"bindings":null} for an empty vault, with
// null match lists and mutation sets), as upstream's server takes it.
func TestNullListsAreEmpty(t *testing.T) {
	for i, body := range []string{
		`{"credentials":null,"bindings":null}`,
		`{"credentials":[{"name":"c","source":{"type":"inline","value":"v"}}],"bindings":[{"name":"b","match":{"hosts":["api.test"],"schemes":null,"ports":null,"methods":null,"paths":null},"auth":{"type":"bearer","credential":"c"}}]}`,
	} {
		req, err := DecodeCreate([]byte(body))
		if err != nil {
			t.Fatalf("%d: %v", i, err)
		}
		if req.Credentials == nil || req.Bindings == nil {
			t.Fatalf("%d: nil lists after decode", i)
		}
		if _, err := New(req, nil); err != nil {
			t.Fatalf("%d: %v", i, err)
		}
	}
	patch, err := DecodePatch([]byte(`{"credentials":{"add":null,"replace":null,"delete":null},"bindings":{"add":null,"replace":null,"delete":null}}`))
	if err != nil {
		t.Fatal(err)
	}
	if patch.Credentials == nil || patch.Bindings == nil || patch.Credentials.Add != nil {
		t.Fatalf("patch %+v", patch)
	}
}

const substCreate = `{
  "credentials": [
    {"name": "tok", "source": {"value": "` + secretValue + `"}},
    {"name": "odd", "source": {"value": "a;b c\"d&e"}}
  ],
  "bindings": [
    {"name": "sub", "match": {"hosts": ["sub.test"], "paths": ["/v1/*"]},
     "auth": {"type": "passthrough", "substitutions": [
       {"credential": "tok", "placeholder": "{{TOKEN}}", "in": ["Header", "query", "body", "body"]},
       {"credential": "odd", "placeholder": "{{ODD}}", "in": ["path", "query", "body"]},
       {"credential": "tok", "placeholder": "{{TOKEN}}-long", "in": ["header"]}
     ]}},
    {"name": "both", "match": {"hosts": ["both.test"]},
     "auth": {"type": "bearer", "credential": "tok", "substitutions": [{"credential": "odd", "placeholder": "@ODD@", "in": ["header"]}]}}
  ]
}`

func TestSubstitutionsReplacePlaceholders(t *testing.T) {
	s := mustCreate(t, substCreate)
	b, err := json.Marshal(s.View())
	if err != nil {
		t.Fatal(err)
	}
	for _, leak := range []string{secretValue, "a;b c", "{{TOKEN}}", `"credential"`} {
		if bytes.Contains(b, []byte(leak)) {
			t.Errorf("view shows %q: %s", leak, b)
		}
	}
	if m, _ := s.Binding("sub"); m.Auth != (AuthMeta{Type: "passthrough"}) {
		t.Fatalf("passthrough meta %+v", m.Auth)
	}
	if got := s.Bindings["sub"].Auth.Substitutions[0].In; fmt.Sprint(got) != "[header query body]" {
		t.Fatalf("surfaces not normalized: %q", got)
	}
	r := s.Compile()
	match := func(host, target string) (*Injection, *url.URL) {
		t.Helper()
		u, err := url.ParseRequestURI(target)
		if err != nil {
			t.Fatal(err)
		}
		inj := r.Match("https", host, 443, "POST", u.EscapedPath())
		if inj == nil {
			t.Fatalf("%s%s: no match", host, target)
		}
		return inj, u
	}

	inj, u := match("sub.test", "/v1/{{ODD}}/x?k={{TOKEN}}&o=%7B%7BODD%7D%7D&n=1")
	h := http.Header{
		"X-Key":          {"Bearer {{TOKEN}}", "{{TOKEN}}-long|{{TOKEN}}{{TOKEN}}"},
		"Content-Length": {"{{TOKEN}}"}, // framing headers are never touched
		"X-Plain":        {"no placeholder"},
	}
	if err := inj.Apply(h, u); err != nil {
		t.Fatalf("Apply: %v", err)
	}
	// A value is escaped for the path.
	if got := u.EscapedPath(); got != "/v1/"+url.PathEscape(`a;b c"d&e`)+"/x" {
		t.Fatalf("path %q", got)
	}
	if u.Path != `/v1/a;b c"d&e/x` {
		t.Fatalf("decoded path %q", u.Path)
	}
	q := u.Query()
	if q.Get("k") != secretValue || q.Get("o") != `a;b c"d&e` || q.Get("n") != "1" {
		t.Fatalf("query %q", u.RawQuery)
	}
	if got := h.Values("X-Key"); got[0] != "Bearer "+secretValue || got[1] != secretValue+"|"+secretValue+secretValue {
		t.Fatalf("headers %q (the longest placeholder wins)", got)
	}
	if h.Get("Content-Length") != "{{TOKEN}}" || h.Get("X-Plain") != "no placeholder" || h.Get("Authorization") != "" {
		t.Fatalf("untouched headers changed: %v", h)
	}

	// Bodies: encoded for the media type; other kinds are left alone.
	if !inj.SubstitutesBody() {
		t.Fatal("SubstitutesBody is false")
	}
	for _, tc := range []struct {
		ct, ce, body, want string
		changed            bool
	}{
		{"application/json; charset=utf-8", "", `{"a":"{{ODD}}","t":"{{TOKEN}}"}`, `{"a":"a;b c\"d\u0026e","t":"` + secretValue + `"}`, true},
		{"application/vnd.api+json", "identity", `"{{ODD}}"`, `"a;b c\"d\u0026e"`, true},
		{"application/x-www-form-urlencoded", "", "o={{ODD}}&t={{TOKEN}}", "o=" + url.QueryEscape(`a;b c"d&e`) + "&t=" + secretValue, true},
		{"text/plain", "", "{{ODD}} {{TOKEN}}-long", `a;b c"d&e ` + secretValue + "-long", true},
		{"", "", "{{TOKEN}}", secretValue, true},
		{"multipart/form-data; boundary=x", "", "{{TOKEN}}", "{{TOKEN}}", false},
		{"text/plain", "gzip", "{{TOKEN}}", "{{TOKEN}}", false},
		{"text/plain", "", "\xff{{TOKEN}}", "\xff{{TOKEN}}", false},
		{"text/plain", "", "nothing here", "nothing here", false},
	} {
		got, changed := inj.SubstituteBody(tc.ct, tc.ce, []byte(tc.body))
		if string(got) != tc.want || changed != tc.changed {
			t.Errorf("body %q (%s %s) = %q %v, want %q %v", tc.body, tc.ct, tc.ce, got, changed, tc.want, tc.changed)
		}
	}

	// A value never is rescanned: a credential that contains a
	// placeholder is inserted as it is.
	if got, _ := replaceAll("<P><Q>", []replacement{{"<P>", "<Q>"}, {"<Q>", "v"}}); got != "<Q>v" {
		t.Fatalf("replaceAll rescanned its output: %q", got)
	}

	// A substitution that makes the path ambiguous refuses the request.
	// "/" is escaped too, and an escaped slash is as ambiguous as a dot segment.
	for _, v := range []string{"..", "a/b", `a\\b`} {
		amb := mustCreate(t, `{"credentials":[{"name":"d","source":{"value":"`+v+`"}}],"bindings":[{"name":"b","match":{"hosts":["d.test"]},
		"auth":{"type":"passthrough","substitutions":[{"credential":"d","placeholder":"DOTS","in":["path"]}]}}]}`).Compile()
		u, _ = url.ParseRequestURI("/a/DOTS/admin")
		if err := amb.Match("https", "d.test", 443, "GET", u.EscapedPath()).Apply(http.Header{}, u); !errors.Is(err, ErrSubstitutedPath) || u.Path != "/a/DOTS/admin" {
			t.Fatalf("%q substituted in the path: %v, path %q", v, err, u.Path)
		}
	}

	// Substitutions come on top of the auth type's own injection.
	inj, u = match("both.test", "/")
	h = http.Header{"X-Org": {"@ODD@"}, "Authorization": {"@ODD@"}}
	if err := inj.Apply(h, u); err != nil {
		t.Fatal(err)
	}
	if h.Get("X-Org") != `a;b c"d&e` || h.Get("Authorization") != "Bearer "+secretValue || inj.SubstitutesBody() {
		t.Fatalf("bearer with substitutions: %v", h)
	}

	sec := strings.Join(r.Secrets(), "|")
	for _, want := range []string{secretValue, `a;b c"d&e`, url.PathEscape(`a;b c"d&e`), url.QueryEscape(`a;b c"d&e`), `a;b c\"d\u0026e`} {
		if !strings.Contains(sec, want) {
			t.Errorf("Secrets lacks %q", want)
		}
	}
}

func TestSubstitutionsSurvivePatchAndSeal(t *testing.T) {
	s := mustCreate(t, fullCreate)
	p, err := DecodePatch([]byte(`{"credentials":{"add":[{"name":"new","source":{"value":"` + secretValue + `"}}]},
		"bindings":{"add":[{"name":"pt","match":{"hosts":["pt.test"]},"auth":{"type":"passthrough","substitutions":[{"credential":"new","placeholder":"$NEW","in":["header"]}]}}]}}`))
	if err != nil {
		t.Fatal(err)
	}
	next, err := s.Apply(p, nil)
	if err != nil {
		t.Fatal(err)
	}
	// The credential a substitution uses cannot be deleted under it.
	del, _ := DecodePatch([]byte(`{"credentials":{"delete":["new"]}}`))
	if _, err := next.Apply(del, nil); err == nil || !strings.Contains(err.Error(), "does not exist") {
		t.Fatalf("deleting a substituted credential: %v", err)
	}
	sl, err := NewSealer(bytes.Repeat([]byte{7}, KeySize))
	if err != nil {
		t.Fatal(err)
	}
	blob, err := SealState(sl, "sb", next, nil)
	if err != nil {
		t.Fatal(err)
	}
	back, _, err := OpenState(sl, "sb", blob)
	if err != nil {
		t.Fatal(err)
	}
	h := http.Header{"X-A": {"$NEW"}}
	u, _ := url.Parse("https://pt.test/")
	if err := back.Compile().Match("https", "pt.test", 443, "GET", "/").Apply(h, u); err != nil || h.Get("X-A") != secretValue {
		t.Fatalf("after seal: %v %v", h, err)
	}
}
