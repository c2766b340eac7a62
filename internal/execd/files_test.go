package execd

import (
	"bytes"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"net/textproto"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/moat-sandbox/moat/internal/execd/exectest"
	"github.com/moat-sandbox/moat/internal/execd/files"
	"github.com/moat-sandbox/moat/internal/execd/wire"
)

// uploadBody builds the multipart body the Go SDK sends: per file a
// "metadata" file part (application/json) then a "file" part.
func uploadBody(t *testing.T, files map[string][]byte, mode int, metaFirst bool) (string, []byte) {
	t.Helper()
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	meta := func(p string) {
		h := textproto.MIMEHeader{}
		h.Set("Content-Disposition", `form-data; name="metadata"; filename="metadata"`)
		h.Set("Content-Type", "application/json")
		w, _ := mw.CreatePart(h)
		json.NewEncoder(w).Encode(map[string]any{"path": p, "mode": mode})
	}
	file := func(p string, data []byte) {
		w, _ := mw.CreateFormFile("file", filepath.Base(p))
		w.Write(data)
	}
	if metaFirst {
		for p := range files {
			meta(p)
		}
		for p, d := range files {
			_ = p
			file(p, d)
		}
	} else {
		for p, d := range files {
			file(p, d)
			meta(p)
		}
	}
	mw.Close()
	return mw.FormDataContentType(), buf.Bytes()
}

func (e *testEnv) upload(ct string, body []byte) (int, []byte) {
	e.t.Helper()
	resp, err := e.ts.Client().Post(e.ts.URL+"/files/upload", ct, bytes.NewReader(body))
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, data
}

func TestUploadDownloadRoundTrip(t *testing.T) {
	e := newTestEnv(t)
	dir := t.TempDir()
	data := make([]byte, 3<<20)
	rand.Read(data)
	dst := filepath.Join(dir, "a/b/c.bin")
	ct, body := uploadBody(t, map[string][]byte{dst: data}, 600, false)
	if st, b := e.upload(ct, body); st != 200 {
		t.Fatalf("upload: %d %s", st, b)
	}
	fi, err := os.Stat(dst)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("uploaded file: %v %v", fi, err)
	}
	resp := e.Do("GET", "/files/download?path="+dst, nil)
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !bytes.Equal(got, data) || resp.Header.Get("Content-Type") != "application/octet-stream" ||
		resp.Header.Get("Content-Length") != fmt.Sprint(len(data)) || !strings.Contains(resp.Header.Get("Content-Disposition"), `filename=c.bin`) {
		t.Fatalf("download: %d len %d headers %v", resp.StatusCode, len(got), resp.Header)
	}
	req, _ := http.NewRequest("GET", e.ts.URL+"/files/download?path="+dst, nil)
	req.Header.Set("Range", "bytes=10-19")
	resp, _ = e.ts.Client().Do(req)
	got, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 206 || !bytes.Equal(got, data[10:20]) || resp.Header.Get("Content-Range") != fmt.Sprintf("bytes 10-19/%d", len(data)) {
		t.Fatalf("range: %d %q %v", resp.StatusCode, got, resp.Header)
	}
	req.Header.Set("Range", fmt.Sprintf("bytes=%d-", len(data)+5))
	resp, _ = e.ts.Client().Do(req)
	resp.Body.Close()
	if resp.StatusCode != 416 {
		t.Fatalf("bad range: %d", resp.StatusCode)
	}
}

func TestUploadPairsInOrder(t *testing.T) {
	e := newTestEnv(t)
	dir := t.TempDir()
	files := map[string][]byte{filepath.Join(dir, "x"): []byte("xx"), filepath.Join(dir, "y"): []byte("yy")}
	// All metadata parts first: pairing is by order, so build it by hand.
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	order := []string{filepath.Join(dir, "x"), filepath.Join(dir, "y")}
	for _, p := range order {
		w, _ := mw.CreateFormFile("metadata", "metadata")
		json.NewEncoder(w).Encode(map[string]any{"path": p})
	}
	for _, p := range order {
		w, _ := mw.CreateFormFile("file", "f")
		w.Write(files[p])
	}
	mw.Close()
	if st, b := e.upload(mw.FormDataContentType(), buf.Bytes()); st != 200 {
		t.Fatalf("upload: %d %s", st, b)
	}
	for p, want := range files {
		if got, _ := os.ReadFile(p); !bytes.Equal(got, want) {
			t.Errorf("%s = %q", p, got)
		}
	}
	// File before metadata (spooled).
	p := filepath.Join(dir, "z")
	ct, body := uploadBody(t, map[string][]byte{p: []byte("zz")}, 0, false)
	if st, b := e.upload(ct, body); st != 200 {
		t.Fatalf("upload: %d %s", st, b)
	}
	if got, _ := os.ReadFile(p); string(got) != "zz" {
		t.Fatalf("z = %q", got)
	}
}

func TestUploadErrors(t *testing.T) {
	e := newTestEnv(t)
	st, b := e.upload("application/json", []byte("{}"))
	exectest.WantError(t, st, b, 400, wire.CodeInvalidFile)
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	w, _ := mw.CreateFormFile("metadata", "metadata")
	w.Write([]byte("not json"))
	mw.Close()
	st, b = e.upload(mw.FormDataContentType(), buf.Bytes())
	exectest.WantError(t, st, b, 400, wire.CodeInvalidFileMetadata)
	buf.Reset()
	mw = multipart.NewWriter(&buf)
	w, _ = mw.CreateFormFile("metadata", "metadata")
	w.Write([]byte(`{"path":"/tmp/never"}`))
	mw.Close()
	st, b = e.upload(mw.FormDataContentType(), buf.Bytes())
	exectest.WantError(t, st, b, 400, wire.CodeInvalidFile)
}

