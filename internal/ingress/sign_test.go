package ingress

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"net/http/httptest"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"
)

var (
	secretA = []byte("moat-test-secret-a")
	secretB = []byte("another secret, key b")
	keySpec = "a=" + base64.StdEncoding.EncodeToString(secretA) + ", b=" + base64.StdEncoding.EncodeToString(secretB)
)

func testSigner(t *testing.T, active string, now time.Time) *Signer {
	t.Helper()
	s, err := NewSigner(keySpec, active)
	if err != nil {
		t.Fatal(err)
	}
	s.now = func() time.Time { return now }
	return s
}

// reference computes the OSEP-0011 signature straight from its
// definition, independently of hex8.
func reference(secret []byte, keyID, id string, port int, exp string) string {
	c := []byte("v1\nshort\n" + id + "\n" + strconv.Itoa(port) + "\n" + exp + "\n")
	var inner []byte
	inner = binary.BigEndian.AppendUint32(inner, uint32(len(secret)))
	inner = append(inner, secret...)
	inner = binary.BigEndian.AppendUint32(inner, uint32(len(c)))
	inner = append(inner, c...)
	sum := sha256.Sum256(inner)
	return hex.EncodeToString(sum[:])[:8] + keyID
}

func TestSignFormat(t *testing.T) {
	s := testSigner(t, "", time.Unix(1_900_000_000, 0))
	exp, sig := s.Sign("my-sandbox", 8080, 2_000_000_000)
	if exp != "x2qxvk" { // upstream's test vector for 2000000000
		t.Fatalf("expires_b36 = %q, want x2qxvk", exp)
	}
	if want := reference(secretA, "a", "my-sandbox", 8080, "x2qxvk"); sig != want {
		t.Fatalf("signature = %q, want %q", sig, want)
	}
	if _, sig := testSigner(t, "b", time.Now()).Sign("my-sandbox", 8080, 2_000_000_000); sig != reference(secretB, "b", "my-sandbox", 8080, "x2qxvk") {
		t.Fatalf("active key b: %q", sig)
	}
	if exp, _ := s.Sign("x", 1, 0); exp != "0" {
		t.Fatalf("expires 0 = %q", exp)
	}
}

func TestNewSignerErrors(t *testing.T) {
	good := base64.StdEncoding.EncodeToString([]byte("k"))
	for _, tc := range []struct{ spec, active string }{
		{"", ""},
		{" , ", ""},
		{"A=" + good, ""},
		{"ab=" + good, ""},
		{"-=" + good, ""},
		{"a=", ""},
		{"a", ""},
		{"a=not base64!", ""},
		{"a=" + good + ",a=" + good, ""},
		{"a=" + good, "b"},
		{"a=" + good, "ab"},
	} {
		if _, err := NewSigner(tc.spec, tc.active); err == nil {
			t.Errorf("NewSigner(%q, %q) accepted", tc.spec, tc.active)
		}
	}
	if _, err := NewSigner("z=secret-is-here", ""); err == nil || strings.Contains(err.Error(), "secret-is-here") {
		t.Errorf("bad base64: err %v (must not quote the secret)", err)
	}
}

func TestVerify(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	s := testSigner(t, "a", now)
	const id = "3f2a9c1e-7b4d-4e8a-9c2f-1a2b3c4d5e6f"
	exp, sig := s.Sign(id, 8080, uint64(now.Unix())+60)
	tampered := flipFirst(sig)
	_, sigB := testSigner(t, "b", now).Sign(id, 8080, uint64(now.Unix())+60)
	expiredExp, expiredSig := s.Sign(id, 8080, uint64(now.Unix())-1)
	laterExp := strconv.FormatUint(uint64(now.Unix())+3600, 36)
	onlyA, _ := NewSigner("a="+base64.StdEncoding.EncodeToString(secretA), "")
	onlyA.now = s.now

	tests := []struct {
		name     string
		s        *Signer
		id       string
		port     int
		exp, sig string
		ok       bool
	}{
		{"valid", s, id, 8080, exp, sig, true},
		{"valid at the deadline", testSigner(t, "a", now.Add(60*time.Second)), id, 8080, exp, sig, true},
		{"rotated: key b token, active a", s, id, 8080, exp, sigB, true},
		{"expired", s, id, 8080, expiredExp, expiredSig, false},
		{"expired later", testSigner(t, "a", now.Add(61*time.Second)), id, 8080, exp, sig, false},
		{"tampered signature", s, id, 8080, exp, tampered, false},
		{"tampered expiry (extended)", s, id, 8080, laterExp, sig, false},
		{"wrong sandbox", s, "3f2a9c1e-7b4d-4e8a-9c2f-1a2b3c4d5e60", 8080, exp, sig, false},
		{"wrong port", s, id, 8081, exp, sig, false},
		{"unknown key id", onlyA, id, 8080, exp, sigB, false},
		{"key id swapped", s, id, 8080, exp, sig[:8] + "b", false},
		{"uppercase hex", s, id, 8080, exp, strings.ToUpper(sig[:8]) + "a", false},
		{"short", s, id, 8080, exp, sig[:8], false},
		{"leading zero expiry", s, id, 8080, "0" + exp, sig, false},
	}
	for _, tc := range tests {
		err := tc.s.Verify(tc.id, tc.port, tc.exp, tc.sig)
		if (err == nil) != tc.ok {
			t.Errorf("%s: Verify = %v, want ok=%v", tc.name, err, tc.ok)
		}
		if err != nil {
			if st, code := statusOf(err); st != 401 || code != codeUnauthorized {
				t.Errorf("%s: status %d %s, want 401", tc.name, st, code)
			}
		}
	}
}

