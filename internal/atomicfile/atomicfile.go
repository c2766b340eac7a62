// Package atomicfile replaces files so that readers see the old content or
// the new, never a part: the data goes to a temporary file in the target's
// directory, which is then renamed over the target. It imports only the
// standard library, so the lean agent may use it too.
package atomicfile

import (
	"io"
	"os"
	"path/filepath"
)

// WriteFile atomically replaces path with data and sets its mode to perm
// (umask does not apply). It survives a crash of the process, not of the
// machine: it does not fsync, which costs milliseconds per write on the
// hot paths that keep sandbox state.
func WriteFile(path string, data []byte, perm os.FileMode) error {
	return write(path, perm, false, func(f *os.File) error {
		_, err := f.Write(data)
		return err
	})
}

// WriteFileSync is WriteFile with an fsync before the rename, for content
// that must survive power loss (the image store's index and metadata).
func WriteFileSync(path string, data []byte, perm os.FileMode) error {
	return write(path, perm, true, func(f *os.File) error {
		_, err := f.Write(data)
		return err
	})
}

// WriteFrom is WriteFile for content read from r: a failed copy leaves
// path as it was.
func WriteFrom(path string, r io.Reader, perm os.FileMode) error {
	return write(path, perm, false, func(f *os.File) error {
		_, err := io.Copy(f, r)
		return err
	})
}

// write fills a temporary file named after path (hidden, ending in .tmp so
// a sweep can find what a crash left) and renames it over path.
func write(path string, perm os.FileMode, sync bool, fill func(*os.File) error) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*.tmp")
	if err != nil {
		return err
	}
	tmp := f.Name()
	err = fill(f)
	if err == nil {
		err = f.Chmod(perm)
	}
	if err == nil && sync {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
	}
	return err
}
