package execd

import (
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/moat-sandbox/moat/internal/execd/wire"
)

// TestDownloadLineRange covers the line-based read of GET /files/download
// (offset/limit) that the OpenSandbox JS SDK 0.1.11 sends for
// readFile(path, {offset, limit}); moat used to ignore the parameters and
// return the whole file.
func TestDownloadLineRange(t *testing.T) {
	e := newTestEnv(t)
	dir := t.TempDir()
	file := filepath.Join(dir, "lines.txt")
	long := strings.Repeat("x", 10000) // longer than the reader's buffer
	if err := os.WriteFile(file, []byte("l1\nl2\r\n"+long+"\nl4"), 0o644); err != nil {
		t.Fatal(err)
	}
	get := func(query string, hdr ...string) (int, string, string) {
		t.Helper()
		req, _ := http.NewRequest("GET", e.ts.URL+"/files/download?path="+url.QueryEscape(file)+query, nil)
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		resp, err := e.ts.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header.Get("Content-Type"), string(b)
	}
	for _, tc := range []struct {
		query, want string
	}{
		{"&offset=1&limit=1", "l1\n"},
		{"&offset=2&limit=1", "l2\r\n"},
		{"&offset=2&limit=2", "l2\r\n" + long + "\n"},
		{"&offset=4&limit=5", "l4"},
		{"&offset=1&limit=100", "l1\nl2\r\n" + long + "\nl4"},
		{"&offset=5&limit=1", ""},
		{"&offset=99&limit=1", ""},
	} {
		code, ct, body := get(tc.query)
		if code != 200 || body != tc.want {
			t.Errorf("%s: %d %q, want 200 %q", tc.query, code, trunc(body), trunc(tc.want))
		}
		if !strings.HasPrefix(ct, "text/plain") {
			t.Errorf("%s: content type %q", tc.query, ct)
		}
	}
	for _, q := range []string{"&offset=0&limit=1", "&offset=1&limit=0", "&offset=x&limit=1", "&offset=1", "&limit=1", "&offset=-1&limit=2"} {
		if code, _, body := get(q); code != 400 || !strings.Contains(body, wire.CodeInvalidRequestBody) {
			t.Errorf("%s: %d %s, want 400 %s", q, code, body, wire.CodeInvalidRequestBody)
		}
	}
	if code, _, _ := get("&offset=1&limit=1", "Range", "bytes=0-1"); code != 400 {
		t.Errorf("offset/limit with Range: %d, want 400", code)
	}
	// Without offset/limit the download is the byte-exact file, as before.
	if code, ct, body := get(""); code != 200 || ct != "application/octet-stream" || body != "l1\nl2\r\n"+long+"\nl4" {
		t.Errorf("plain download: %d %s %q", code, ct, trunc(body))
	}
}

func trunc(s string) string {
	if len(s) > 40 {
		return s[:40] + "..."
	}
	return s
}
