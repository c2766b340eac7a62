package envd_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/base64"
	"io"
	"mime/multipart"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/moat-sandbox/moat/internal/agentproto"
	"github.com/moat-sandbox/moat/internal/execd/envd"
	fspb "github.com/moat-sandbox/moat/internal/execd/envd/gen/filesystem"
)

func itoa[T ~int | ~uint32 | ~int64](n T) string { return strconv.FormatInt(int64(n), 10) }

func basic(user string) string {
	return "Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"))
}

func readAll(t *testing.T, resp *http.Response) string {
	t.Helper()
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestFilesystemRPCs(t *testing.T) {
	e := newEnv(t, envOpts{})
	ctx := ctxT(t, 30*time.Second)
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "f.txt"), []byte("12345"), 0o644)
	os.Chmod(filepath.Join(dir, "f.txt"), 0o644)
	os.Symlink("f.txt", filepath.Join(dir, "link"))
	os.Symlink("nowhere", filepath.Join(dir, "dangling"))

	st, err := e.fs.Stat(ctx, connect.NewRequest(&fspb.StatRequest{Path: filepath.Join(dir, "f.txt")}))
	if err != nil {
		t.Fatal(err)
	}
	en := st.Msg.GetEntry()
	if en.GetName() != "f.txt" || en.GetType() != fspb.FileType_FILE_TYPE_FILE || en.GetSize() != 5 || en.GetMode() != 0o644 ||
		en.GetPermissions() != "-rw-r--r--" || en.GetOwner() != "root" && os.Getuid() == 0 || en.GetModifiedTime() == nil || en.SymlinkTarget != nil {
		t.Fatalf("stat file: %v", en)
	}
	st, err = e.fs.Stat(ctx, connect.NewRequest(&fspb.StatRequest{Path: filepath.Join(dir, "link")}))
	if err != nil {
		t.Fatal(err)
	}
	if en := st.Msg.GetEntry(); en.GetType() != fspb.FileType_FILE_TYPE_FILE || en.GetSymlinkTarget() != filepath.Join(dir, "f.txt") || !strings.HasPrefix(en.GetPermissions(), "L") {
		t.Fatalf("stat symlink: %v", en)
	}
	st, err = e.fs.Stat(ctx, connect.NewRequest(&fspb.StatRequest{Path: filepath.Join(dir, "dangling")}))
	if err != nil || st.Msg.GetEntry().GetType() != fspb.FileType_FILE_TYPE_UNSPECIFIED {
		t.Fatalf("stat dangling symlink: %v %v", st, err)
	}
	_, err = e.fs.Stat(ctx, connect.NewRequest(&fspb.StatRequest{Path: filepath.Join(dir, "missing")}))
	wantCode(t, err, connect.CodeNotFound)
	_, err = e.fs.Stat(ctx, connect.NewRequest(&fspb.StatRequest{Path: "~someone/x"}))
	wantCode(t, err, connect.CodeInvalidArgument)

	// MakeDir: mkdir -p, then already_exists; a file in the way is invalid.
	md, err := e.fs.MakeDir(ctx, connect.NewRequest(&fspb.MakeDirRequest{Path: filepath.Join(dir, "a/b")}))
	if err != nil || md.Msg.GetEntry().GetType() != fspb.FileType_FILE_TYPE_DIRECTORY || md.Msg.GetEntry().GetPath() != filepath.Join(dir, "a/b") {
		t.Fatalf("makedir: %v %v", md, err)
	}
	_, err = e.fs.MakeDir(ctx, connect.NewRequest(&fspb.MakeDirRequest{Path: filepath.Join(dir, "a/b")}))
	wantCode(t, err, connect.CodeAlreadyExists)
	_, err = e.fs.MakeDir(ctx, connect.NewRequest(&fspb.MakeDirRequest{Path: filepath.Join(dir, "f.txt")}))
	wantCode(t, err, connect.CodeInvalidArgument)
	os.WriteFile(filepath.Join(dir, "a/b/c.txt"), nil, 0o644)

	// ListDir: lexical, to depth.
	names := func(depth uint32) []string {
		t.Helper()
		l, err := e.fs.ListDir(ctx, connect.NewRequest(&fspb.ListDirRequest{Path: dir, Depth: depth}))
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, en := range l.Msg.GetEntries() {
			rel, _ := filepath.Rel(dir, en.GetPath())
			out = append(out, rel)
		}
		return out
	}
	if got := names(0); !slices.Equal(got, []string{"a", "dangling", "f.txt", "link"}) {
		t.Fatalf("list depth 0: %v", got)
	}
	if got := names(2); !slices.Equal(got, []string{"a", "a/b", "dangling", "f.txt", "link"}) {
		t.Fatalf("list depth 2: %v", got)
	}
	if got := names(3); !slices.Contains(got, "a/b/c.txt") {
		t.Fatalf("list depth 3: %v", got)
	}
	_, err = e.fs.ListDir(ctx, connect.NewRequest(&fspb.ListDirRequest{Path: filepath.Join(dir, "f.txt")}))
	wantCode(t, err, connect.CodeInvalidArgument)
	_, err = e.fs.ListDir(ctx, connect.NewRequest(&fspb.ListDirRequest{Path: filepath.Join(dir, "missing")}))
	wantCode(t, err, connect.CodeNotFound)

	// Move creates the destination's parents.
	mv, err := e.fs.Move(ctx, connect.NewRequest(&fspb.MoveRequest{Source: filepath.Join(dir, "f.txt"), Destination: filepath.Join(dir, "x/y/g.txt")}))
	if err != nil || mv.Msg.GetEntry().GetPath() != filepath.Join(dir, "x/y/g.txt") || mv.Msg.GetEntry().GetSize() != 5 {
		t.Fatalf("move: %v %v", mv, err)
	}
	_, err = e.fs.Move(ctx, connect.NewRequest(&fspb.MoveRequest{Source: filepath.Join(dir, "f.txt"), Destination: filepath.Join(dir, "z")}))
	wantCode(t, err, connect.CodeNotFound)

	// Remove is rm -rf; a missing path is fine.
	for _, p := range []string{filepath.Join(dir, "a"), filepath.Join(dir, "a")} {
		if _, err := e.fs.Remove(ctx, connect.NewRequest(&fspb.RemoveRequest{Path: p})); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "a")); !os.IsNotExist(err) {
		t.Fatalf("a still exists: %v", err)
	}
}

