package server

import "testing"

func TestTLSConfig(t *testing.T) {
	for i, c := range []Config{
		{TLSCert: "/c.pem"}, // no key
		{TLSKey: "/k.pem"},  // no certificate
		{TLSListen: ":443"}, // no pair
		{TLSCert: "/c.pem", TLSKey: "/k.pem", TLSListen: "443"}, // not host:port
	} {
		if errs := c.validateTLS(); len(errs) == 0 {
			t.Errorf("%d: %+v accepted", i, c)
		}
	}
	for i, c := range []Config{
		{},
		{TLSCert: "/c.pem", TLSKey: "/k.pem"},
		{TLSCert: "/c.pem", TLSKey: "/k.pem", TLSListen: "127.0.0.1:443"},
	} {
		if errs := c.validateTLS(); len(errs) > 0 {
			t.Errorf("%d: %+v: %v", i, c, errs)
		}
	}
}
