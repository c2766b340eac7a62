package atomicfile

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"
)

type failingReader struct{}

func (failingReader) Read([]byte) (int, error) { return 0, errors.New("read failed") }

func TestWrite(t *testing.T) {
	tests := []struct {
		name  string
		write func(path string) error
		want  string // content after the write; the old content if it fails
		perm  os.FileMode
		fails bool
	}{
		{"1 WriteFile", func(p string) error { return WriteFile(p, []byte("new"), 0o640) }, "new", 0o640, false},
		{"2 WriteFileSync", func(p string) error { return WriteFileSync(p, []byte("new"), 0o600) }, "new", 0o600, false},
		{"3 WriteFrom", func(p string) error { return WriteFrom(p, bytes.NewReader([]byte("new")), 0o755) }, "new", 0o755, false},
		{"4 WriteFrom, read fails", func(p string) error {
			return WriteFrom(p, io.MultiReader(bytes.NewReader([]byte("par")), failingReader{}), 0o644)
		}, "old", 0o644, true},
		{"5 missing directory", func(p string) error { return WriteFile(filepath.Join(p, "sub", "f"), []byte("new"), 0o644) }, "old", 0o644, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "f")
			if err := os.WriteFile(path, []byte("old"), 0o644); err != nil {
				t.Fatal(err)
			}
			err := tt.write(path)
			if (err != nil) != tt.fails {
				t.Fatalf("err = %v, want failure %v", err, tt.fails)
			}
			got, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != tt.want {
				t.Errorf("content = %q, want %q", got, tt.want)
			}
			fi, err := os.Stat(path)
			if err != nil {
				t.Fatal(err)
			}
			if fi.Mode().Perm() != tt.perm {
				t.Errorf("mode = %v, want %v", fi.Mode().Perm(), tt.perm)
			}
			ents, err := os.ReadDir(dir)
			if err != nil {
				t.Fatal(err)
			}
			if len(ents) != 1 {
				t.Errorf("directory holds %d entries, want only the file (a temporary file left behind?)", len(ents))
			}
		})
	}
}

// TestTempName checks the temporary file's name, which sweeps after a
// crash match: hidden, named after the target, ending in .tmp.
func TestTempName(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "state.json")
	var seen string
	err := write(path, 0o600, false, func(f *os.File) error {
		seen = filepath.Base(f.Name())
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if ok, _ := filepath.Match(".state.json.*.tmp", seen); !ok {
		t.Errorf("temporary file %q does not match .state.json.*.tmp", seen)
	}
}