// watchEvent is a simplified event for comparison.
type watchEvent struct {
	name string
	typ  fspb.EventType
}

func TestWatchDir(t *testing.T) {
	e := newEnv(t, envOpts{})
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := e.fs.WatchDir(ctx, connect.NewRequest(&fspb.WatchDirRequest{Path: dir, Recursive: true, IncludeEntry: true}))
	if err != nil {
		t.Fatal(err)
	}
	if !s.Receive() || s.Msg().GetStart() == nil {
		t.Fatalf("first event %v, %v", s.Msg(), s.Err())
	}
	got := make(chan *fspb.FilesystemEvent, 100)
	go func() {
		for s.Receive() {
			if ev := s.Msg().GetFilesystem(); ev != nil {
				got <- ev
			}
		}
		close(got)
	}()
	wait := func(want watchEvent) *fspb.FilesystemEvent {
		t.Helper()
		for {
			select {
			case ev, ok := <-got:
				if !ok {
					t.Fatalf("stream ended waiting for %v: %v", want, s.Err())
				}
				if ev.GetName() == want.name && ev.GetType() == want.typ {
					return ev
				}
			case <-time.After(20 * time.Second):
				t.Fatalf("no %v event", want)
			}
		}
	}
	os.WriteFile(filepath.Join(dir, "a.txt"), []byte("x"), 0o644)
	ev := wait(watchEvent{"a.txt", fspb.EventType_EVENT_TYPE_CREATE})
	if ev.GetEntry().GetPath() != filepath.Join(dir, "a.txt") {
		t.Fatalf("create event entry %v", ev.GetEntry())
	}
	wait(watchEvent{"a.txt", fspb.EventType_EVENT_TYPE_WRITE})
	os.Mkdir(filepath.Join(dir, "sub"), 0o755)
	wait(watchEvent{"sub", fspb.EventType_EVENT_TYPE_CREATE})
	// The new directory is watched too.
	eventually(t, "an event from the new subdirectory", func() bool {
		os.WriteFile(filepath.Join(dir, "sub", "b.txt"), []byte("y"), 0o644)
		select {
		case ev := <-got:
			return ev.GetName() == "sub/b.txt"
		case <-time.After(200 * time.Millisecond):
			return false
		}
	})
	os.Chmod(filepath.Join(dir, "a.txt"), 0o600)
	wait(watchEvent{"a.txt", fspb.EventType_EVENT_TYPE_CHMOD})
	os.Rename(filepath.Join(dir, "a.txt"), filepath.Join(dir, "c.txt"))
	wait(watchEvent{"a.txt", fspb.EventType_EVENT_TYPE_RENAME})
	wait(watchEvent{"c.txt", fspb.EventType_EVENT_TYPE_CREATE})
	os.Remove(filepath.Join(dir, "c.txt"))
	if ev := wait(watchEvent{"c.txt", fspb.EventType_EVENT_TYPE_REMOVE}); ev.Entry != nil {
		t.Fatalf("remove event with an entry: %v", ev)
	}
	cancel()
	for range got {
	}

	// Errors come before any event.
	for path, want := range map[string]connect.Code{filepath.Join(dir, "missing"): connect.CodeNotFound, filepath.Join(dir, "sub", "b.txt"): connect.CodeInvalidArgument} {
		s, err := e.fs.WatchDir(ctxT(t, 10*time.Second), connect.NewRequest(&fspb.WatchDirRequest{Path: path}))
		if err == nil {
			for s.Receive() {
				t.Fatalf("%s: got an event %v", path, s.Msg())
			}
			err = s.Err()
		}
		wantCode(t, err, want)
	}
}

