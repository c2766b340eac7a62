package envd

import (
	"bufio"
	"compress/gzip"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/moat-sandbox/moat/internal/agentproto"
	"github.com/moat-sandbox/moat/internal/errdefs"
)

const (
	// maxMetadataKey and maxMetadata bound X-Metadata-* headers.
	maxMetadataKey = 246
	maxMetadata    = 4096
	metadataHeader = "X-Metadata-"
)

// writeRaw writes an already-encoded JSON body.
func writeRaw(w http.ResponseWriter, status int, body string) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(status)
	io.WriteString(w, body)
}

// writeError writes envd's HTTP error shape {code, message}.
func writeError(w http.ResponseWriter, status int, msg string) {
	b, _ := json.Marshal(struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}{status, msg})
	writeRaw(w, status, string(b))
}

// httpError is the one place a /files error becomes a status.
func httpError(w http.ResponseWriter, err error) {
	msg := err.Error()
	if p, ok := errdefs.PublicOf(err); ok {
		msg = p.Message
	}
	status := http.StatusInternalServerError
	switch {
	case errors.Is(err, errdefs.ErrNotFound):
		status = http.StatusNotFound
	case errors.Is(err, errdefs.ErrInvalidArgument), errors.Is(err, errdefs.ErrAlreadyExists):
		status = http.StatusBadRequest
	case errors.Is(err, errdefs.ErrUnauthenticated):
		status = http.StatusUnauthorized
	case errors.Is(err, errdefs.ErrPermissionDenied):
		status = http.StatusForbidden
	case errors.Is(err, errdefs.ErrResourceExhausted):
		status = http.StatusInsufficientStorage
	}
	writeError(w, status, msg)
}

// Signature is envd's signed-URL signature of a /files request: op is
// "read" (GET) or "write" (POST), user the username query value, exp the
// signature_expiration (0 = none).
func Signature(path, op, user, token string, exp int64) string {
	s := path + ":" + op + ":" + user + ":" + token
	if exp != 0 {
		s += ":" + strconv.FormatInt(exp, 10)
	}
	sum := sha256.Sum256([]byte(s))
	return "v1_" + base64.RawStdEncoding.EncodeToString(sum[:])
}

// filesAuth admits a /files request with the access token, or else a valid
// signature for op; without a token everything is admitted.
func (s *Service) filesAuth(r *http.Request, op string) error {
	token := s.opts.Token()
	if token == "" {
		return nil
	}
	if r.Header.Get(agentproto.EnvdTokenHeader) != "" {
		if !s.authorized(r) {
			return errdefs.Newf(errdefs.ErrUnauthenticated, "unauthorized access, please provide a valid access token or method signing if supported")
		}
		return nil
	}
	q := r.URL.Query()
	sig := q.Get("signature")
	if sig == "" {
		return errdefs.Newf(errdefs.ErrUnauthenticated, "missing signature query parameter")
	}
	var exp int64
	if v := q.Get("signature_expiration"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return errdefs.Newf(errdefs.ErrUnauthenticated, "invalid signature expiration")
		}
		exp = n
	}
	want := Signature(q.Get("path"), op, q.Get("username"), token, exp)
	if subtle.ConstantTimeCompare([]byte(sig), []byte(want)) != 1 {
		return errdefs.Newf(errdefs.ErrUnauthenticated, "invalid signature")
	}
	if exp != 0 && exp < time.Now().Unix() {
		return errdefs.Newf(errdefs.ErrUnauthenticated, "signature is already expired")
	}
	return nil
}

