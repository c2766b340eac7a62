package ingress

import (
	"net/http/httptest"
	"reflect"
	"testing"

	"github.com/moat-sandbox/moat/internal/errdefs"
)

const testDomain = "sandbox.example.test"

func TestParseRoute(t *testing.T) {
	const uuid = "3f2a9c1e-7b4d-4e8a-9c2f-1a2b3c4d5e6f"
	tests := []struct {
		name    string
		target  string
		host    string
		header  []string
		want    route
		wantErr bool
	}{
		{name: "1 header", target: "/x?y=1", header: []string{"sb1-8080"},
			want: route{mode: modeHeader, cands: []candidate{{"sb1", 8080}}}},
		{name: "2 header id with dashes", target: "/", header: []string{uuid + "-44772"},
			want: route{mode: modeHeader, cands: []candidate{{uuid, 44772}}}},
		{name: "3 header beats host and path", target: "/other/81/", host: "82-sb2." + testDomain, header: []string{"sb1-80"},
			want: route{mode: modeHeader, cands: []candidate{{"sb1", 80}}}},
		{name: "4 header bad port", target: "/", header: []string{"sb1-0"}, wantErr: true},
		{name: "5 header port too big", target: "/", header: []string{"sb1-65536"}, wantErr: true},
		{name: "6 header no port", target: "/", header: []string{"sb1"}, wantErr: true},
		{name: "7 header no id", target: "/", header: []string{"-80"}, wantErr: true},
		{name: "8 header twice", target: "/", header: []string{"a-80", "b-81"}, wantErr: true},
		{name: "9 header signed-looking but malformed", target: "/", header: []string{"sb1-80-abc-sig"}, wantErr: true},
		{name: "10 host port-id", target: "/p", host: "8080-" + uuid + "." + testDomain,
			want: route{mode: modeHost, cands: []candidate{{uuid, 8080}}}},
		{name: "11 host id-port (upstream)", target: "/p", host: uuid + "-8080." + testDomain,
			want: route{mode: modeHost, cands: []candidate{{uuid, 8080}}}},
		{name: "12 host with port and case", target: "/", host: "80-SB1.Sandbox.Example.Test.:28888",
			want: route{mode: modeHost, cands: []candidate{{"sb1", 80}}}},
		{name: "13 host ambiguous: both readings, port-id first", target: "/", host: "8080-web-3000." + testDomain,
			want: route{mode: modeHost, cands: []candidate{{"web-3000", 8080}, {"8080-web", 3000}}}},
		{name: "14 host beats path", target: "/sb9/99/x", host: "80-sb1." + testDomain,
			want: route{mode: modeHost, cands: []candidate{{"sb1", 80}}}},
		{name: "15 host no port", target: "/", host: "web." + testDomain, wantErr: true},
		{name: "16 host two labels", target: "/", host: "80-a.b." + testDomain, wantErr: true},
		{name: "17 host bad port", target: "/", host: "99999-sb1." + testDomain, wantErr: true},
		{name: "18 other host falls to path", target: "/sb1/80/a", host: "80-sb1.elsewhere.test",
			want: route{mode: modePath, cands: []candidate{{"sb1", 80}}, rawPath: "/a", path: "/a"}},
		{name: "19 bare domain falls to path", target: "/sb1/80/", host: testDomain,
			want: route{mode: modePath, cands: []candidate{{"sb1", 80}}, rawPath: "/", path: "/"}},
		{name: "20 path rest kept escaped", target: "/sb1/80/a%2Fb/c?q=1", host: "127.0.0.1",
			want: route{mode: modePath, cands: []candidate{{"sb1", 80}}, rawPath: "/a%2Fb/c", path: "/a/b/c"}},
		{name: "21 path without rest", target: "/sb1/80", host: "127.0.0.1",
			want: route{mode: modePath, cands: []candidate{{"sb1", 80}}, rawPath: "/", path: "/"}},
		{name: "22 path root", target: "/", host: "127.0.0.1", wantErr: true},
		{name: "23 path missing port", target: "/sb1", host: "127.0.0.1", wantErr: true},
		{name: "24 path port not a number", target: "/sb1/http/x", host: "127.0.0.1", wantErr: true},
		{name: "25 path port signed", target: "/sb1/+80/x", host: "127.0.0.1", wantErr: true},
		{name: "26 path dot id", target: "/../80/x", host: "127.0.0.1", wantErr: true},
		{name: "27 path escaped id", target: "/sb%2F1/80/x", host: "127.0.0.1", wantErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequest("GET", tc.target, nil)
			r.Host = tc.host
			for _, h := range tc.header {
				r.Header.Add(HeaderIngressTo, h)
			}
			got, err := parseRoute(r, testDomain)
			if tc.wantErr {
				if !errdefs.IsInvalidArgument(err) {
					t.Fatalf("err = %v, want invalid argument (route %+v)", err, got)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("route = %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestParseRouteNoDomain(t *testing.T) {
	r := httptest.NewRequest("GET", "/sb1/80/", nil)
	r.Host = "81-sb2." + testDomain
	got, err := parseRoute(r, "")
	if err != nil || got.mode != modePath || got.cands[0] != (candidate{"sb1", 80}) {
		t.Fatalf("route = %+v, %v; want path route to sb1:80", got, err)
	}
}

func TestParsePort(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int
		ok   bool
	}{
		{"1", 1, true}, {"65535", 65535, true}, {"08080", 8080, true},
		{"0", 0, false}, {"65536", 0, false}, {"", 0, false}, {"-1", 0, false},
		{"+80", 0, false}, {" 80", 0, false}, {"123456", 0, false}, {"8o", 0, false},
	} {
		got, ok := parsePort(tc.in)
		if got != tc.want || ok != tc.ok {
			t.Errorf("parsePort(%q) = %d, %v; want %d, %v", tc.in, got, ok, tc.want, tc.ok)
		}
	}
}

func TestStripQueryParam(t *testing.T) {
	for i, tc := range []struct {
		in, rest string
		vals     []string
	}{
		{"", "", nil},
		{"a=1&b=2", "a=1&b=2", nil},
		{"access_token=tok", "", []string{"tok"}},
		{"z=1&access_token=t%2Bk&a=%20x&access_token=two", "z=1&a=%20x", []string{"t+k", "two"}},
		{"my_access_token=1&access_token", "my_access_token=1", []string{""}},
	} {
		rest, vals := stripQueryParam(tc.in, QueryAccessToken)
		if rest != tc.rest || !reflect.DeepEqual(vals, tc.vals) {
			t.Errorf("%d: stripQueryParam(%q) = %q, %q; want %q, %q", i+1, tc.in, rest, vals, tc.rest, tc.vals)
		}
	}
}

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		cfg Config
		ok  bool
	}{
		{Config{}, true},
		{Config{Domain: testDomain}, true},
		{Config{Domain: ".example.test"}, false},
		{Config{Domain: "localhost"}, false},
		{Config{Domain: "example.test:80"}, false},
		{Config{DialTimeout: -1}, false},
	} {
		if err := tc.cfg.Validate(); (err == nil) != tc.ok {
			t.Errorf("Validate(%+v) = %v, want ok=%v", tc.cfg, err, tc.ok)
		}
	}
}