func TestPolledWatcher(t *testing.T) {
	e := newEnv(t, envOpts{})
	ctx := ctxT(t, 30*time.Second)
	dir := t.TempDir()
	cw, err := e.fs.CreateWatcher(ctx, connect.NewRequest(&fspb.CreateWatcherRequest{Path: dir}))
	if err != nil {
		t.Fatal(err)
	}
	id := cw.Msg.GetWatcherId()
	os.WriteFile(filepath.Join(dir, "p.txt"), nil, 0o644)
	var seen []string
	eventually(t, "the polled create event", func() bool {
		r, err := e.fs.GetWatcherEvents(ctx, connect.NewRequest(&fspb.GetWatcherEventsRequest{WatcherId: id}))
		if err != nil {
			t.Fatal(err)
		}
		for _, ev := range r.Msg.GetEvents() {
			seen = append(seen, ev.GetName()+":"+ev.GetType().String())
		}
		return slices.Contains(seen, "p.txt:EVENT_TYPE_CREATE")
	})
	// Drained: nothing new without a change.
	r, err := e.fs.GetWatcherEvents(ctx, connect.NewRequest(&fspb.GetWatcherEventsRequest{WatcherId: id}))
	if err != nil || len(r.Msg.GetEvents()) != 0 {
		t.Fatalf("second poll: %v %v", r, err)
	}
	if _, err := e.fs.RemoveWatcher(ctx, connect.NewRequest(&fspb.RemoveWatcherRequest{WatcherId: id})); err != nil {
		t.Fatal(err)
	}
	_, err = e.fs.GetWatcherEvents(ctx, connect.NewRequest(&fspb.GetWatcherEventsRequest{WatcherId: id}))
	wantCode(t, err, connect.CodeNotFound)
	_, err = e.fs.RemoveWatcher(ctx, connect.NewRequest(&fspb.RemoveWatcherRequest{WatcherId: id}))
	wantCode(t, err, connect.CodeNotFound)
}

// filesURL is /files with query parameters.
func (e *env) filesURL(q url.Values) string { return e.url + "/files?" + q.Encode() }

func (e *env) do(t *testing.T, req *http.Request) (*http.Response, string) {
	t.Helper()
	resp, err := e.http.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp, readAll(t, resp)
}

func multipartBody(t *testing.T, files map[string]string, order []string) (string, *bytes.Buffer) {
	t.Helper()
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	for _, name := range order {
		h := make(map[string][]string)
		h["Content-Disposition"] = []string{`form-data; name="file"; filename="` + name + `"`}
		h["Content-Type"] = []string{"application/octet-stream"}
		w, _ := mw.CreatePart(h)
		io.WriteString(w, files[name])
	}
	fw, _ := mw.CreateFormField("other")
	io.WriteString(fw, "ignored")
	mw.Close()
	return mw.FormDataContentType(), &buf
}

