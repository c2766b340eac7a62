package client

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"mime/multipart"
	"net/http"
	"net/textproto"
	"net/url"
	"path"
	"strconv"
	"time"
)

// FileInfo describes a path inside a sandbox.
type FileInfo struct {
	Path string `json:"path"`
	// Type is "file", "directory", "symlink" or "other".
	Type       string    `json:"type"`
	Size       int64     `json:"size"`
	ModifiedAt time.Time `json:"modified_at"`
	CreatedAt  time.Time `json:"created_at"`
	Owner      string    `json:"owner"`
	Group      string    `json:"group"`
	// Mode is the wire form: octal digits written in decimal (755 = 0o755).
	Mode int `json:"mode"`
}

// Perm returns Mode as permission bits.
func (f FileInfo) Perm() fs.FileMode {
	n, err := strconv.ParseUint(strconv.Itoa(f.Mode), 8, 32)
	if err != nil {
		return 0
	}
	return fs.FileMode(n)
}

// wireMode converts permission bits (0o644) into the agent's decimal
// form (644).
func wireMode(perm int) int {
	n, _ := strconv.Atoi(strconv.FormatInt(int64(perm&0o7777), 8))
	return n
}

type permission struct {
	Owner string `json:"owner,omitempty"`
	Group string `json:"group,omitempty"`
	Mode  int    `json:"mode"`
}

// Upload writes r to path inside the sandbox, creating parent
// directories. mode is the permission bits (e.g. 0o644); 0 keeps the
// agent's default. The body is streamed, so Upload is never retried; it
// returns only once it has stopped reading r.
func (s *SandboxHandle) Upload(ctx context.Context, filePath string, r io.Reader, mode int) error {
	meta := struct {
		Path string `json:"path"`
		Mode int    `json:"mode,omitempty"`
	}{Path: filePath, Mode: wireMode(mode)}
	mb, err := json.Marshal(meta)
	if err != nil {
		return fmt.Errorf("client: encode upload metadata: %w", err)
	}
	pr, pw := io.Pipe()
	mw := multipart.NewWriter(pw)
	done := make(chan struct{})
	go func() {
		defer close(done)
		pw.CloseWithError(writeUpload(mw, mb, path.Base(filePath), r))
	}()
	resp, err := s.agent.do(ctx, &call{method: http.MethodPost, path: "/files/upload", stream: pr, contentType: mw.FormDataContentType()})
	pr.CloseWithError(io.ErrClosedPipe) // stops the writer if the request ended early
	<-done                              // r is not read after Upload returns
	if err != nil {
		return err
	}
	resp.Body.Close()
	return nil
}

// writeUpload writes the metadata part then the file part; both carry a
// filename, as the agent reads them from the form's files.
func writeUpload(mw *multipart.Writer, meta []byte, name string, r io.Reader) error {
	h := textproto.MIMEHeader{}
	h.Set("Content-Disposition", `form-data; name="metadata"; filename="metadata"`)
	h.Set("Content-Type", "application/json")
	p, err := mw.CreatePart(h)
	if err != nil {
		return err
	}
	if _, err := p.Write(meta); err != nil {
		return err
	}
	if name == "" || name == "/" || name == "." {
		name = "file"
	}
	h = textproto.MIMEHeader{}
	h.Set("Content-Disposition", fmt.Sprintf(`form-data; name="file"; filename=%q`, name))
	h.Set("Content-Type", "application/octet-stream")
	if p, err = mw.CreatePart(h); err != nil {
		return err
	}
	if _, err := io.Copy(p, r); err != nil {
		return err
	}
	return mw.Close()
}

// Download returns the content of the file at path. The caller closes it.
func (s *SandboxHandle) Download(ctx context.Context, filePath string) (io.ReadCloser, error) {
	resp, err := s.agent.do(ctx, &call{method: http.MethodGet, path: "/files/download", query: url.Values{"path": {filePath}}})
	if err != nil {
		return nil, err
	}
	return resp.Body, nil
}

// ListDir lists the directory at path (one level, lexical order).
func (s *SandboxHandle) ListDir(ctx context.Context, dir string) ([]FileInfo, error) {
	var out []FileInfo
	if err := s.agent.json(ctx, &call{method: http.MethodGet, path: "/directories/list", query: url.Values{"path": {dir}}}, nil, &out); err != nil {
		return nil, err
	}
	return out, nil
}

// FileInfo stats paths and returns their info keyed by path.
func (s *SandboxHandle) FileInfo(ctx context.Context, paths ...string) (map[string]FileInfo, error) {
	out := map[string]FileInfo{}
	if err := s.agent.json(ctx, &call{method: http.MethodGet, path: "/files/info", query: url.Values{"path": paths}}, nil, &out); err != nil {
		return nil, err
	}
	return out, nil
}

// DeleteFiles deletes files (not directories).
func (s *SandboxHandle) DeleteFiles(ctx context.Context, paths ...string) error {
	return s.agent.json(ctx, &call{method: http.MethodDelete, path: "/files", query: url.Values{"path": paths}}, nil, nil)
}

// Mkdir creates dir and its parents (mkdir -p) with permission bits mode
// (e.g. 0o755; 0 means 0o755).
func (s *SandboxHandle) Mkdir(ctx context.Context, dir string, mode int) error {
	if mode == 0 {
		mode = 0o755
	}
	in := map[string]permission{dir: {Mode: wireMode(mode)}}
	return s.agent.json(ctx, &call{method: http.MethodPost, path: "/directories", idempotent: true}, in, nil)
}
