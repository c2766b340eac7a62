package envd_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/internal/execd/envd"
	"github.com/moat-sandbox/moat/internal/execd/envd/gen/filesystem/filesystemconnect"
	"github.com/moat-sandbox/moat/internal/execd/envd/gen/process/processconnect"
	"github.com/moat-sandbox/moat/internal/execd/proc"
)

// fuzzProcedures are the RPCs FuzzConnectFraming calls: only those that
// neither start, signal nor change anything, whatever the body says.
var fuzzProcedures = []string{
	processconnect.ProcessListProcedure,
	processconnect.ProcessConnectProcedure, // server stream
	filesystemconnect.FilesystemStatProcedure,
	filesystemconnect.FilesystemListDirProcedure,
	filesystemconnect.FilesystemGetWatcherEventsProcedure,
}

// fuzzContentTypes are the Connect codecs and framings: unary JSON and
// proto, the streaming envelope of both, and one no codec takes.
var fuzzContentTypes = []string{"application/json", "application/proto", "application/connect+json", "application/connect+proto", "text/plain"}

// envelope frames msg as one Connect streaming message.
func envelope(flags byte, msg []byte) []byte {
	b := []byte{flags, 0, 0, 0, 0}
	binary.BigEndian.PutUint32(b[1:], uint32(len(msg)))
	return append(b, msg...)
}

// FuzzConnectFraming sends arbitrary bodies, in every codec and framing,
// to envd's read-only RPCs: no panic, and no answer is a server error
// (HTTP 5xx, a unary Connect "internal" or any "unknown").
func FuzzConnectFraming(f *testing.F) {
	f.Add(uint8(0), uint8(0), []byte(`{}`))
	f.Add(uint8(1), uint8(2), envelope(0, []byte(`{"process":{"pid":4242}}`)))
	f.Add(uint8(2), uint8(0), []byte(`{"path":"/"}`))
	f.Add(uint8(3), uint8(0), []byte(`{"path":"/proc/self","depth":2}`))
	f.Add(uint8(3), uint8(1), []byte{0x0a, 0x01, '/'})
	f.Add(uint8(1), uint8(3), envelope(0, []byte{0x0a, 0x02, 0x08, 0x01}))
	f.Add(uint8(1), uint8(2), envelope(1, []byte(`{}`))) // compressed flag, no compressor
	f.Add(uint8(1), uint8(2), []byte{0, 0xff, 0xff, 0xff, 0xff})
	f.Add(uint8(4), uint8(0), []byte(`{"watcherId":"nope"}`))
	f.Add(uint8(2), uint8(4), []byte(`{"path":1}`))
	run, err := proc.NewRunner(proc.Options{StateDir: f.TempDir(), BaseEnv: proc.ChildEnv(os.Environ())})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		run.Close(ctx)
	})
	h := envd.New(run, envd.Options{Token: func() string { return "" }}).Handler()
	f.Fuzz(func(t *testing.T, proc, ct uint8, body []byte) {
		path := fuzzProcedures[int(proc)%len(fuzzProcedures)]
		ctype := fuzzContentTypes[int(ct)%len(fuzzContentTypes)]
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		req := httptest.NewRequestWithContext(ctx, http.MethodPost, path, bytes.NewReader(body))
		req.Header.Set("Content-Type", ctype)
		req.Header.Set("Connect-Protocol-Version", "1")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code >= 500 {
			t.Fatalf("%s (%s) %q: HTTP %d %s", path, ctype, body, rec.Code, rec.Body.Bytes())
		}
		out := rec.Body.Bytes()
		// connect-go reports every broken envelope (a bad length, a
		// compressed or end-of-stream flag from the client, trailing
		// bytes) as "internal", as gRPC does: on streams the code is the
		// library's. A unary internal or unknown code is a handler's error
		// escaping unclassified.
		streamed := strings.HasPrefix(ctype, "application/connect+")
		internal := !streamed && bytes.Contains(out, []byte(`"code":"internal"`))
		if internal || bytes.Contains(out, []byte(`"code":"unknown"`)) {
			t.Fatalf("%s (%s) %q: a server error: %s", path, ctype, body, out)
		}
	})
}
