package vault

import (
	"bytes"
	"net/http"
	"net/url"
	"testing"

	"github.com/moat-sandbox/moat/internal/errdefs"
)

// FuzzVaultBodies feeds arbitrary create and patch bodies through
// decoding, validation, compilation, matching and sealing: no panic, and
// every refusal is a public invalid-argument (or conflict) error.
func FuzzVaultBodies(f *testing.F) {
	f.Add([]byte(fullCreate), []byte(`{"expectedRevision":1,"bindings":{"delete":["llm"]}}`))
	f.Add([]byte(`{"credentials":[],"bindings":[]}`), []byte(`{}`))
	f.Add([]byte(`{"credentials":[{"name":"c","source":{"value":"v"}}],"bindings":[{"name":"b","match":{"hosts":["*.a.test"],"paths":["/x/*/y"]},"auth":{"type":"customHeaders","headers":[{"name":"X-A","credential":"c"}]}}]}`),
		[]byte(`{"credentials":{"replace":[{"name":"c","source":{"value":"w"}}]}}`))
	f.Add([]byte(substCreate), []byte(`{"bindings":{"replace":[{"name":"sub","match":{"hosts":["sub.test"]},"auth":{"type":"passthrough","substitutions":[{"credential":"odd","placeholder":"X","in":["path","body"]}]}}]}}`))
	sl, err := NewSealer(bytes.Repeat([]byte{3}, KeySize))
	if err != nil {
		f.Fatal(err)
	}
	public := func(t *testing.T, err error) {
		t.Helper()
		if _, ok := errdefs.PublicOf(err); !ok || !(errdefs.IsInvalidArgument(err) || errdefs.IsConflict(err)) {
			t.Fatalf("refusal is not a public invalid-argument error: %v", err)
		}
	}
	f.Fuzz(func(t *testing.T, create, patch []byte) {
		req, err := DecodeCreate(create)
		if err != nil {
			public(t, err)
			return
		}
		s, err := New(req, nil)
		if err != nil {
			public(t, err)
			return
		}
		_ = s.View()
		r := s.Compile()
		for _, b := range s.Bindings {
			for _, h := range b.Match.Hosts {
				r.Intercepts("https", "x."+h[min(2, len(h)):], 443)
				r.Match("https", h, 443, "GET", "/a/../b")
				if inj := r.Match("https", h, 443, "POST", "/"); inj != nil {
					u, _ := url.Parse("https://x/a/{{TOKEN}}?q={{TOKEN}}")
					_ = inj.Apply(http.Header{"X": {"{{TOKEN}}"}}, u)
					inj.SubstituteBody("application/json", "", create)
				}
			}
		}
		blob, err := SealState(sl, "fz", s, nil)
		if err != nil {
			t.Fatal(err)
		}
		back, _, err := OpenState(sl, "fz", blob)
		if err != nil || back.Revision != s.Revision || len(back.Credentials) != len(s.Credentials) {
			t.Fatalf("seal round trip: %v", err)
		}
		p, err := DecodePatch(patch)
		if err != nil {
			public(t, err)
			return
		}
		if _, err := s.Apply(p, nil); err != nil {
			public(t, err)
		}
	})
}
