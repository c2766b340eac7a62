package files

import (
	"bufio"
	"errors"
	"io"
	"net/http"
	"os"
	"strconv"

	"github.com/moat-sandbox/moat/internal/execd/wire"
)

// lineRange is the line-based read of GET /files/download: `offset` is the
// 1-based first line and `limit` the number of lines. Newer OpenSandbox
// SDKs (JS 0.1.11 readFile(path, {offset, limit})) send them; both must be
// given together.
type lineRange struct{ offset, limit int }

// parseLineRange reports whether the request asks for a line range, and
// validates it.
func parseLineRange(r *http.Request) (lineRange, bool, error) {
	q := r.URL.Query()
	off, lim := q.Get("offset"), q.Get("limit")
	if off == "" && lim == "" {
		return lineRange{}, false, nil
	}
	if off == "" || lim == "" {
		return lineRange{}, true, wire.BadBody("both offset and limit must be provided together for line-based reading")
	}
	o, err := strconv.Atoi(off)
	if err != nil || o < 1 {
		return lineRange{}, true, wire.BadBody("offset must be a positive integer (1-based)")
	}
	l, err := strconv.Atoi(lim)
	if err != nil || l < 1 {
		return lineRange{}, true, wire.BadBody("limit must be a positive integer")
	}
	if r.Header.Get("Range") != "" {
		return lineRange{}, true, wire.BadBody("offset/limit cannot be combined with a Range header")
	}
	return lineRange{offset: o, limit: l}, true, nil
}

// serveLines writes lines [offset, offset+limit) of f as text/plain, each
// with its own terminator (the last line of a file may have none). A range
// past the end of the file is an empty 200.
func serveLines(w http.ResponseWriter, f *os.File, lr lineRange) error {
	br := bufio.NewReader(f)
	// Skip the lines before offset without holding them in memory.
	for n := 1; n < lr.offset; {
		chunk, err := br.ReadSlice('\n')
		if err == nil {
			n++
			continue
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			_ = chunk // part of a long line; keep reading it
			continue
		}
		if errors.Is(err, io.EOF) {
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			w.WriteHeader(http.StatusOK)
			return nil
		}
		return fileError(err, "error reading file")
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(http.StatusOK)
	for n := 0; n < lr.limit; {
		chunk, err := br.ReadSlice('\n')
		if len(chunk) > 0 {
			if _, werr := w.Write(chunk); werr != nil {
				return nil // client went away
			}
		}
		switch {
		case err == nil:
			n++
		case errors.Is(err, bufio.ErrBufferFull):
		case errors.Is(err, io.EOF):
			return nil
		default:
			// The status is already sent: a truncated body is all that
			// can signal a read error now.
			return nil
		}
	}
	return nil
}
