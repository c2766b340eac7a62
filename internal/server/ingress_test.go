package server

import (
	"encoding/base64"
	"strings"
	"testing"
)

func TestIngressConfig(t *testing.T) {
	key := "a=" + base64.StdEncoding.EncodeToString([]byte("s"))
	bad := []Config{
		{IngressRouteMode: "uri"},                                  // no listener
		{IngressListen: ":28888", IngressRouteMode: "host"},        // unknown mode
		{IngressListen: ":28888", IngressRouteMode: "wildcard"},    // no domain
		{IngressListen: "28888", IngressRouteMode: "uri"},          // not host:port
		{IngressListen: ":28888", IngressSecureAccessKeys: "A=xx"}, // bad key id
		{IngressListen: ":28888", IngressActiveKey: "a"},           // active key without keys
		{IngressSecureAccessKeys: "A=xx"},                          // bad key id, no listener
		{IngressAddress: "gw.test"},                                // address without a listener
		{IngressListen: ":28888", IngressSecureAccessKeys: key, IngressActiveKey: "b"},
		{IngressListen: ":28888", IngressRouteMode: "wildcard", IngressDomain: "s.test", IngressAddress: "other.test:1"},
		{IngressListen: ":28888", IngressRouteMode: "uri", IngressAddress: "gw.test/path"},
	}
	for i, c := range bad {
		if errs := c.validateIngress(); len(errs) == 0 {
			t.Errorf("%d: %+v accepted", i, c)
		}
	}
	tests := []struct {
		cfg  Config
		want string // Endpoints.Address ("" = request host)
	}{
		{Config{IngressListen: ":28888", IngressRouteMode: "wildcard", IngressDomain: "s.test"}, "s.test:28888"},
		{Config{IngressListen: ":28888", IngressRouteMode: "wildcard", IngressDomain: "s.test", IngressAddress: "*.s.test"}, "*.s.test"},
		{Config{IngressListen: ":28888", IngressRouteMode: "uri", PublicAddress: "api.test:8080"}, "api.test:28888"},
		{Config{IngressListen: "10.0.0.5:28888", IngressRouteMode: "header"}, "10.0.0.5:28888"},
		{Config{IngressListen: "0.0.0.0:28888", IngressRouteMode: "uri"}, ""},
		{Config{IngressListen: ":28888", IngressRouteMode: "uri", IngressAddress: "gw.test"}, "gw.test"},
	}
	for _, tc := range tests {
		if errs := tc.cfg.validateIngress(); len(errs) > 0 {
			t.Fatalf("%+v: %v", tc.cfg, errs)
		}
		_, e, signed, err := ingressSetup(tc.cfg, key)
		if err != nil || e == nil || e.Address != tc.want || e.Port != "28888" || signed != e {
			t.Errorf("%+v: endpoints %+v (signed %+v), %v; want address %q", tc.cfg, e, signed, err, tc.want)
		}
	}
	t.Setenv(EnvSecureAccessKeys, key)
	c := Config{IngressListen: ":28888"}
	if errs := c.validateIngress(); len(errs) > 0 || c.IngressSecureAccessKeys != key {
		t.Fatalf("keys from the environment: %v %q", errs, c.IngressSecureAccessKeys)
	}
	signer, e, signed, err := ingressSetup(c, c.IngressSecureAccessKeys)
	if err != nil || signer == nil || e != nil || signed == nil || signed.Mode != "uri" || signed.Port != "28888" {
		t.Fatalf("keys without a route mode: signer %v endpoints %v signed %+v err %v", signer, e, signed, err)
	}
	// Without a gateway of its own, signed endpoints are the API
	// listener's mount, at the public address (or the request's host).
	c = Config{PublicAddress: "api.test:8080"}
	if errs := c.validateIngress(); len(errs) > 0 {
		t.Fatal(errs)
	}
	signer, e, signed, err = ingressSetup(c, key)
	if err != nil || signer == nil || e != nil || signed == nil || signed.Address != "api.test:8080" || signed.Prefix != MountPrefix || signed.Port != "" {
		t.Fatalf("no listener: signer %v endpoints %v signed %+v err %v", signer, e, signed, err)
	}
	if ep, _ := (*signed).Endpoint("ignored:1", "sb1", 80, false, 0); ep != "api.test:8080/ingress/sb1/80" {
		t.Errorf("mounted endpoint %q", ep)
	}
	signed.Address = ""
	if ep, _ := (*signed).Endpoint("req.test:9000", "sb1", 80, false, 0); ep != "req.test:9000/ingress/sb1/80" {
		t.Errorf("mounted endpoint at the request host: %q", ep)
	}
	if errs := (&Config{IngressListen: ":1", IngressSecureAccessKeys: "a=!!!"}).validateIngress(); len(errs) == 0 || strings.Contains(errs[0].Error(), "!!!") {
		t.Errorf("bad secret: %v (must not echo it)", errs)
	}
}
