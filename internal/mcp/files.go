package mcp

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"path"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
)

// Bounds of file_read.
const (
	defaultReadBytes = 64 << 10
	maxReadBytes     = 4 << 20
)

// FileWriteInput are the arguments of file_write.
type FileWriteInput struct {
	SandboxID     string `json:"sandbox_id" jsonschema:"Id of a Running sandbox."`
	Path          string `json:"path" jsonschema:"Absolute path of the file to write; parent directories are created and an existing file is replaced."`
	Content       string `json:"content,omitempty" jsonschema:"File content as UTF-8 text. Omit both content and content_base64 to write an empty file."`
	ContentBase64 string `json:"content_base64,omitempty" jsonschema:"File content as standard base64, for binary data. Do not combine with content."`
	Mode          string `json:"mode,omitempty" jsonschema:"Permission bits in octal, e.g. 644 or 0755 (default 644)."`
}

// FileWriteOutput is the result of file_write.
type FileWriteOutput struct {
	Path         string `json:"path"`
	BytesWritten int    `json:"bytes_written"`
}

// FileReadInput are the arguments of file_read.
type FileReadInput struct {
	SandboxID string `json:"sandbox_id" jsonschema:"Id of a Running sandbox."`
	Path      string `json:"path" jsonschema:"Absolute path of the file to read."`
	MaxBytes  int    `json:"max_bytes,omitempty" jsonschema:"Read at most this many bytes from the start of the file (default 65536, at most 4194304)."`
}

// FileReadOutput is the result of file_read.
type FileReadOutput struct {
	Path      string `json:"path"`
	Encoding  string `json:"encoding" jsonschema:"text when content is the file as UTF-8 text; base64 when the file is binary and content is its base64."`
	Content   string `json:"content" jsonschema:"The bytes read, as text or base64 (see encoding)."`
	BytesRead int    `json:"bytes_read" jsonschema:"Number of file bytes in content."`
	Truncated bool   `json:"truncated" jsonschema:"True when the file is longer than max_bytes and only its start was returned."`
}

// FileListInput are the arguments of file_list.
type FileListInput struct {
	SandboxID string `json:"sandbox_id" jsonschema:"Id of a Running sandbox."`
	Path      string `json:"path" jsonschema:"Absolute path of the directory to list (one level, not recursive)."`
}

// FileEntry is one entry of a directory.
type FileEntry struct {
	Name       string `json:"name"`
	Path       string `json:"path"`
	Type       string `json:"type" jsonschema:"file, directory, symlink or other."`
	Size       int64  `json:"size" jsonschema:"Size in bytes."`
	Mode       string `json:"mode" jsonschema:"Permission bits in octal, e.g. 0644."`
	ModifiedAt string `json:"modified_at,omitempty" jsonschema:"Last modification time (RFC 3339)."`
}

// FileListOutput is the result of file_list.
type FileListOutput struct {
	Path    string      `json:"path"`
	Entries []FileEntry `json:"entries" jsonschema:"Entries in lexical order."`
}

func (s *Server) addFileTools() {
	sdk.AddTool(s.srv, &sdk.Tool{
		Name:        "file_write",
		Title:       "Write file",
		Description: "Write a file inside a sandbox (creating parent directories, replacing an existing file). Prefer this over echo/heredocs in exec for source code and data: no shell quoting is involved.",
		Annotations: &sdk.ToolAnnotations{DestructiveHint: hint(true), IdempotentHint: true, OpenWorldHint: hint(false)},
	}, s.fileWrite)
	sdk.AddTool(s.srv, &sdk.Tool{
		Name:        "file_read",
		Title:       "Read file",
		Description: "Read a file from a sandbox. Text files come back as text, binary files as base64 (see encoding). Large files are cut at max_bytes (truncated=true); use exec with head, tail, sed -n or grep to read a part.",
		Annotations: &sdk.ToolAnnotations{ReadOnlyHint: true, OpenWorldHint: hint(false)},
	}, s.fileRead)
	sdk.AddTool(s.srv, &sdk.Tool{
		Name:        "file_list",
		Title:       "List directory",
		Description: "List one directory of a sandbox: name, type, size, mode and modification time of each entry.",
		Annotations: &sdk.ToolAnnotations{ReadOnlyHint: true, OpenWorldHint: hint(false)},
	}, s.fileList)
}

func checkPath(p string) error {
	if strings.TrimSpace(p) == "" {
		return invalidf("path is required (an absolute path inside the sandbox)")
	}
	if strings.ContainsRune(p, 0) {
		return invalidf("path must not contain NUL bytes")
	}
	return nil
}

// parseMode parses octal permission bits ("644", "0755", "0o600").
func parseMode(s string) (int, error) {
	if s == "" {
		return 0, nil
	}
	v := strings.TrimPrefix(strings.TrimPrefix(s, "0o"), "0O")
	n, err := strconv.ParseUint(v, 8, 32)
	if err != nil || n > 0o7777 {
		return 0, invalidf("mode %q: want octal permission bits such as 644 or 0755", s)
	}
	return int(n), nil
}

