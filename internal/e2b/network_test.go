package e2b

import (
	"testing"

	"github.com/moat-sandbox/moat/internal/errdefs"
)

func TestNetworkPolicy(t *testing.T) {
	no, yes := false, true
	for i, c := range []struct {
		internet *bool
		n        *networkConfig
		want     string // "" = no policy
	}{
		{nil, nil, ""},
		{&yes, nil, ""},
		{nil, &networkConfig{AllowOut: []string{"example.test"}}, ""},
		{&no, nil, `{"defaultAction":"deny","egress":[]}`},
		{&no, &networkConfig{AllowOut: []string{"pypi.org", "10.0.0.0/8"}},
			`{"defaultAction":"deny","egress":[{"action":"allow","target":"pypi.org"},{"action":"allow","target":"10.0.0.0/8"}]}`},
		{nil, &networkConfig{DenyOut: []string{allTraffic}, AllowOut: []string{"pypi.org"}},
			`{"defaultAction":"deny","egress":[{"action":"allow","target":"pypi.org"}]}`},
		{nil, &networkConfig{DenyOut: []string{"1.2.3.4"}}, `{"defaultAction":"allow","egress":[{"action":"deny","target":"1.2.3.4"}]}`},
	} {
		got, err := networkPolicy(c.internet, c.n)
		if err != nil || string(got) != c.want {
			t.Errorf("%d: %s, %v; want %s", i, got, err, c.want)
		}
	}
	host := "x"
	for i, n := range []*networkConfig{
		{AllowPublicTraffic: &no},
		{MaskRequestHost: &host},
		{HTTPSPorts: []int{443}},
		{Rules: []byte(`{"a.test":[]}`)},
		{EgressProxy: []byte(`{"address":"p:1"}`)},
	} {
		if _, err := networkPolicy(nil, n); !errdefs.IsNotImplemented(err) {
			t.Errorf("%d: %v, want not implemented", i, err)
		}
	}
}

func TestParseMetadataQuery(t *testing.T) {
	// {k: "v w", a: "b&c"} as the JS SDK sends it, after the framework's
	// own decoding of the query parameter.
	got, err := parseMetadataQuery("k%3Dv%2520w%26a%3Db%2526c")
	if err != nil || len(got) != 2 || got["k"] != "v w" || got["a"] != "b&c" {
		t.Fatalf("%v %v", got, err)
	}
	for _, bad := range []string{"novalue", "a=b=c", "%zz", "=v"} {
		if _, err := parseMetadataQuery(bad); !errdefs.IsInvalidArgument(err) {
			t.Errorf("%q: %v", bad, err)
		}
	}
}