func TestFilesUploadDownload(t *testing.T) {
	e := newEnv(t, envOpts{})
	dir := t.TempDir()

	// Multipart, one file to ?path=.
	ct, body := multipartBody(t, map[string]string{"ignored-name": "hello"}, []string{"ignored-name"})
	req, _ := http.NewRequest("POST", e.filesURL(url.Values{"path": {filepath.Join(dir, "hello.txt")}}), body)
	req.Header.Set("Content-Type", ct)
	resp, got := e.do(t, req)
	want := `[{"name":"hello.txt","path":"` + filepath.Join(dir, "hello.txt") + `","type":"file"}]` + "\n"
	if resp.StatusCode != 200 || got != want {
		t.Fatalf("upload: %d %s, want %s", resp.StatusCode, got, want)
	}
	if st, err := os.Stat(filepath.Join(dir, "hello.txt")); err != nil || st.Mode().Perm() != 0o644 {
		t.Fatalf("uploaded file: %v %v", st, err)
	}

	// Multipart, several files, each to its part's full filename.
	ct, body = multipartBody(t, map[string]string{filepath.Join(dir, "m/1.txt"): "one", filepath.Join(dir, "m/n/2.txt"): "two"}, []string{filepath.Join(dir, "m/1.txt"), filepath.Join(dir, "m/n/2.txt")})
	req, _ = http.NewRequest("POST", e.url+"/files", body)
	req.Header.Set("Content-Type", ct)
	resp, got = e.do(t, req)
	if resp.StatusCode != 200 || !strings.Contains(got, `"path":"`+filepath.Join(dir, "m/n/2.txt")+`"`) || strings.Index(got, "1.txt") > strings.Index(got, "2.txt") {
		t.Fatalf("multi-file upload: %d %s", resp.StatusCode, got)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "m/n/2.txt")); string(b) != "two" {
		t.Fatalf("2.txt = %q", b)
	}

	// Raw body, gzipped, with metadata.
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	io.WriteString(zw, "raw bytes")
	zw.Close()
	req, _ = http.NewRequest("POST", e.filesURL(url.Values{"path": {filepath.Join(dir, "raw.bin")}}), &gz)
	req.Header.Set("Content-Type", "application/octet-stream")
	req.Header.Set("Content-Encoding", "gzip")
	req.Header.Set("X-Metadata-Owner-Team", "ml")
	resp, got = e.do(t, req)
	if resp.StatusCode != 200 || got != `[{"name":"raw.bin","path":"`+filepath.Join(dir, "raw.bin")+`","type":"file","metadata":{"owner-team":"ml"}}]`+"\n" {
		t.Fatalf("raw upload: %d %s", resp.StatusCode, got)
	}
	st, err := e.fs.Stat(ctxT(t, 10*time.Second), connect.NewRequest(&fspb.StatRequest{Path: filepath.Join(dir, "raw.bin")}))
	if err != nil || st.Msg.GetEntry().GetMetadata()["owner-team"] != "ml" {
		t.Fatalf("metadata after upload: %v %v", st, err)
	}
	req, _ = http.NewRequest("POST", e.filesURL(url.Values{"path": {filepath.Join(dir, "raw.bin")}}), strings.NewReader("x"))
	req.Header.Set("X-Metadata-Bad", "caf\u00e9")
	if resp, _ := e.do(t, req); resp.StatusCode != 400 {
		t.Fatalf("non-ASCII metadata: %d", resp.StatusCode)
	}

	// Download: plain, gzipped, ranged.
	resp, got = e.do(t, mustReq(t, "GET", e.filesURL(url.Values{"path": {filepath.Join(dir, "raw.bin")}})))
	if resp.StatusCode != 200 || got != "raw bytes" || resp.Header.Get("Content-Disposition") != `inline; filename=raw.bin` {
		t.Fatalf("download: %d %q %v", resp.StatusCode, got, resp.Header)
	}
	req = mustReq(t, "GET", e.filesURL(url.Values{"path": {filepath.Join(dir, "raw.bin")}}))
	req.Header.Set("Accept-Encoding", "gzip")
	resp, got = e.do(t, req)
	if resp.StatusCode != 200 || resp.Header.Get("Content-Encoding") != "gzip" {
		t.Fatalf("gzip download: %d %v", resp.StatusCode, resp.Header)
	}
	zr, err := gzip.NewReader(strings.NewReader(got))
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := io.ReadAll(zr); string(b) != "raw bytes" {
		t.Fatalf("gunzipped %q", b)
	}
	req = mustReq(t, "GET", e.filesURL(url.Values{"path": {filepath.Join(dir, "raw.bin")}}))
	req.Header.Set("Range", "bytes=4-")
	if resp, got := e.do(t, req); resp.StatusCode != 206 || got != "bytes" {
		t.Fatalf("range: %d %q", resp.StatusCode, got)
	}
	req = mustReq(t, "GET", e.filesURL(url.Values{"path": {filepath.Join(dir, "raw.bin")}}))
	req.Header.Set("Accept-Encoding", "br, identity;q=0")
	if resp, _ := e.do(t, req); resp.StatusCode != 406 {
		t.Fatalf("unacceptable encoding: %d", resp.StatusCode)
	}
	missing := filepath.Join(dir, "nope")
	resp, got = e.do(t, mustReq(t, "GET", e.filesURL(url.Values{"path": {missing}})))
	if resp.StatusCode != 404 || got != `{"code":404,"message":"path '`+missing+`' does not exist"}` {
		t.Fatalf("missing: %d %s", resp.StatusCode, got)
	}
	if resp, _ := e.do(t, mustReq(t, "GET", e.filesURL(url.Values{"path": {dir}}))); resp.StatusCode != 400 {
		t.Fatalf("directory download: %d", resp.StatusCode)
	}
	if resp, _ := e.do(t, mustReq(t, "GET", e.filesURL(url.Values{"path": {"x"}, "username": {"no-such-user-xyz"}}))); resp.StatusCode != 401 {
		t.Fatalf("unknown user: %d", resp.StatusCode)
	}
}

