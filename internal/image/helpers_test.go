package image

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"io"
	"io/fs"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/compression"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	code := m.Run()
	if t, ok := remote.DefaultTransport.(*http.Transport); ok {
		t.CloseIdleConnections()
	}
	http.DefaultTransport.(*http.Transport).CloseIdleConnections()
	if code == 0 {
		if err := goleak.Find(goleak.IgnoreAnyFunction("net/http.(*persistConn).readLoop"),
			goleak.IgnoreAnyFunction("net/http.(*persistConn).writeLoop")); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// entry is one tar member for mkTar.
type entry struct {
	name   string
	typ    byte // tar.Type*; 0 = regular file
	body   string
	link   string
	mode   int64
	uid    int
	gid    int
	xattrs map[string]string
	major  int64
	minor  int64
}

var testTime = time.Date(2024, 5, 1, 12, 0, 0, 0, time.UTC)

func mkTar(t testing.TB, entries ...entry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Typeflag: e.typ, Linkname: e.link, Mode: e.mode, Uid: e.uid, Gid: e.gid,
			ModTime: testTime, Devmajor: e.major, Devminor: e.minor, Format: tar.FormatPAX}
		if h.Typeflag == 0 {
			h.Typeflag = tar.TypeReg
		}
		if h.Mode == 0 {
			h.Mode = 0o644
			if h.Typeflag == tar.TypeDir {
				h.Mode = 0o755
			}
		}
		if h.Typeflag == tar.TypeReg {
			h.Size = int64(len(e.body))
		}
		for k, v := range e.xattrs {
			if h.PAXRecords == nil {
				h.PAXRecords = map[string]string{}
			}
			h.PAXRecords[paxXattrPrefix+k] = v
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			io.WriteString(tw, e.body)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func layerOf(t testing.TB, data []byte, opts ...tarball.LayerOption) v1.Layer {
	t.Helper()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil }, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func buildImage(t testing.TB, env []string, layers ...v1.Layer) v1.Image {
	t.Helper()
	img, err := mutate.AppendLayers(empty.Image, layers...)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", "amd64"
	cf.Config = v1.Config{Env: env, Cmd: []string{"/bin/sh"}, WorkingDir: "/work"}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		t.Fatal(err)
	}
	return img
}

// testRegistry is go-containerregistry's registry on 127.0.0.1 behind a
// handler that counts requests and optionally enforces basic auth.
type testRegistry struct {
	host string
	srv  *httptest.Server

	mu     sync.Mutex
	counts map[string]int // "GET /v2/.../blobs/sha256:..." -> n
	user   string
	pass   string
}

func startRegistry(t testing.TB, user, pass string) *testRegistry {
	t.Helper()
	r := &testRegistry{counts: map[string]int{}, user: user, pass: pass}
	reg := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.mu.Lock()
		r.counts[req.Method+" "+req.URL.Path]++
		r.mu.Unlock()
		if r.user != "" {
			u, p, ok := req.BasicAuth()
			if !ok || u != r.user || p != r.pass {
				w.Header().Set("WWW-Authenticate", `Basic realm="test"`)
				http.Error(w, `{"errors":[{"code":"UNAUTHORIZED","message":"no"}]}`, http.StatusUnauthorized)
				return
			}
		}
		reg.ServeHTTP(w, req)
	}))
	t.Cleanup(r.srv.Close)
	r.host = strings.TrimPrefix(r.srv.URL, "http://")
	return r
}

func (r *testRegistry) push(t testing.TB, repoTag string, img v1.Image) string {
	t.Helper()
	ref := r.host + "/" + repoTag
	nr, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	auth := authn.Anonymous
	if r.user != "" {
		auth = authn.FromConfig(authn.AuthConfig{Username: r.user, Password: r.pass})
	}
	if err := remote.Write(nr, img, remote.WithAuth(auth)); err != nil {
		t.Fatal(err)
	}
	r.reset()
	return ref
}

func (r *testRegistry) reset() {
	r.mu.Lock()
	clear(r.counts)
	r.mu.Unlock()
}

// blobGets counts GET requests for blobs (layers and configs).
func (r *testRegistry) blobGets() map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string]int{}
	for k, n := range r.counts {
		if strings.HasPrefix(k, "GET ") && strings.Contains(k, "/blobs/") {
			out[k[strings.LastIndex(k, "/")+1:]] += n
		}
	}
	return out
}

func (r *testRegistry) total() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, c := range r.counts {
		n += c
	}
	return n
}

func openStore(t testing.TB, opts ...Option) *Store {
	t.Helper()
	s, err := Open(context.Background(), t.TempDir(), opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		s.Close()
		// Without root, read-only directories from images block the
		// TempDir cleanup.
		filepath.WalkDir(s.Root(), func(p string, d fs.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				os.Chmod(p, 0o755)
			}
			return nil
		})
	})
	return s
}

func writeTemp(t testing.TB, name string, data []byte) string {
	t.Helper()
	p := t.TempDir() + "/" + name
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

var zstdLayer = tarball.WithCompression(compression.ZStd)