func TestParseSignedRoutes(t *testing.T) {
	const uuid = "3f2a9c1e-7b4d-4e8a-9c2f-1a2b3c4d5e6f"
	tok := &signedToken{expiresB36: "x2qxvk", signature: "0123abcda"}
	tests := []struct {
		name   string
		target string
		host   string
		header string
		want   route
	}{
		{"header", "/p", "", uuid + "-44772-x2qxvk-0123abcda",
			route{mode: modeHeader, cands: []candidate{{uuid, 44772}}, signed: tok}},
		{"host", "/p", uuid + "-8080-x2qxvk-0123abcda." + testDomain, "",
			route{mode: modeHost, cands: []candidate{{uuid, 8080}}, signed: tok}},
		{"path with rest", "/" + uuid + "/8080/x2qxvk/0123abcda/a%2Fb?q=1", "127.0.0.1", "",
			route{mode: modePath, cands: []candidate{{uuid, 8080}}, signed: tok, rawPath: "/a%2Fb", path: "/a/b"}},
		{"path without rest", "/" + uuid + "/8080/x2qxvk/0123abcda", "127.0.0.1", "",
			route{mode: modePath, cands: []candidate{{uuid, 8080}}, signed: tok, rawPath: "/", path: "/"}},
		{"path not signed (bad signature shape)", "/sb1/80/x2qxvk/0123ABCDa/z", "127.0.0.1", "",
			route{mode: modePath, cands: []candidate{{"sb1", 80}}, rawPath: "/x2qxvk/0123ABCDa/z", path: "/x2qxvk/0123ABCDa/z"}},
		{"header unsigned id with dashes", "/", "", "a-b-c-80",
			route{mode: modeHeader, cands: []candidate{{"a-b-c", 80}}}},
	}
	for _, tc := range tests {
		r := httptest.NewRequest("GET", tc.target, nil)
		if tc.host != "" {
			r.Host = tc.host
		}
		if tc.header != "" {
			r.Header.Set(HeaderIngressTo, tc.header)
		}
		got, err := parseRoute(r, testDomain)
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		if !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s: got %+v (signed %+v), want %+v", tc.name, got, got.signed, tc.want)
		}
	}
}

func TestEndpointsFormat(t *testing.T) {
	s := testSigner(t, "a", time.Now())
	exp, sig := s.Sign("sb-1", 8080, 2_000_000_000)
	tests := []struct {
		e      Endpoints
		signed bool
		want   string
		hdr    map[string]string
	}{
		{Endpoints{Mode: RouteWildcard, Address: "*.sandbox.test:28888"}, false, "sb-1-8080.sandbox.test:28888", nil},
		{Endpoints{Mode: RouteWildcard, Address: "sandbox.test", Signer: s}, true, "sb-1-8080-" + exp + "-" + sig + ".sandbox.test", nil},
		{Endpoints{Mode: RouteURI, Address: "gw.test:28888"}, false, "gw.test:28888/sb-1/8080", nil},
		{Endpoints{Mode: RouteURI, Address: "gw.test", Signer: s}, true, "gw.test/sb-1/8080/" + exp + "/" + sig, nil},
		{Endpoints{Mode: RouteHeader, Address: "gw.test"}, false, "gw.test", map[string]string{HeaderIngressTo: "sb-1-8080"}},
		{Endpoints{Mode: RouteURI, Port: "28888"}, false, "api.test:28888/sb-1/8080", nil},
		{Endpoints{Mode: RouteHeader, Port: "28888"}, false, "api.test:28888", map[string]string{HeaderIngressTo: "sb-1-8080"}},
		{Endpoints{Mode: RouteHeader, Address: "gw.test", Signer: s}, true, "gw.test", map[string]string{HeaderIngressTo: "sb-1-8080-" + exp + "-" + sig}},
	}
	for _, tc := range tests {
		got, hdr := tc.e.Endpoint("api.test:8080", "sb-1", 8080, tc.signed, 2_000_000_000)
		if got != tc.want || !reflect.DeepEqual(hdr, tc.hdr) {
			t.Errorf("%s signed=%v: %q %v, want %q %v", tc.e.Mode, tc.signed, got, hdr, tc.want, tc.hdr)
		}
	}
	if ValidateMode("host") == nil || ValidateMode(RouteURI) != nil {
		t.Error("ValidateMode")
	}
}

