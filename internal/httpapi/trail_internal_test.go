package httpapi

import (
	"bytes"
	"io"
	"mime/multipart"
	"net/http"
	"strings"
	"testing"

	"github.com/moat-sandbox/moat/internal/execd/wire"
)

// The outcome is found however the stream is cut into writes, and output
// that looks like an event (inside a stdout line, JSON-escaped) is not.
func TestStreamScanOutcome(t *testing.T) {
	var stream []byte
	stream = wire.AppendEvent(stream, wire.Event{Type: wire.EvInit, Text: "cmd-7"})
	stream = wire.AppendEvent(stream, wire.Event{Type: wire.EvStdout, Text: `{"type":"error","error":{"ename":"CommandExecError","evalue":"9"}}` + "\n\n"})
	stream = wire.AppendEvent(stream, wire.Event{Type: wire.EvStdout, Text: strings.Repeat("x", 10000)})
	failed := wire.AppendEvent(bytes.Clone(stream), wire.Event{Type: wire.EvError, Error: &wire.EventError{EName: "CommandExecError", EValue: "3"}})
	ok := wire.AppendEvent(bytes.Clone(stream), wire.Event{Type: wire.EvExecutionComplete})
	notStarted := wire.AppendEvent(nil, wire.Event{Type: wire.EvError, Error: &wire.EventError{EName: "StartError", EValue: "no such file"}})
	for _, chunk := range []int{1, 2, 7, 100, 1 << 20} {
		for name, tc := range map[string]struct {
			b    []byte
			exit int
			err  string
		}{"failed": {failed, 3, ""}, "ok": {ok, 0, ""}, "not started": {notStarted, -1, "StartError: no such file"}} {
			var s streamScan
			for b := tc.b; len(b) > 0; {
				n := min(chunk, len(b))
				s.feed(b[:n])
				b = b[n:]
			}
			got := -1
			if s.exit != nil {
				got = *s.exit
			}
			if got != tc.exit || s.err != tc.err {
				t.Fatalf("%s in chunks of %d: exit %d err %q, want %d %q", name, chunk, got, s.err, tc.exit, tc.err)
			}
			if name != "not started" && s.id != "cmd-7" {
				t.Fatalf("%s in chunks of %d: id %q", name, chunk, s.id)
			}
		}
	}
}

// An upload's paths and sizes are read as the body streams through, and
// the body reaches the agent unchanged.
func TestUploadScan(t *testing.T) {
	var body bytes.Buffer
	mw := multipart.NewWriter(&body)
	for _, f := range []struct{ path, data string }{{"/a.txt", "hello"}, {"/b.bin", strings.Repeat("z", 100000)}} {
		p, _ := mw.CreateFormFile("metadata", "metadata")
		io.WriteString(p, `{"path":"`+f.path+`"}`)
		p, _ = mw.CreateFormFile("file", "file")
		io.WriteString(p, f.data)
	}
	mw.Close()
	want := body.String()
	r, _ := http.NewRequest("POST", "/files/upload", &body)
	r.Header.Set("Content-Type", mw.FormDataContentType())
	u := newUploadScan(r)
	got, _ := io.ReadAll(r.Body)
	if string(got) != want {
		t.Fatal("the upload body changed on its way")
	}
	files := u.wait()
	if len(files) != 2 || files[0].Path != "/a.txt" || *files[0].Size != 5 || files[1].Path != "/b.bin" || *files[1].Size != 100000 {
		t.Fatalf("files %+v", files)
	}
	// A body cut short (the client went away) still ends the scan.
	r, _ = http.NewRequest("POST", "/files/upload", strings.NewReader(want[:200]))
	r.Header.Set("Content-Type", mw.FormDataContentType())
	u = newUploadScan(r)
	io.ReadAll(r.Body)
	u.wait()
}
