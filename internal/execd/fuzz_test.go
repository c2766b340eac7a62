package execd

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/internal/execd/command"
	"github.com/moat-sandbox/moat/internal/execd/files"
	"github.com/moat-sandbox/moat/internal/execd/wire"
)

// fuzzEnv is an agent whose file operations are confined (by the harness)
// to box, with a sentinel directory next to it that must never change.
type fuzzEnv struct {
	srv  *Server
	ts   *httptest.Server
	root string // holds box, state and outside only
	box  string
}

func newFuzzEnv(f *testing.F) *fuzzEnv {
	f.Helper()
	root := f.TempDir()
	e := &fuzzEnv{root: root, box: filepath.Join(root, "box")}
	for _, d := range []string{e.box, filepath.Join(root, "outside")} {
		if err := os.Mkdir(d, 0o755); err != nil {
			f.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(root, "outside", "sentinel"), []byte("keep"), 0o644); err != nil {
		f.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(e.box, "file"), []byte("hello"), 0o644); err != nil {
		f.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(e.box, "dir"), 0o755); err != nil {
		f.Fatal(err)
	}
	srv, err := NewServer(Options{
		BaseEnv:   []string{"PATH=/usr/bin:/bin", "HOME=" + e.box},
		StateDir:  filepath.Join(root, "state"),
		Log:       slog.New(slog.NewTextHandler(io.Discard, nil)),
		KillGrace: 200 * time.Millisecond,
	})
	if err != nil {
		f.Fatal(err)
	}
	e.srv = srv
	e.ts = httptest.NewServer(srv)
	f.Cleanup(func() {
		e.ts.CloseClientConnections()
		e.ts.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := srv.Close(ctx); err != nil {
			f.Errorf("server close: %v", err)
		}
	})
	return e
}

// inBox reports whether the agent resolves p to a path inside the box. The
// harness only sends such paths, so a change outside is an agent bug.
func (e *fuzzEnv) inBox(p string) bool {
	fp := e.srv.run.Expand(p)
	return fp == e.box || strings.HasPrefix(fp, e.box+"/")
}

func (e *fuzzEnv) do(t *testing.T, method, target, ctype string, body []byte) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, e.ts.URL+target, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	resp, err := e.ts.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, out
}

// check asserts the answer invariant (no 5xx; every error is {code,
// message}) and that nothing outside the box changed.
func (e *fuzzEnv) check(t *testing.T, what string, code int, body []byte) {
	t.Helper()
	if code >= 500 {
		t.Fatalf("%s: status %d: %s", what, code, body)
	}
	if code >= 300 {
		var eb struct{ Code, Message string }
		if err := json.Unmarshal(body, &eb); err != nil || eb.Code == "" || eb.Message == "" {
			t.Fatalf("%s: status %d without an error envelope: %q", what, code, body)
		}
	}
	ents, err := os.ReadDir(e.root)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, d := range ents {
		names = append(names, d.Name())
	}
	if !slices.Equal(names, []string{"box", "outside", "state"}) {
		t.Fatalf("%s: the agent touched %s: %v", what, e.root, names)
	}
	out, err := os.ReadDir(filepath.Join(e.root, "outside"))
	data, _ := os.ReadFile(filepath.Join(e.root, "outside", "sentinel"))
	if err != nil || len(out) != 1 || string(data) != "keep" {
		t.Fatalf("%s: the agent touched the sentinel directory", what)
	}
}

// harmless are the only commands the command fuzzer lets the agent run.
var harmless = []string{"true", "echo hi", "pwd", "exit 3", "printf x >&2"}

// FuzzCommandBody fuzzes POST /command bodies. The harness decodes each
// body exactly as the agent does and skips any that would run something
// other than a harmless command or in a directory outside the box.
func FuzzCommandBody(f *testing.F) {
	for _, s := range []string{
		`{"command":"true"}`, `{"command":"echo hi","cwd":"BOX","envs":{"A":"1"}}`, `{"command":"pwd","background":true}`,
		`{"command":"exit 3","timeout":1}`, `{"command":"true","timeout":-1}`, `{"command":"true","uid":0,"gid":0}`,
		`{"command":"true","gid":1}`, `{"command":""}`, `{"command":"true","cwd":"BOX/missing"}`, `{"command":"true","cwd":"BOX/file"}`,
		`{"command":"printf x >&2","envs":{"":"x","A=B":"c"}}`, `{"command":1}`, `[]`, `null`, ``, `{"command":"true"} trailing`,
	} {
		f.Add([]byte(s))
	}
	e := newFuzzEnv(f)
	f.Fuzz(func(t *testing.T, body []byte) {
		body = bytes.ReplaceAll(body, []byte("BOX"), []byte(e.box))
		var req command.RunRequest
		probe, _ := http.NewRequest("POST", "/", bytes.NewReader(body))
		if wire.DecodeBody(probe, &req, false) == nil {
			if !slices.Contains(harmless, req.Command) && req.Command != "" {
				return
			}
			if req.Cwd != "" && !e.inBox(req.Cwd) {
				return
			}
		}
		code, out := e.do(t, "POST", "/command", "application/json", body)
		e.check(t, "POST /command "+string(body), code, out)
	})
}

