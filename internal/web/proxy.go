package web

import (
	"net/http"
	"net/http/httputil"
)

// ServeProxy serves r through the reverse proxy rp with the request body
// and the response in full duplex. Every reverse proxy of moat goes
// through it.
//
// Without full duplex the HTTP/1 server drains and closes whatever the
// handler has not yet read of the request body as soon as the response
// starts. A proxy's transport is often still forwarding that body then:
// a backend that answers before it has it all (a stream that starts at
// once, an upload that reports progress) loses the drained bytes, and
// even when the backend had it all, the transport's last read of the body
// (for its end) fails on the closed body and tears the backend connection
// down in the middle of the response: the client sees its stream cut
// ("other side closed"; golang/go#40747). On a busy host the transport
// often reaches that last read only after the backend has answered.
func ServeProxy(rp *httputil.ReverseProxy, w http.ResponseWriter, r *http.Request) {
	// HTTP/2 is always full duplex (and answers ErrNotSupported).
	_ = http.NewResponseController(w).EnableFullDuplex()
	rp.ServeHTTP(w, r)
}
