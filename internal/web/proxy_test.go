package web_test

import (
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"testing"

	"github.com/moat-sandbox/moat/internal/web"
	"github.com/moat-sandbox/moat/internal/web/webtest"
)

// A request whose body is still coming when the backend's answer starts:
// through ServeProxy the answer streams at once and the backend gets every
// byte. (Through rp.ServeHTTP alone this fails: see webtest.CheckDuplex.)
func TestServeProxyFullDuplex(t *testing.T) {
	u, _ := url.Parse(webtest.DuplexBackend(t).URL)
	rp := &httputil.ReverseProxy{
		Rewrite:       func(pr *httputil.ProxyRequest) { pr.SetURL(u) },
		FlushInterval: -1,
	}
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		web.ServeProxy(rp, w, r)
	}))
	defer front.Close()
	webtest.CheckDuplex(t, front.Client(), front.URL, nil)
}
