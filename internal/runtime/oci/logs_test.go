package oci

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

func TestTrimLogKeepsTheTail(t *testing.T) {
	p := filepath.Join(t.TempDir(), "agent.log")
	data := bytes.Repeat([]byte("0123456789"), 100) // 1000 bytes
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
	// A writer holding the file open with O_APPEND, like the container.
	w, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if err := trimLog(p, 2000); err != nil { // under the bound: untouched
		t.Fatal(err)
	}
	if fi, _ := os.Stat(p); fi.Size() != 1000 {
		t.Fatalf("size %d after a no-op trim", fi.Size())
	}
	if err := trimLog(p, 400); err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(p)
	if !bytes.Equal(got, data[800:]) {
		t.Fatalf("after trim: %d bytes %q", len(got), got)
	}
	// The appending writer continues at the new end.
	w.Write([]byte("NEW"))
	got, _ = os.ReadFile(p)
	if string(got[len(got)-3:]) != "NEW" || len(got) != 203 {
		t.Fatalf("append after trim: %d bytes, tail %q", len(got), got[len(got)-10:])
	}
	f, _ := os.Open(p)
	defer f.Close()
	tail, truncated, err := readTail(f, 3)
	if err != nil || !truncated || string(tail) != "NEW" {
		t.Fatalf("readTail: %q %v %v", tail, truncated, err)
	}
	all, truncated, _ := readTail(f, 0)
	if truncated || len(all) != 203 {
		t.Fatalf("readTail unbounded: %d %v", len(all), truncated)
	}
}
