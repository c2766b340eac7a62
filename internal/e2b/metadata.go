package e2b

import (
	"encoding/json"
	"maps"
	"unicode/utf8"

	"github.com/moat-sandbox/moat/internal/lifecycle"
)

// E2B metadata is free-form (values with spaces, slashes, UUIDs), moat's
// follows Kubernetes label rules. A pair that passes the label rules is
// stored as the sandbox's metadata, so the Lifecycle API shows and
// filters it too; the others are kept, verbatim, as JSON in the
// extension ExtMetadata, which only this API reads. metadataOf merges
// both, so E2B metadata round-trips whatever it holds.
const ExtMetadata = "moat.e2b.metadata"

// Limits of the free-form metadata.
const (
	maxMetadataPairs = 64
	maxMetadataBytes = 16 << 10
)

// splitMetadata splits E2B metadata into label-safe metadata and the rest,
// which it adds to ext (a copy) as ExtMetadata.
func splitMetadata(md map[string]string, ext map[string]string) (map[string]string, map[string]string, error) {
	if len(md) > maxMetadataPairs {
		return nil, nil, invalid("metadata has more than 64 keys")
	}
	safe, rest := map[string]string{}, map[string]string{}
	size := 0
	for k, v := range md {
		if k == "" {
			return nil, nil, invalid("metadata keys must not be empty")
		}
		if !utf8.ValidString(k) || !utf8.ValidString(v) {
			return nil, nil, invalid("metadata must be UTF-8 text")
		}
		size += len(k) + len(v)
		if lifecycle.ValidateMetadata(map[string]string{k: v}) == nil {
			safe[k] = v
		} else {
			rest[k] = v
		}
	}
	if size > maxMetadataBytes {
		return nil, nil, invalid("metadata is larger than 16 KiB")
	}
	ext = maps.Clone(ext)
	if len(rest) > 0 {
		if ext == nil {
			ext = map[string]string{}
		}
		b, _ := json.Marshal(rest)
		ext[ExtMetadata] = string(b)
	}
	return safe, ext, nil
}

// metadataOf is a sandbox's E2B metadata: its metadata and the pairs kept
// in ExtMetadata.
func metadataOf(sb lifecycle.Sandbox) map[string]string {
	out := maps.Clone(sb.Metadata)
	if out == nil {
		out = map[string]string{}
	}
	if raw := sb.Extensions[ExtMetadata]; raw != "" {
		var rest map[string]string
		if json.Unmarshal([]byte(raw), &rest) == nil {
			maps.Copy(out, rest)
		}
	}
	return out
}
