package k8stest

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/moat-sandbox/moat/internal/web"
)

// CountingProxy is a loopback HTTP proxy in front of the API server that
// counts the writes passing through it, so that a process of its own (a
// `moat controller` at its defaults) can be measured as users run it.
// It authenticates upstream with the admin configuration; its clients
// need no credentials (it listens on 127.0.0.1 only).
type CountingProxy struct {
	// Kubeconfig is a kubeconfig file pointing at the proxy.
	Kubeconfig string
	srv        *http.Server
	ln         net.Listener
}

// StartCountingProxy starts a proxy to cfg's API server counting into w;
// its kubeconfig is written into dir.
func StartCountingProxy(cfg *rest.Config, w *WriteCounter, dir string) (*CountingProxy, error) {
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
	p := &CountingProxy{srv: &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { web.ServeProxy(rp, w, r) })}, ln: ln, Kubeconfig: filepath.Join(dir, "proxy.kubeconfig")}
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
			fmt.Fprintln(os.Stderr, "k8stest: counting proxy:", err)
		}
	}()
	return p, nil
}

// Close stops the proxy.
func (p *CountingProxy) Close() error {
	err := p.srv.Close()
	os.Remove(p.Kubeconfig)
	return err
}
