// Package audit writes moat's audit log: one JSON line per mutating API
// call (see internal/httpapi's audit middleware), to a file rotated by
// size. A record never holds a request or response body, nor a header, so
// API keys, tokens and image credentials cannot end up in it.
package audit

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"
)

// Record is one audited call.
type Record struct {
	Time       time.Time `json:"time"`
	RequestID  string    `json:"requestId"`
	RemoteAddr string    `json:"remoteAddr"`
	Method     string    `json:"method"`
	Path       string    `json:"path"`
	// Route is the matched route pattern ("" if none matched).
	Route string `json:"route,omitempty"`
	// SandboxID is the sandbox the call was about (from the path, or the
	// Location of a create), if any.
	SandboxID string `json:"sandboxId,omitempty"`
	// KeyID and Tenant are the caller's API key id and the tenant it
	// acted in; both are empty when the call was refused before a key
	// was recognised (401). A key id names a key, it is not the key.
	KeyID      string  `json:"keyId,omitempty"`
	Tenant     string  `json:"tenant,omitempty"`
	Role       string  `json:"role,omitempty"`
	Status     int     `json:"status"`
	DurationMS float64 `json:"durationMs"`
}

// Defaults for Options.
const (
	DefaultMaxBytes = 64 << 20
	DefaultKeep     = 5
)

// Options tune a Log.
type Options struct {
	// MaxBytes is the size at which the file is rotated (default 64 MiB).
	MaxBytes int64
	// Keep is how many rotated files (path.1 .. path.Keep) are kept
	// (default 5).
	Keep int
}

// Log is an open audit log. It is safe for concurrent use.
type Log struct {
	path string
	opt  Options

	mu   sync.Mutex
	f    *os.File
	size int64
}

// Open opens (appending to) the audit log at path, mode 0600.
func Open(path string, opt Options) (*Log, error) {
	if opt.MaxBytes <= 0 {
		opt.MaxBytes = DefaultMaxBytes
	}
	if opt.Keep <= 0 {
		opt.Keep = DefaultKeep
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("audit log dir: %w", err)
	}
	l := &Log{path: path, opt: opt}
	if err := l.open(); err != nil {
		return nil, err
	}
	return l, nil
}

func (l *Log) open() error {
	f, err := os.OpenFile(l.path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("audit log: %w", err)
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return fmt.Errorf("audit log: %w", err)
	}
	l.f, l.size = f, fi.Size()
	return nil
}

// Write appends r as one JSON line, rotating first if the line would take
// the file past MaxBytes. Lines are not fsynced one by one: a host crash
// can lose the last few, a server crash cannot (they are in the kernel).
func (l *Log) Write(r Record) error {
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	b = append(b, '\n')
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil {
		return fmt.Errorf("audit log %s is closed", l.path)
	}
	if l.size > 0 && l.size+int64(len(b)) > l.opt.MaxBytes {
		if err := l.rotateLocked(); err != nil {
			return err
		}
	}
	n, err := l.f.Write(b)
	l.size += int64(n)
	if err != nil {
		return fmt.Errorf("audit log: %w", err)
	}
	return nil
}

// rotateLocked shifts path.N-1 -> path.N ... path -> path.1 and reopens.
func (l *Log) rotateLocked() error {
	l.f.Close()
	l.f = nil
	for i := l.opt.Keep - 1; i >= 1; i-- {
		os.Rename(l.path+"."+strconv.Itoa(i), l.path+"."+strconv.Itoa(i+1))
	}
	if err := os.Rename(l.path, l.path+".1"); err != nil && !os.IsNotExist(err) {
		return fmt.Errorf("audit log rotate: %w", err)
	}
	return l.open()
}

// Close flushes and closes the file.
func (l *Log) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil {
		return nil
	}
	err := l.f.Sync()
	if cerr := l.f.Close(); err == nil {
		err = cerr
	}
	l.f = nil
	return err
}
