package image

import (
	"bufio"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/klauspost/compress/zstd"
	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/internal/atomicfile"
	"github.com/moat-sandbox/moat/internal/errdefs"
)

// putLayer extracts the uncompressed layer tar r into
// layers/sha256/<diffid> and returns the diff ID (sha256 of all of r) and
// the tar size. If want is set, the content must hash to it. Extraction
// happens in tmp/ and the tree is renamed into place only when complete
// and verified; if another writer won the race, its copy is kept.
// Preconditions: the caller holds the writer lock.
func (s *Store) putLayer(ctx context.Context, r io.Reader, want string) (string, int64, error) {
	tmp, err := os.MkdirTemp(filepath.Join(s.root, "tmp"), "layer-")
	if err != nil {
		return "", 0, err
	}
	defer removeAllTree(tmp)
	if err := os.Chmod(tmp, 0o755); err != nil {
		return "", 0, err
	}
	h := sha256.New()
	cr := &countingReader{r: io.TeeReader(r, h)}
	if err := extractTar(ctx, cr, tmp, s.rootless()); err != nil {
		return "", 0, err
	}
	// Hash the end-of-archive padding too: the diff ID covers every byte.
	if _, err := io.Copy(io.Discard, cr); err != nil {
		return "", 0, err
	}
	diffID := "sha256:" + hex.EncodeToString(h.Sum(nil))
	if want != "" && diffID != want {
		return "", 0, fmt.Errorf("layer content hashes to %s, want %s: %w", diffID, want, errdefs.ErrInvalidArgument)
	}
	// Make the tree durable before it becomes visible under its name.
	if fd, err := unix.Open(tmp, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0); err == nil {
		unix.Syncfs(fd)
		unix.Close(fd)
	}
	dst := s.layerDir(diffID)
	if err := os.Rename(tmp, dst); err != nil {
		if fi, serr := os.Stat(dst); serr == nil && fi.IsDir() {
			return diffID, cr.n, nil // a concurrent writer extracted it first
		}
		return "", 0, fmt.Errorf("install layer %s: %w", diffID, err)
	}
	return diffID, cr.n, nil
}

func (s *Store) rootless() bool { return os.Geteuid() != 0 }

// hasLayer reports whether diffID is extracted.
func (s *Store) hasLayer(diffID string) bool {
	fi, err := os.Stat(s.layerDir(diffID))
	return err == nil && fi.IsDir()
}

type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// decompress sniffs r's magic bytes and returns a reader of the
// uncompressed stream (gzip, zstd or already uncompressed).
func decompress(r io.Reader) (io.ReadCloser, error) {
	br := bufio.NewReaderSize(r, 64<<10)
	magic, err := br.Peek(4)
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	switch {
	case len(magic) >= 2 && magic[0] == 0x1f && magic[1] == 0x8b:
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, fmt.Errorf("gzip: %v: %w", err, errdefs.ErrInvalidArgument)
		}
		return zr, nil
	case len(magic) == 4 && magic[0] == 0x28 && magic[1] == 0xb5 && magic[2] == 0x2f && magic[3] == 0xfd:
		zr, err := zstd.NewReader(br)
		if err != nil {
			return nil, fmt.Errorf("zstd: %v: %w", err, errdefs.ErrInvalidArgument)
		}
		return zr.IOReadCloser(), nil
	default:
		return io.NopCloser(br), nil
	}
}

// writeBlob stores data under blobs/sha256 and returns its digest.
func (s *Store) writeBlob(data []byte) (string, error) {
	sum := sha256.Sum256(data)
	d := "sha256:" + hex.EncodeToString(sum[:])
	p := s.blobPath(d)
	if _, err := os.Stat(p); err == nil {
		return d, nil
	} else if !errors.Is(err, fs.ErrNotExist) {
		return "", err
	}
	if err := atomicfile.WriteFileSync(p, data, 0o644); err != nil {
		return "", fmt.Errorf("write blob %s: %w", d, err)
	}
	return d, nil
}

func (s *Store) readBlob(digest string) ([]byte, error) {
	if !validDigest(digest) {
		return nil, fmt.Errorf("bad digest %q: %w", digest, errdefs.ErrInvalidArgument)
	}
	data, err := os.ReadFile(s.blobPath(digest))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("blob %s: %w", digest, errdefs.ErrNotFound)
	}
	return data, err
}
