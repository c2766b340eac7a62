package cli

import (
	"testing"

	"github.com/moat-sandbox/moat/internal/errdefs"
)

func TestMCPListenAddr(t *testing.T) {
	for i, tc := range []struct {
		addr        string
		allowRemote bool
		want        string // "" = invalid
	}{
		{":8765", false, "127.0.0.1:8765"},
		{"127.0.0.1:0", false, "127.0.0.1:0"},
		{"localhost:9000", false, "localhost:9000"},
		{"[::1]:9000", false, "[::1]:9000"},
		{"0.0.0.0:8765", false, ""},
		{"10.1.2.3:8765", false, ""},
		{"example.com:80", false, ""},
		{"0.0.0.0:8765", true, "0.0.0.0:8765"},
		{"8765", false, ""},
	} {
		got, err := mcpListenAddr(tc.addr, tc.allowRemote)
		switch {
		case tc.want == "" && !errdefs.IsInvalidArgument(err):
			t.Errorf("%d: %q: got %q, %v; want an invalid-argument error", i, tc.addr, got, err)
		case tc.want != "" && (err != nil || got != tc.want):
			t.Errorf("%d: %q: got %q, %v; want %q", i, tc.addr, got, err, tc.want)
		}
	}
}
