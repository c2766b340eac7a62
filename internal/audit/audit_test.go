package audit

import (
	"bufio"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"
)

func readRecords(t *testing.T, path string) []Record {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []Record
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var r Record
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("%s: bad line %q: %v", path, sc.Text(), err)
		}
		out = append(out, r)
	}
	return out
}

func TestWriteRotateKeep(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sub", "audit.log")
	l, err := Open(path, Options{MaxBytes: 1000, Keep: 2})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 25 {
				if err := l.Write(Record{Time: time.Now(), Method: "POST", Path: "/v1/sandboxes", RequestID: strconv.Itoa(w*100 + i), Status: 202}); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil || fi.Size() > 1000 || fi.Mode().Perm() != 0o600 {
		t.Fatalf("current file: %v %v", fi, err)
	}
	if _, err := os.Stat(path + ".3"); !os.IsNotExist(err) {
		t.Fatalf("kept more than 2 rotated files: %v", err)
	}
	// Every line of every kept file is a whole record, and the newest
	// records are in the current file.
	total := 0
	for _, p := range []string{path, path + ".1", path + ".2"} {
		fi, err := os.Stat(p)
		if err != nil || fi.Size() > 1000 {
			t.Fatalf("%s: %v %v", p, fi, err)
		}
		total += len(readRecords(t, p))
	}
	if total == 0 || total >= 100 {
		t.Fatalf("%d records kept; rotation should have dropped the oldest of 100", total)
	}
	// Reopening appends.
	l, err = Open(path, Options{MaxBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	before := len(readRecords(t, path))
	l.Write(Record{Method: "DELETE"})
	l.Close()
	if got := readRecords(t, path); len(got) != before+1 || got[len(got)-1].Method != "DELETE" {
		t.Fatalf("append after reopen: %d -> %d", before, len(got))
	}
	if err := l.Write(Record{}); err == nil {
		t.Fatal("write after close succeeded")
	}
}

func TestMemory(t *testing.T) {
	var m Memory
	if r := m.Last(); r != (Record{}) {
		t.Fatalf("Last of an empty log: %+v", r)
	}
	m.Write(Record{Method: "POST", Status: 202})
	m.Write(Record{Method: "DELETE", Status: 204})
	recs := m.Records()
	if len(recs) != 2 || recs[0].Method != "POST" || m.Last().Method != "DELETE" {
		t.Fatalf("records %+v, last %+v", recs, m.Last())
	}
	recs[0].Method = "changed"
	if m.Records()[0].Method != "POST" {
		t.Fatal("Records shares its slice with the log")
	}
}
