package console

import (
	"bytes"
	"embed"
	"errors"
	"io"
	"io/fs"
	"mime"
	"net/http"
	"path"
	"strings"
	"time"

	"github.com/moat-sandbox/moat/internal/errdefs"
)

// dist holds the app that `make build` (npm run build in web/console)
// writes to dist/app before compiling. Only dist/README.md is committed,
// so a clone where the app was never built still compiles and vets: its
// binary answers /console with a page that says how to build the app.
//
//go:embed all:dist
var dist embed.FS

// Embedded returns the app built into this binary (possibly empty).
func Embedded() fs.FS {
	sub, err := fs.Sub(dist, "dist/app")
	if err != nil {
		return emptyFS{}
	}
	return sub
}

type emptyFS struct{}

func (emptyFS) Open(name string) (fs.File, error) {
	return nil, &fs.PathError{Op: "open", Path: name, Err: fs.ErrNotExist}
}

// csrfMeta is the tag in index.html whose content carries the CSRF token
// on a top-level navigation of a signed-in browser.
const csrfMeta = `<meta name="moat-csrf" content="">`

// assets is the loaded app.
type assets struct {
	fsys  fs.FS
	built bool
	// index is index.html split around the CSRF meta tag's content.
	indexHead, indexTail []byte
}

func loadAssets(fsys fs.FS) (*assets, error) {
	a := &assets{fsys: fsys}
	b, err := fs.ReadFile(fsys, "index.html")
	if errors.Is(err, fs.ErrNotExist) {
		return a, nil
	}
	if err != nil {
		return nil, err
	}
	i := bytes.Index(b, []byte(csrfMeta))
	if i < 0 {
		return nil, errors.New("console: index.html lacks " + csrfMeta)
	}
	cut := i + len(csrfMeta) - len(`">`)
	a.indexHead, a.indexTail = b[:cut], b[cut:]
	a.built = true
	return a, nil
}

// notBuilt is the page of a binary built without the app.
const notBuilt = `<!doctype html><meta charset="utf-8"><title>moat console not built</title>
<p>This moat binary was built without its web console. Build it with <code>make build</code>
(which runs <code>npm ci</code> and <code>npm run build</code> in <code>web/console</code> before <code>go build</code>).</p>
`

// static serves the app: index.html at /console/, files under it as they
// are. Hashed bundles (assets/) are immutable; index.html is never cached.
func (c *Console) static(w http.ResponseWriter, r *http.Request) error {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		return methodNotAllowed(w, "GET, HEAD")
	}
	name := strings.TrimPrefix(r.URL.Path, Prefix+"/")
	if name == "" || name == "index.html" {
		return c.index(w, r)
	}
	if !c.assets.built {
		return errdefs.WithPublic(errdefs.ErrNotFound, "CONSOLE::NOT_FOUND", "not found")
	}
	if !fs.ValidPath(name) || strings.HasPrefix(path.Base(name), ".") {
		return errdefs.WithPublic(errdefs.ErrNotFound, "CONSOLE::NOT_FOUND", "not found")
	}
	f, err := c.assets.fsys.Open(name)
	if err != nil {
		return errdefs.WithPublic(errdefs.ErrNotFound, "CONSOLE::NOT_FOUND", "not found")
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil || st.IsDir() {
		return errdefs.WithPublic(errdefs.ErrNotFound, "CONSOLE::NOT_FOUND", "not found")
	}
	rs, ok := f.(io.ReadSeeker)
	if !ok {
		return errors.New("console: embedded file is not seekable")
	}
	if ct := mime.TypeByExtension(path.Ext(name)); ct != "" {
		w.Header().Set("Content-Type", ct)
	}
	if strings.HasPrefix(name, "assets/") {
		w.Header().Set("Cache-Control", "public, max-age=31536000, immutable")
	}
	http.ServeContent(w, r, "", time.Time{}, rs)
	return nil
}

// index serves index.html. On a top-level navigation (Sec-Fetch-Dest:
// document, which only the browser can set) of a signed-in browser, the
// page carries the session's CSRF token, so a reload or a new tab keeps
// the session. Any other fetch of it gets no token: a same-origin script
// (say, a page a sandbox serves through the server proxy) can fetch the
// page but cannot make it a navigation, and cannot read a navigation it
// opens (Cross-Origin-Opener-Policy, frame-ancestors).
func (c *Console) index(w http.ResponseWriter, r *http.Request) error {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	if !c.assets.built {
		w.WriteHeader(http.StatusServiceUnavailable)
		w.Write([]byte(notBuilt))
		return nil
	}
	token := ""
	if r.Header.Get("Sec-Fetch-Dest") == "document" && r.Header.Get("Sec-Fetch-Mode") == "navigate" {
		if _, sess, ok := c.sessionOf(r); ok {
			token = sess.csrf // base64url: safe inside an attribute
		}
	}
	w.WriteHeader(http.StatusOK)
	if r.Method == http.MethodHead {
		return nil
	}
	w.Write(c.assets.indexHead)
	w.Write([]byte(token))
	w.Write(c.assets.indexTail)
	return nil
}
