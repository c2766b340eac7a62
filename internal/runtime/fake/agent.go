package fake

import (
	"errors"
	"net"
	"net/http"
	"time"
)

// agentServer serves a sandbox's stand-in agent on a loopback port of its
// own. It is a plain http.Server rather than net/http/httptest, because
// the fake ships in moat (`moat serve --runtime fake`), which links no
// test packages.
type agentServer struct {
	ln  net.Listener
	srv *http.Server
}

// serveAgent starts serving h on 127.0.0.1 at a port the kernel picks.
func serveAgent(h http.Handler) (*agentServer, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := &agentServer{ln: ln, srv: &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}}
	go func() {
		if err := s.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			ln.Close()
		}
	}()
	return s, nil
}

// addr is the host:port the agent answers on.
func (s *agentServer) addr() string { return s.ln.Addr().String() }

// Close stops the server and closes its connections.
func (s *agentServer) Close() { s.srv.Close() }