func mustReq(t *testing.T, method, u string) *http.Request {
	t.Helper()
	req, err := http.NewRequest(method, u, nil)
	if err != nil {
		t.Fatal(err)
	}
	return req
}

func TestSignedURLs(t *testing.T) {
	const token = "tok-0123456789abcdef"
	e := newEnv(t, envOpts{token: token})
	dir := t.TempDir()
	p := filepath.Join(dir, "s.txt")
	os.WriteFile(p, []byte("signed"), 0o644)
	get := func(q url.Values, hdr string) (int, string) {
		req := mustReq(t, "GET", e.filesURL(q))
		if hdr != "" {
			req.Header.Set(agentproto.EnvdTokenHeader, hdr)
		}
		resp, body := e.do(t, req)
		return resp.StatusCode, body
	}
	if code, body := get(url.Values{"path": {p}}, ""); code != 401 || body != `{"code":401,"message":"missing signature query parameter"}` {
		t.Fatalf("unsigned: %d %s", code, body)
	}
	if code, body := get(url.Values{"path": {p}}, token); code != 200 || body != "signed" {
		t.Fatalf("with the token: %d %s", code, body)
	}
	if code, _ := get(url.Values{"path": {p}}, "wrong"); code != 401 {
		t.Fatalf("wrong token: %d", code)
	}
	sig := envd.Signature(p, "read", "", token, 0)
	if code, body := get(url.Values{"path": {p}, "signature": {sig}}, ""); code != 200 || body != "signed" {
		t.Fatalf("signed: %d %s", code, body)
	}
	// The signature binds the operation, the path and the user.
	if code, body := get(url.Values{"path": {p}, "signature": {envd.Signature(p, "write", "", token, 0)}}, ""); code != 401 || !strings.Contains(body, "invalid signature") {
		t.Fatalf("write signature on a read: %d %s", code, body)
	}
	if code, _ := get(url.Values{"path": {p}, "username": {"root"}, "signature": {sig}}, ""); code != 401 {
		t.Fatalf("signature for another user: %d", code)
	}
	future := time.Now().Add(time.Hour).Unix()
	if code, _ := get(url.Values{"path": {p}, "signature": {envd.Signature(p, "read", "", token, future)}, "signature_expiration": {itoa(future)}}, ""); code != 200 {
		t.Fatalf("unexpired: %d", code)
	}
	past := time.Now().Add(-time.Minute).Unix()
	if code, body := get(url.Values{"path": {p}, "signature": {envd.Signature(p, "read", "", token, past)}, "signature_expiration": {itoa(past)}}, ""); code != 401 || body != `{"code":401,"message":"signature is already expired"}` {
		t.Fatalf("expired: %d %s", code, body)
	}
	// A signed upload.
	up := filepath.Join(dir, "up.txt")
	req, _ := http.NewRequest("POST", e.filesURL(url.Values{"path": {up}, "signature": {envd.Signature(up, "write", "", token, 0)}}), strings.NewReader("new"))
	req.Header.Set("Content-Type", "application/octet-stream")
	if resp, body := e.do(t, req); resp.StatusCode != 200 {
		t.Fatalf("signed upload: %d %s", resp.StatusCode, body)
	}
	if b, _ := os.ReadFile(up); string(b) != "new" {
		t.Fatalf("up.txt = %q", b)
	}
}