// FuzzFilePaths fuzzes the path (and depth) of GET /files/info and GET
// /directories/list, for paths inside the box.
func FuzzFilePaths(f *testing.F) {
	for _, s := range []string{"", "file", "dir", "missing", "file/x", "dir/../file", "~/file", "$HOME/dir", "${HOME}", "a b/%", ".", "..x"} {
		f.Add(s, "1", false)
		f.Add(s, "", true)
	}
	f.Add("dir", "0", false)
	f.Add("dir", "x", false)
	f.Add("dir", "99999999999999999999", false)
	e := newFuzzEnv(f)
	f.Fuzz(func(t *testing.T, p, depth string, list bool) {
		full := e.box + "/" + p
		if strings.HasPrefix(p, "~") || strings.HasPrefix(p, "$") {
			full = p // exercise expansion; HOME is the box
		}
		if !e.inBox(full) {
			return
		}
		q := url.Values{"path": {full}}
		target := "/files/info?"
		if list {
			target = "/directories/list?"
			if depth != "" {
				q.Set("depth", depth)
			}
		}
		code, out := e.do(t, "GET", target+q.Encode(), "", nil)
		e.check(t, fmt.Sprintf("GET %s %q", target, full), code, out)
	})
}

// FuzzUpload fuzzes POST /files/upload: the metadata parts, the file
// content, the part order, and raw trailing bytes after the parts.
func FuzzUpload(f *testing.F) {
	f.Add(`{"path":"BOX/up.txt","mode":644}`, []byte("data"), `{"path":"BOX/sub/two","mode":600}`, uint8(0), []byte{})
	f.Add(`{"path":"BOX/up.txt"}`, []byte("data"), ``, uint8(1), []byte{})
	f.Add(`{"path":""}`, []byte("x"), `{"path":"BOX/a"}`, uint8(2), []byte("--junk"))
	f.Add(`{"path":"BOX/m","mode":999}`, []byte{}, `not json`, uint8(3), []byte{})
	f.Add(`{"path":"BOX/file/below"}`, []byte("x"), ``, uint8(0), []byte{})
	f.Add(`{"path":"BOX/dir"}`, []byte("x"), ``, uint8(0), []byte{})
	f.Add(`{"path":"BOX/o","owner":"nobody","group":"nogroup"}`, []byte("x"), `{"path":"BOX/p","owner":"no-such-user"}`, uint8(0), []byte{})
	e := newFuzzEnv(f)
	f.Fuzz(func(t *testing.T, meta1 string, content []byte, meta2 string, order uint8, tail []byte) {
		meta1 = strings.ReplaceAll(meta1, "BOX", e.box)
		meta2 = strings.ReplaceAll(meta2, "BOX", e.box)
		for _, m := range []string{meta1, meta2} {
			var fm files.Metadata
			if json.NewDecoder(io.LimitReader(strings.NewReader(m), 1<<20)).Decode(&fm) == nil && fm.Path != "" && !e.inBox(fm.Path) {
				return
			}
		}
		var buf bytes.Buffer
		mw := multipart.NewWriter(&buf)
		part := func(name, data string) {
			w, err := mw.CreateFormFile(name, name)
			if err != nil {
				t.Fatal(err)
			}
			io.WriteString(w, data)
		}
		// order picks the part sequence: meta-first, file-first, unpaired.
		switch order % 4 {
		case 0:
			part("metadata", meta1)
			part("file", string(content))
			if meta2 != "" {
				part("metadata", meta2)
				part("file", string(content))
			}
		case 1:
			part("file", string(content))
			part("metadata", meta1)
		case 2:
			part("metadata", meta1)
			part("metadata", meta2)
			part("file", string(content))
		case 3:
			part("file", string(content))
		}
		mw.Close()
		buf.Write(tail)
		code, out := e.do(t, "POST", "/files/upload", mw.FormDataContentType(), buf.Bytes())
		e.check(t, "POST /files/upload "+meta1+" "+meta2, code, out)
	})
}