// envs serves GET /envs: the sandbox-level environment.
func (s *Service) envs(w http.ResponseWriter, r *http.Request) {
	out := make(map[string]string)
	for _, kv := range s.run.Env(nil) {
		if k, v, ok := strings.Cut(kv, "="); ok {
			out[k] = v
		}
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(out)
}

// acceptsGzip reads Accept-Encoding: gzip is chosen when acceptable;
// identity unless refused; anything else is 406.
func acceptsGzip(h string) (gz bool, ok bool) {
	if strings.TrimSpace(h) == "" {
		return false, true
	}
	identity := true
	for _, part := range strings.Split(h, ",") {
		enc, params, _ := strings.Cut(strings.TrimSpace(part), ";")
		enc = strings.ToLower(strings.TrimSpace(enc))
		zero := strings.ReplaceAll(strings.TrimSpace(params), " ", "") == "q=0"
		switch enc {
		case "gzip":
			if !zero {
				return true, true
			}
		case "identity", "*":
			if zero {
				identity = false
			}
		}
	}
	return false, identity
}

// download serves GET /files?path=: the file's bytes, gzipped when asked,
// with Range support otherwise.
func (s *Service) download(w http.ResponseWriter, r *http.Request) {
	if err := s.filesAuth(r, "read"); err != nil {
		httpError(w, err)
		return
	}
	a, err := s.queryAccount(r)
	if err != nil {
		httpError(w, err)
		return
	}
	p, err := s.resolvePath(r.URL.Query().Get("path"), a)
	if err != nil {
		httpError(w, err)
		return
	}
	gz, ok := acceptsGzip(r.Header.Get("Accept-Encoding"))
	if !ok {
		writeError(w, http.StatusNotAcceptable, "no acceptable encoding: gzip and identity are supported")
		return
	}
	var f *os.File
	if err := a.as(func() (err error) { f, err = os.Open(p); return fsError(err, p) }); err != nil {
		httpError(w, err)
		return
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		httpError(w, fsError(err, p))
		return
	}
	if st.IsDir() {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("path '%s' is a directory", p))
		return
	}
	h := w.Header()
	h.Set("Content-Type", "application/octet-stream")
	h.Set("Content-Disposition", mime.FormatMediaType("inline", map[string]string{"filename": filepath.Base(p)}))
	h.Set("Vary", "Accept-Encoding")
	if !gz {
		http.ServeContent(w, r, "", st.ModTime(), f)
		return
	}
	h.Set("Content-Encoding", "gzip")
	w.WriteHeader(http.StatusOK)
	if r.Method == http.MethodHead {
		return
	}
	zw := gzip.NewWriter(w)
	io.Copy(zw, f)
	zw.Close()
}

// uploaded is one entry of the upload response: no other keys, and no
// metadata key when there is none (the SDK's tests compare exactly).
type uploaded struct {
	Name     string            `json:"name"`
	Path     string            `json:"path"`
	Type     string            `json:"type"`
	Metadata map[string]string `json:"metadata,omitempty"`
}

// uploadMetadata reads X-Metadata-* headers.
func uploadMetadata(h http.Header) (map[string]string, error) {
	var md map[string]string
	total := 0
	for k, vs := range h {
		if len(k) <= len(metadataHeader) || !strings.EqualFold(k[:len(metadataHeader)], metadataHeader) {
			continue
		}
		key := strings.ToLower(k[len(metadataHeader):])
		val := strings.Join(vs, ",")
		if !printable(key) || !printable(val) {
			return nil, errdefs.Newf(errdefs.ErrInvalidArgument, "metadata %q: keys and values must be printable ASCII", key)
		}
		if len(key) > maxMetadataKey {
			return nil, errdefs.Newf(errdefs.ErrInvalidArgument, "metadata key %q is longer than %d bytes", key, maxMetadataKey)
		}
		total += len(key) + len(val)
		if total > maxMetadata {
			return nil, errdefs.Newf(errdefs.ErrInvalidArgument, "metadata is larger than %d bytes", maxMetadata)
		}
		if md == nil {
			md = make(map[string]string)
		}
		md[key] = val
	}
	return md, nil
}