func (s *Server) fileWrite(ctx context.Context, _ *sdk.CallToolRequest, in FileWriteInput) (*sdk.CallToolResult, FileWriteOutput, error) {
	if err := checkID(in.SandboxID); err != nil {
		return nil, FileWriteOutput{}, err
	}
	if err := checkPath(in.Path); err != nil {
		return nil, FileWriteOutput{}, err
	}
	if in.Content != "" && in.ContentBase64 != "" {
		return nil, FileWriteOutput{}, invalidf("give either content or content_base64, not both")
	}
	mode, err := parseMode(in.Mode)
	if err != nil {
		return nil, FileWriteOutput{}, err
	}
	data := []byte(in.Content)
	if in.ContentBase64 != "" {
		if data, err = base64.StdEncoding.DecodeString(strings.TrimSpace(in.ContentBase64)); err != nil {
			return nil, FileWriteOutput{}, invalidf("content_base64 is not valid standard base64: %v", err)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, fileCallTimeout)
	defer cancel()
	sb, err := s.opts.Client.Sandbox(ctx, in.SandboxID)
	if err != nil {
		return nil, FileWriteOutput{}, agentError(ctx, err)
	}
	if err := sb.Upload(ctx, in.Path, bytes.NewReader(data), mode); err != nil {
		return nil, FileWriteOutput{}, agentError(ctx, err)
	}
	return nil, FileWriteOutput{Path: in.Path, BytesWritten: len(data)}, nil
}

func (s *Server) fileRead(ctx context.Context, _ *sdk.CallToolRequest, in FileReadInput) (*sdk.CallToolResult, FileReadOutput, error) {
	if err := checkID(in.SandboxID); err != nil {
		return nil, FileReadOutput{}, err
	}
	if err := checkPath(in.Path); err != nil {
		return nil, FileReadOutput{}, err
	}
	if in.MaxBytes < 0 || in.MaxBytes > maxReadBytes {
		return nil, FileReadOutput{}, invalidf("max_bytes must be between 1 and %d", maxReadBytes)
	}
	limit := orDefault(in.MaxBytes, defaultReadBytes)
	ctx, cancel := context.WithTimeout(ctx, fileCallTimeout)
	defer cancel()
	sb, err := s.opts.Client.Sandbox(ctx, in.SandboxID)
	if err != nil {
		return nil, FileReadOutput{}, agentError(ctx, err)
	}
	rc, err := sb.Download(ctx, in.Path)
	if err != nil {
		return nil, FileReadOutput{}, agentError(ctx, err)
	}
	defer rc.Close()
	data, err := io.ReadAll(io.LimitReader(rc, int64(limit)+1))
	if err != nil {
		return nil, FileReadOutput{}, agentError(ctx, fmt.Errorf("reading %s: %w", in.Path, err))
	}
	out := FileReadOutput{Path: in.Path}
	if len(data) > limit {
		data, out.Truncated = data[:limit], true
	}
	out.BytesRead = len(data)
	text := data
	if out.Truncated {
		text = trimRuneEnd(data) // the cut may split a character
	}
	if isText(text) {
		out.Encoding, out.Content = "text", string(text)
		out.BytesRead = len(text)
	} else {
		out.Encoding, out.Content = "base64", base64.StdEncoding.EncodeToString(data)
	}
	return nil, out, nil
}

// isText reports whether b reads as text: valid UTF-8 without NUL bytes.
func isText(b []byte) bool {
	return utf8.Valid(b) && bytes.IndexByte(b, 0) < 0
}

func (s *Server) fileList(ctx context.Context, _ *sdk.CallToolRequest, in FileListInput) (*sdk.CallToolResult, FileListOutput, error) {
	if err := checkID(in.SandboxID); err != nil {
		return nil, FileListOutput{}, err
	}
	if err := checkPath(in.Path); err != nil {
		return nil, FileListOutput{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, fileCallTimeout)
	defer cancel()
	sb, err := s.opts.Client.Sandbox(ctx, in.SandboxID)
	if err != nil {
		return nil, FileListOutput{}, agentError(ctx, err)
	}
	infos, err := sb.ListDir(ctx, in.Path)
	if err != nil {
		return nil, FileListOutput{}, agentError(ctx, err)
	}
	out := FileListOutput{Path: in.Path, Entries: make([]FileEntry, 0, len(infos))}
	for _, fi := range infos {
		e := FileEntry{Name: path.Base(fi.Path), Path: fi.Path, Type: fi.Type, Size: fi.Size, Mode: fmt.Sprintf("%04o", uint32(fi.Perm()))}
		if !fi.ModifiedAt.IsZero() {
			e.ModifiedAt = fi.ModifiedAt.UTC().Format(time.RFC3339)
		}
		out.Entries = append(out.Entries, e)
	}
	return nil, out, nil
}
