package cli

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/internal/image"
)

func TestTTYProgress(t *testing.T) {
	var buf bytes.Buffer
	p := newTTYProgress(&buf)
	now := time.Unix(1000, 0)
	p.now = func() time.Time { return now }
	a, b := "sha256:aaaaaaaaaaaa1111", "sha256:bbbbbbbbbbbb2222"

	p.report(image.Progress{Layer: a, Done: true, Cached: true})
	first := buf.String()
	want := "\r\x1b[2Kaaaaaaaaaaaa: already present\n\r\x1b[2K1/1 layers (1 already present), 0B / 0B\n"
	if first != want {
		t.Fatalf("first draw %q\nwant %q", first, want)
	}
	// Within redrawEvery a non-final report is not drawn.
	buf.Reset()
	p.report(image.Progress{Layer: b, Complete: 500_000, Total: 2_000_000})
	if buf.Len() != 0 {
		t.Fatalf("throttled report drew %q", buf.String())
	}
	now = now.Add(redrawEvery)
	p.report(image.Progress{Layer: b, Complete: 1_000_000, Total: 2_000_000})
	got := buf.String()
	if !strings.HasPrefix(got, "\x1b[2A") { // back over the 2 lines drawn before
		t.Fatalf("redraw does not move up 2 lines: %q", got)
	}
	if !strings.Contains(got, "bbbbbbbbbbbb: [===============>              ] 1.0MB / 2.0MB\n") ||
		!strings.Contains(got, "1/2 layers (1 already present), 1.0MB / 2.0MB\n") {
		t.Fatalf("redraw %q", got)
	}
	// Done is drawn at once.
	buf.Reset()
	p.report(image.Progress{Layer: b, Complete: 2_000_000, Total: 2_000_000, Done: true})
	if got := buf.String(); !strings.HasPrefix(got, "\x1b[3A") || !strings.Contains(got, "bbbbbbbbbbbb: done (2.0MB)") ||
		!strings.Contains(got, "2/2 layers (1 already present), 2.0MB / 2.0MB") {
		t.Fatalf("done draw %q", got)
	}
}

func TestBar(t *testing.T) {
	for _, tc := range []struct {
		n, total int64
		want     string
	}{{0, 10, "[>         ]"}, {5, 10, "[=====>    ]"}, {10, 10, "[==========]"}, {20, 10, "[==========]"}, {3, 0, "[>         ]"}} {
		if got := bar(tc.n, tc.total, 10); got != tc.want {
			t.Errorf("bar(%d, %d) = %q, want %q", tc.n, tc.total, got, tc.want)
		}
	}
}