func printable(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

// upload serves POST /files: a multipart body (each "file" part to ?path=
// or to the part's filename, a full path) or a raw body to ?path=,
// optionally gzipped.
func (s *Service) upload(w http.ResponseWriter, r *http.Request) {
	if err := s.filesAuth(r, "write"); err != nil {
		httpError(w, err)
		return
	}
	a, err := s.queryAccount(r)
	if err != nil {
		httpError(w, err)
		return
	}
	md, err := uploadMetadata(r.Header)
	if err != nil {
		httpError(w, err)
		return
	}
	body := io.Reader(r.Body)
	switch enc := strings.ToLower(strings.TrimSpace(r.Header.Get("Content-Encoding"))); enc {
	case "", "identity":
	case "gzip":
		zr, err := gzip.NewReader(r.Body)
		if err != nil {
			writeError(w, http.StatusBadRequest, "invalid gzip body: "+err.Error())
			return
		}
		defer zr.Close()
		body = zr
	default:
		writeError(w, http.StatusBadRequest, "unsupported Content-Encoding "+strconv.Quote(enc))
		return
	}
	qpath := r.URL.Query().Get("path")
	mt, params, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	var out []uploaded
	if !strings.HasPrefix(mt, "multipart/") {
		if qpath == "" {
			writeError(w, http.StatusBadRequest, "path is required for a raw upload")
			return
		}
		e, err := s.writeFile(qpath, a, body, md)
		if err != nil {
			httpError(w, err)
			return
		}
		out = append(out, e)
	} else {
		if params["boundary"] == "" {
			writeError(w, http.StatusBadRequest, "multipart body without a boundary")
			return
		}
		mr := multipart.NewReader(bufio.NewReaderSize(body, 1<<20), params["boundary"])
		for {
			part, err := mr.NextRawPart()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				writeError(w, http.StatusBadRequest, "invalid multipart body: "+err.Error())
				return
			}
			if part.FormName() != "file" {
				part.Close()
				continue
			}
			dst := qpath
			if dst == "" {
				// The raw filename: a full destination path, which
				// Part.FileName would cut to its base.
				_, dp, _ := mime.ParseMediaType(part.Header.Get("Content-Disposition"))
				dst = dp["filename"]
			}
			if dst == "" {
				part.Close()
				writeError(w, http.StatusBadRequest, "a file part needs a filename or the path query parameter")
				return
			}
			e, err := s.writeFile(dst, a, part, md)
			part.Close()
			if err != nil {
				httpError(w, err)
				return
			}
			out = append(out, e)
		}
		if len(out) == 0 {
			writeError(w, http.StatusBadRequest, "no file part in the multipart body")
			return
		}
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(out)
}

// writeFile writes src to the path p names for a, creating parent
// directories and the file owned by a, and replaces its metadata.
func (s *Service) writeFile(p string, a account, src io.Reader, md map[string]string) (uploaded, error) {
	dst, err := s.resolvePath(p, a)
	if err != nil {
		return uploaded{}, err
	}
	var e uploaded
	err = a.as(func() (err error) { e, err = writeFile(dst, src, md); return err })
	return e, err
}

// writeFile writes src to dst, creating its parent directories, and
// replaces its metadata.
func writeFile(dst string, src io.Reader, md map[string]string) (uploaded, error) {
	if st, err := os.Stat(dst); err == nil && st.IsDir() {
		return uploaded{}, errdefs.Newf(errdefs.ErrInvalidArgument, "path '%s' is a directory", dst)
	}
	if err := mkdirAll(filepath.Dir(dst)); err != nil {
		return uploaded{}, err
	}
	f, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o666)
	if err != nil {
		return uploaded{}, fsError(err, dst)
	}
	bw := bufio.NewWriterSize(f, 1<<20)
	_, err = io.Copy(bw, src)
	if err == nil {
		err = bw.Flush()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		var pe *os.PathError
		if errors.As(err, &pe) {
			return uploaded{}, fsError(err, dst)
		}
		return uploaded{}, errdefs.Newf(errdefs.ErrInvalidArgument, "reading the upload of %s: %v", dst, err)
	}
	if err := writeMetadata(dst, md); err != nil {
		return uploaded{}, err
	}
	return uploaded{Name: filepath.Base(dst), Path: dst, Type: "file", Metadata: md}, nil
}
