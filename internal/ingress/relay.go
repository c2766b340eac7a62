package ingress

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
)

// relayBufSize is the per-direction copy buffer of an upgraded
// (WebSocket) connection. ReverseProxy's own relay uses io.Copy, which
// allocates 32 KiB per direction for the connection's whole life; idle
// WebSockets are the common case, so a smaller buffer lets one gateway
// hold several times more of them. 8 KiB still moves a typical frame in
// one read.
const relayBufSize = 8 << 10

// upgradeWriter wraps the ResponseWriter of a request that asks for a
// protocol upgrade. ReverseProxy hijacks through it (http.ResponseController
// finds Hijack here, and Flush and the rest through Unwrap) and gets a
// relayConn that copies with relayBufSize buffers.
type upgradeWriter struct{ http.ResponseWriter }

// Unwrap lets http.ResponseController reach the server's writer.
func (u upgradeWriter) Unwrap() http.ResponseWriter { return u.ResponseWriter }

// Hijack hijacks the server connection and wraps it in a relayConn.
func (u upgradeWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	conn, brw, err := http.NewResponseController(u.ResponseWriter).Hijack()
	if err != nil {
		return conn, brw, err
	}
	rc := &relayConn{Conn: conn, r: conn}
	// Bytes the client sent right behind its upgrade request sit in the
	// server's read buffer; ReverseProxy would read past them.
	if n := brw.Reader.Buffered(); n > 0 {
		rc.r = io.MultiReader(io.LimitReader(brw.Reader, int64(n)), conn)
	}
	return rc, brw, nil
}

// relayConn is a hijacked client connection whose ReadFrom and WriteTo
// (what io.Copy picks) copy through a relayBufSize buffer.
type relayConn struct {
	net.Conn
	r io.Reader // the hijack buffer's leftovers, then Conn
}

func (c *relayConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// ReadFrom copies src (the sandbox side) to the client.
func (c *relayConn) ReadFrom(src io.Reader) (int64, error) {
	return io.CopyBuffer(struct{ io.Writer }{c.Conn}, src, make([]byte, relayBufSize))
}

// WriteTo copies the client's bytes to dst (the sandbox side).
func (c *relayConn) WriteTo(dst io.Writer) (int64, error) {
	return io.CopyBuffer(dst, struct{ io.Reader }{c}, make([]byte, relayBufSize))
}

// CloseWrite half-closes the client connection, so an upstream EOF
// reaches the client as ReverseProxy intends.
func (c *relayConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return errors.ErrUnsupported
}
