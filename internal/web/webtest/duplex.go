// Package webtest holds test helpers for moat's HTTP plumbing: a backend
// that answers while the request body is still arriving, and the check
// that a reverse proxy carries such an exchange unchanged (see
// web.ServeProxy).
package webtest

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// DuplexBackend starts a backend that answers while the request body is
// still arriving: it reads the first line of the body, streams
// "started <line>" at once, then reads the rest and streams
// "body <bytes in all> <read error>". The agent does the same on a small
// scale: its command stream starts before a proxy's transport is done with
// the request body.
func DuplexBackend(t testing.TB) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rc := http.NewResponseController(w)
		if err := rc.EnableFullDuplex(); err != nil {
			t.Errorf("duplex backend: %v", err)
		}
		br := bufio.NewReader(r.Body)
		first, err := br.ReadString('\n')
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprintf(w, "started %s", first)
		rc.Flush()
		rest, err := io.Copy(io.Discard, br)
		fmt.Fprintf(w, "body %d %v\n", int64(len(first))+rest, err)
	}))
	t.Cleanup(srv.Close)
	return srv
}

// CheckDuplex POSTs to url, through a proxy in front of a DuplexBackend,
// a body whose end it sends only once the answer has started, three times
// (fresh and kept-alive connections), and fails t unless every answer
// starts while the body is still open and ends with the backend having
// got every byte. hdr is set on each request.
//
// A proxy that serves rp.ServeHTTP directly fails: its server stops to
// drain the request body before it sends the answer's headers, so the
// answer does not start (and the drained bytes never reach the backend).
func CheckDuplex(t testing.TB, client *http.Client, url string, hdr http.Header) {
	t.Helper()
	rest := strings.Repeat("x", 100<<10) // below the HTTP/1 server's 256 KiB drain limit
	for i := range 3 {
		pr, pw := io.Pipe()
		req, err := http.NewRequest("POST", url, pr)
		if err != nil {
			t.Fatal(err)
		}
		req.ContentLength = int64(len("hello\n") + len(rest))
		for k, v := range hdr {
			req.Header[k] = v
		}
		type result struct {
			res *http.Response
			err error
		}
		done := make(chan result, 1)
		go func() {
			res, err := client.Do(req)
			done <- result{res, err}
		}()
		io.WriteString(pw, "hello\n")
		var res *http.Response
		select {
		case r := <-done:
			if r.err != nil {
				t.Fatalf("request %d: %v", i, r.err)
			}
			res = r.res
		case <-time.After(20 * time.Second):
			pw.CloseWithError(fmt.Errorf("test over"))
			t.Fatalf("request %d: the answer did not start while the request body was still open", i)
		}
		br := bufio.NewReader(res.Body)
		if line, err := br.ReadString('\n'); res.StatusCode != http.StatusOK || line != "started hello\n" {
			res.Body.Close()
			t.Fatalf("request %d: %d, first line %q (%v)", i, res.StatusCode, line, err)
		}
		io.WriteString(pw, rest)
		pw.Close()
		tail, err := io.ReadAll(br)
		res.Body.Close()
		if want := fmt.Sprintf("body %d <nil>\n", req.ContentLength); err != nil || string(tail) != want {
			t.Fatalf("request %d: the answer ended with %q (%v), want %q", i, tail, err, want)
		}
	}
}
