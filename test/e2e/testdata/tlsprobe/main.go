// Command tlsprobe is copied into sandboxes by the Credential Vault e2e
// test. It makes one HTTP(S) GET with the sandbox's own trust store (Go
// reads SSL_CERT_FILE and the distributions' bundle paths) and prints the
// outcome as one JSON line: status, the TLS peer's issuer, the body, or
// the error. With -insecure it skips verification but still reports the
// issuer, to tell which certificate the sandbox was shown. With -resolve
// host:port:addr it connects to addr for host:port without asking DNS, as
// curl --resolve does. With -data it POSTs that body instead.
package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"flag"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"time"
)

type result struct {
	Status int    `json:"status"`
	Issuer string `json:"issuer,omitempty"`
	Body   string `json:"body,omitempty"`
	Err    string `json:"err,omitempty"`
}

func main() {
	insecure := flag.Bool("insecure", false, "do not verify the server certificate")
	timeout := flag.Duration("timeout", 15*time.Second, "give up after this long")
	resolve := flag.String("resolve", "", "host:port:addr: connect to addr for host:port (no DNS)")
	data := flag.String("data", "", "POST this body")
	flag.Parse()
	var out result
	defer func() { json.NewEncoder(os.Stdout).Encode(out) }()
	method, body := "GET", io.Reader(nil)
	if *data != "" {
		method, body = "POST", strings.NewReader(*data)
	}
	req, err := http.NewRequest(method, flag.Arg(0), body)
	if err != nil {
		out.Err = err.Error()
		return
	}
	for _, h := range flag.Args()[1:] {
		k, v, _ := strings.Cut(h, ":")
		req.Header.Set(strings.TrimSpace(k), strings.TrimSpace(v))
	}
	d := &net.Dialer{}
	dial := d.DialContext
	if *resolve != "" {
		// host:port:addr, addr possibly an IPv6 address (with colons).
		parts := strings.SplitN(*resolve, ":", 3)
		if len(parts) != 3 {
			out.Err = "-resolve wants host:port:addr"
			return
		}
		from, to := net.JoinHostPort(parts[0], parts[1]), net.JoinHostPort(strings.Trim(parts[2], "[]"), parts[1])
		dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
			if addr == from {
				addr = to
			}
			return d.DialContext(ctx, network, addr)
		}
	}
	c := &http.Client{Timeout: *timeout, Transport: &http.Transport{
		DialContext:     dial,
		TLSClientConfig: &tls.Config{InsecureSkipVerify: *insecure},
	}}
	resp, err := c.Do(req)
	if err != nil {
		out.Err = err.Error()
		return
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	out.Status, out.Body = resp.StatusCode, string(b)
	if resp.TLS != nil && len(resp.TLS.PeerCertificates) > 0 {
		out.Issuer = resp.TLS.PeerCertificates[0].Issuer.CommonName
	}
}
