// Package apiwrites counts the writes a Kubernetes client makes to the API
// server, by "VERB resource" (e.g. "POST pods", "PUT batchsandboxes/status"):
// through a rest.Config it wraps (Counter.Wrap), or, for another process
// such as a `moat controller` measured as users run it, through a loopback
// proxy in front of the API server (StartProxy). `moat bench k8s` reports
// these counts; tests assert them.
package apiwrites

import (
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/moat-sandbox/moat/internal/web"
)

// Counter counts the API writes (every request that is not a GET,
// LIST or WATCH) made through a rest.Config it wrapped, by "VERB resource".
type Counter struct {
	mu     sync.Mutex
	counts map[string]int
}

// Wrap returns a copy of cfg whose requests are counted.
func (w *Counter) Wrap(cfg *rest.Config) *rest.Config {
	c := rest.CopyConfig(cfg)
	prev := c.WrapTransport
	c.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		if prev != nil {
			rt = prev(rt)
		}
		return countingRT{w: w, next: rt}
	}
	return c
}

type countingRT struct {
	w    *Counter
	next http.RoundTripper
}

func (c countingRT) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		c.w.add(r.Method + " " + resourceOf(r.URL.Path))
	}
	return c.next.RoundTrip(r)
}

// resourceOf maps /api/v1/namespaces/ns/pods/x/status to "pods/status".
func resourceOf(path string) string {
	parts := strings.Split(strings.Trim(path, "/"), "/")
	// Drop the group/version prefix: api/v1 or apis/<group>/<version>.
	switch {
	case len(parts) >= 2 && parts[0] == "api":
		parts = parts[2:]
	case len(parts) >= 3 && parts[0] == "apis":
		parts = parts[3:]
	}
	if len(parts) >= 2 && parts[0] == "namespaces" {
		parts = parts[2:]
	}
	switch len(parts) {
	case 0:
		return "namespaces"
	case 1, 2:
		return parts[0]
	default:
		return parts[0] + "/" + parts[2]
	}
}

func (w *Counter) add(k string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.counts == nil {
		w.counts = map[string]int{}
	}
	w.counts[k]++
}

// Snapshot returns the counts so far.
func (w *Counter) Snapshot() map[string]int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return maps.Clone(w.counts)
}

// Since returns the counts added after snapshot before.
func (w *Counter) Since(before map[string]int) map[string]int {
	out := map[string]int{}
	for k, v := range w.Snapshot() {
		if d := v - before[k]; d > 0 {
			out[k] = d
		}
	}
	return out
}

// Total sums counts.
func Total(counts map[string]int) int {
	n := 0
	for _, v := range counts {
		n += v
	}
	return n
}

// Proxy is a loopback HTTP proxy in front of the API server that
// counts the writes passing through it, so that a process of its own (a
// `moat controller` at its defaults) can be measured as users run it.
// It authenticates upstream with the admin configuration; its clients
// need no credentials (it listens on 127.0.0.1 only).
type Proxy struct {
	// Kubeconfig is a kubeconfig file pointing at the proxy.
	Kubeconfig string
	srv        *http.Server
	ln         net.Listener
}

// StartProxy starts a proxy to cfg's API server counting into w;
// its kubeconfig is written into dir.
func StartProxy(cfg *rest.Config, w *Counter, dir string) (*Proxy, error) {
	up, err := url.Parse(cfg.Host)
	if err != nil {
		return nil, err
	}
	rt, err := rest.TransportFor(cfg)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	rp := &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.SetURL(up)
			r.Out.Host = up.Host
		},
		Transport:     countingRT{w: w, next: rt},
		FlushInterval: -1,
	}
	p := &Proxy{srv: &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { web.ServeProxy(rp, w, r) })}, ln: ln, Kubeconfig: filepath.Join(dir, "proxy.kubeconfig")}
	kc := clientcmdapi.NewConfig()
	kc.Clusters["proxy"] = &clientcmdapi.Cluster{Server: "http://" + ln.Addr().String()}
	kc.AuthInfos["proxy"] = &clientcmdapi.AuthInfo{}
	kc.Contexts["proxy"] = &clientcmdapi.Context{Cluster: "proxy", AuthInfo: "proxy"}
	kc.CurrentContext = "proxy"
	if err := clientcmd.WriteToFile(*kc, p.Kubeconfig); err != nil {
		ln.Close()
		return nil, err
	}
	go func() {
		if err := p.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			fmt.Fprintln(os.Stderr, "apiwrites: proxy:", err)
		}
	}()
	return p, nil
}

// Close stops the proxy.
func (p *Proxy) Close() error {
	err := p.srv.Close()
	os.Remove(p.Kubeconfig)
	return err
}
