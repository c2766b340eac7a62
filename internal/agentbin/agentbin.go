// Package agentbin carries the in-sandbox agent (cmd/moat-agent) inside
// the moat binary, so that users install one file. The build writes the
// agent to payload/moat-agent before it builds moat (`make build`; the
// tests' testutil.MoatBinary does the same); go:embed picks it up.
//
// A moat built without that step still builds and runs (the payload
// directory always holds its README, so the embed pattern matches), but
// Install returns ErrMissing: the server refuses, at start-up, the
// runtimes that need the agent, with a message that says how to build it,
// instead of creating sandboxes that cannot start.
package agentbin

import (
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/moat-sandbox/moat/internal/atomicfile"
	"github.com/moat-sandbox/moat/internal/errdefs"
)

//go:embed payload
var payload embed.FS

// name is the agent's path in payload.
const name = "payload/moat-agent"

// ErrMissing is returned (wrapped, with errdefs.ErrFailedPrecondition)
// when this moat was built without its agent.
var ErrMissing = errors.New("this moat binary carries no agent: build it with `make build` " +
	"(or build ./cmd/moat-agent into internal/agentbin/payload/moat-agent before ./cmd/moat)")

// Embedded returns the agent binary carried by this moat.
func Embedded() ([]byte, error) {
	data, err := payload.ReadFile(name)
	if errors.Is(err, fs.ErrNotExist) || (err == nil && len(data) == 0) {
		return nil, fmt.Errorf("%w: %w", ErrMissing, errdefs.ErrFailedPrecondition)
	}
	return data, err
}

// Install writes the embedded agent under dir, once per content: the file
// is dir/moat-agent-<first 16 hex digits of its SHA-256>, read-only and
// executable, written to a temporary name and renamed, so a file with
// that name is always complete. It returns the file's path. Sandboxes bind
// mount it; files of earlier agents stay for the sandboxes that still use
// them.
func Install(dir string) (string, error) {
	data, err := Embedded()
	if err != nil {
		return "", err
	}
	return install(dir, data)
}

// install is Install of data.
func install(dir string, data []byte) (string, error) {
	sum := sha256.Sum256(data)
	path := filepath.Join(dir, "moat-agent-"+hex.EncodeToString(sum[:8]))
	if fi, err := os.Stat(path); err == nil && fi.Mode().IsRegular() && fi.Size() == int64(len(data)) {
		return path, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("agent: %w", err)
	}
	if err := atomicfile.WriteFile(path, data, 0o555); err != nil {
		return "", fmt.Errorf("agent: %w", err)
	}
	return path, nil
}

// WriteTo writes the embedded agent to path (mode 0755), atomically: the
// Kubernetes agent init container's job (`moat controller copy-agent`).
func WriteTo(path string) error {
	data, err := Embedded()
	if err != nil {
		return err
	}
	return atomicfile.WriteFile(path, data, 0o755)
}

// Digest returns the embedded agent's "sha256:<hex>" (`moat version`).
func Digest() (string, error) {
	data, err := Embedded()
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(data)
	return "sha256:" + hex.EncodeToString(sum[:]), nil
}