func TestFileOperations(t *testing.T) {
	e := newTestEnv(t)
	dir := t.TempDir()
	f := filepath.Join(dir, "f.txt")
	writeFile(f, "hello world hello")

	st, b := e.Call("GET", "/files/info?path="+f, nil)
	var infos map[string]files.FileInfo
	json.Unmarshal(b, &infos)
	if st != 200 || infos[f].Type != "file" || infos[f].Size != 17 || infos[f].Mode != 644 || infos[f].Owner == "" {
		t.Fatalf("info: %d %s", st, b)
	}
	for _, key := range []string{"path", "type", "size", "modified_at", "created_at", "owner", "group", "mode"} {
		if !bytes.Contains(b, []byte(`"`+key+`":`)) {
			t.Errorf("files.FileInfo lacks %q: %s", key, b)
		}
	}
	st, b = e.Call("GET", "/files/info?path="+dir+"/missing", nil)
	exectest.WantError(t, st, b, 404, wire.CodeFileNotFound)

	if st, b = e.Call("POST", "/files/permissions", map[string]any{f: map[string]any{"mode": 600}}); st != 200 {
		t.Fatalf("chmod: %d %s", st, b)
	}
	if fi, _ := os.Stat(f); fi.Mode().Perm() != 0o600 {
		t.Fatalf("mode = %v", fi.Mode())
	}

	st, b = e.Call("POST", "/files/replace?verbose=true", map[string]any{f: map[string]string{"old": "hello", "new": "bye"}})
	if st != 200 || string(bytes.TrimSpace(b)) != fmt.Sprintf(`{"%s":{"replacedCount":2}}`, f) {
		t.Fatalf("replace: %d %s", st, b)
	}
	if got, _ := os.ReadFile(f); string(got) != "bye world bye" {
		t.Fatalf("replaced = %q", got)
	}
	if fi, _ := os.Stat(f); fi.Mode().Perm() != 0o600 {
		t.Fatal("replace changed the mode")
	}
	st, b = e.Call("POST", "/files/replace", map[string]any{f: map[string]string{"old": "", "new": "x"}})
	exectest.WantError(t, st, b, 400, wire.CodeInvalidRequestBody)

	g := filepath.Join(dir, "sub/g.txt")
	if st, b = e.Call("POST", "/files/mv", []map[string]string{{"src": f, "dest": g}}); st != 200 {
		t.Fatalf("mv: %d %s", st, b)
	}
	if !fileExists(g) || fileExists(f) {
		t.Fatal("mv did not move")
	}
	st, b = e.Call("POST", "/files/mv", []map[string]string{{"src": f, "dest": g}})
	exectest.WantError(t, st, b, 404, wire.CodeFileNotFound)

	if st, b = e.Call("POST", "/directories", map[string]any{dir + "/d1/d2": map[string]any{"mode": 700}}); st != 200 {
		t.Fatalf("mkdir: %d %s", st, b)
	}
	if fi, err := os.Stat(dir + "/d1/d2"); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("mkdir result: %v %v", fi, err)
	}
	writeFile(dir+"/d1/d2/deep.py", "x")
	os.Symlink(dir+"/sub", dir+"/link")

	st, b = e.Call("GET", "/files/search?path="+dir+"&pattern=*.txt", nil)
	var found []files.FileInfo
	json.Unmarshal(b, &found)
	if st != 200 || len(found) != 1 || found[0].Path != g {
		t.Fatalf("search: %d %s", st, b)
	}
	st, b = e.Call("GET", "/files/search?path="+dir, nil)
	json.Unmarshal(b, &found)
	if st != 200 || len(found) != 2 {
		t.Fatalf("search **: %s", b)
	}
	st, b = e.Call("GET", "/files/search", nil)
	exectest.WantError(t, st, b, 400, wire.CodeMissingQuery)

	st, b = e.Call("GET", "/directories/list?path="+dir, nil)
	var list []files.FileInfo
	json.Unmarshal(b, &list)
	var names []string
	for _, fi := range list {
		names = append(names, filepath.Base(fi.Path)+":"+fi.Type)
	}
	if st != 200 || strings.Join(names, ",") != "d1:directory,link:symlink,sub:directory" {
		t.Fatalf("list: %d %v", st, names)
	}
	st, b = e.Call("GET", "/directories/list?path="+dir+"&depth=3", nil)
	json.Unmarshal(b, &list)
	if st != 200 || len(list) != 6 { // d1, d1/d2, d1/d2/deep.py, link, sub, sub/g.txt
		t.Fatalf("depth 3: %s", b)
	}
	st, b = e.Call("GET", "/directories/list?path="+dir+"/link", nil)
	exectest.WantError(t, st, b, 400, wire.CodeInvalidFile)

	st, b = e.Call("DELETE", "/files?path="+dir+"/d1", nil)
	exectest.WantError(t, st, b, 400, wire.CodeInvalidFile)
	if st, _ = e.Call("DELETE", "/files?path="+g, nil); st != 200 || fileExists(g) {
		t.Fatal("delete file")
	}
	if st, _ = e.Call("DELETE", "/directories?path="+dir+"/d1", nil); st != 200 || fileExists(dir+"/d1") {
		t.Fatal("delete dir")
	}
	st, b = e.Call("DELETE", "/directories", nil)
	exectest.WantError(t, st, b, 400, wire.CodeMissingQuery)
	st, b = e.Call("POST", "/directories", "{")
	exectest.WantError(t, st, b, 400, wire.CodeInvalidRequestBody)
}