// TestGatewaySignedRoutes drives signed routes through the gateway: a
// valid one reaches a secureAccess sandbox without its token; expired,
// tampered and other-sandbox/port ones are refused before any lookup.
func TestGatewaySignedRoutes(t *testing.T) {
	now := time.Now()
	s := testSigner(t, "a", now)
	e := newEnvConfig(t, Config{Domain: testDomain, DialTimeout: 2 * time.Second, Signer: s})
	a := newBackend(t, "a")
	e.res.add("sec", Target{Addr: addrOf(a), AccessToken: "tok"})
	e.res.add("other", Target{Addr: addrOf(a)})
	deadline := uint64(now.Unix()) + 300
	exp, sig := s.Sign("sec", 80, deadline)
	oexp, osig := s.Sign("other", 80, deadline)
	xexp, xsig := s.Sign("sec", 80, uint64(now.Unix())-10)
	gw := e.ts.URL

	ok := []struct{ name, url, hdr string }{
		{"header", gw + "/x?q=1", "sec-80-" + exp + "-" + sig},
		{"host", "http://sec-80-" + exp + "-" + sig + "." + testDomain + "/x?q=1", ""},
		{"path", gw + "/sec/80/" + exp + "/" + sig + "/x?q=1", ""},
	}
	for _, tc := range ok {
		hdr := map[string]string{}
		if tc.hdr != "" {
			hdr[HeaderIngressTo] = tc.hdr
		}
		got := e.echo(t, "GET", tc.url, hdr, "")
		if got.URI != "/x?q=1" || got.Header.Get(HeaderIngressTo) != "" {
			t.Errorf("%s: upstream saw %+v", tc.name, got)
		}
	}
	before := len(e.res.resolved)
	deny := []struct{ name, url string }{
		{"expired", gw + "/sec/80/" + xexp + "/" + xsig + "/"},
		{"tampered", gw + "/sec/80/" + exp + "/" + flipFirst(sig) + "/"},
		{"other sandbox's signature", gw + "/sec/80/" + oexp + "/" + osig + "/"},
		{"other port", gw + "/sec/81/" + exp + "/" + sig + "/"},
		{"unknown sandbox", gw + "/nope/80/" + exp + "/" + sig + "/"},
	}
	for _, tc := range deny {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := e.do("GET", tc.url, nil, "")
			wantError(t, resp, body, 401, codeUnauthorized)
		})
	}
	if len(e.res.resolved) != before {
		t.Errorf("a refused signed route was resolved: %v", e.res.resolved[before:])
	}
	// Without the token or a signature the secure sandbox stays closed.
	resp, body := e.do("GET", gw+"/sec/80/", nil, "")
	wantError(t, resp, body, 401, codeUnauthorized)

	// A gateway without keys refuses signed routes.
	e2 := newEnv(t)
	e2.res.add("sec", Target{Addr: addrOf(a)})
	resp, body = e2.do("GET", e2.ts.URL+"/sec/80/"+exp+"/"+sig+"/", nil, "")
	wantError(t, resp, body, 401, codeUnauthorized)
}

// flipFirst changes the first hex digit of a signature.
func flipFirst(sig string) string {
	c := byte('0')
	if sig[0] == '0' {
		c = '1'
	}
	return string(c) + sig[1:]
}

func BenchmarkVerifySignedRoute(b *testing.B) {
	s, err := NewSigner(keySpec, "")
	if err != nil {
		b.Fatal(err)
	}
	const id = "3f2a9c1e-7b4d-4e8a-9c2f-1a2b3c4d5e6f"
	exp, sig := s.Sign(id, 8080, uint64(time.Now().Add(time.Hour).Unix()))
	b.ReportAllocs()
	for b.Loop() {
		if err := s.Verify(id, 8080, exp, sig); err != nil {
			b.Fatal(err)
		}
	}
}
