package mcp

import (
	"strings"
	"testing"
)

func TestCapture(t *testing.T) {
	for i, tc := range []struct {
		limit     int
		writes    []string
		want      string
		truncated bool
	}{
		{10, nil, "", false},
		{10, []string{"abc", "def"}, "abcdef", false},
		{10, []string{"0123456789"}, "0123456789", false},
		{10, []string{"01234", "56789"}, "0123456789", false},
		{10, []string{"0123456789x"}, "01234\n[... 1 bytes omitted ...]\n6789x", true},
		{10, []string{"012", "345", "678", "9ab", "cde"}, "01234\n[... 5 bytes omitted ...]\nabcde", true},
		{10, []string{"01234", strings.Repeat("z", 100), "tail!"}, "01234\n[... 100 bytes omitted ...]\ntail!", true},
		{1, []string{"ab"}, "a\n[... 1 bytes omitted ...]\n", true},
		// Cuts never split a UTF-8 character: "é" is 2 bytes.
		{6, []string{"abé", "ééé", "xéy"}, "ab\n[... 9 bytes omitted ...]\néy", true},
		{4, []string{"abé", "ééé", "xéy"}, "ab\n[... 11 bytes omitted ...]\ny", true},
	} {
		c := newCapture(tc.limit)
		for _, w := range tc.writes {
			c.write([]byte(w))
		}
		if got := c.String(); got != tc.want || c.truncated() != tc.truncated {
			t.Errorf("%d: got %q truncated=%v, want %q truncated=%v", i, got, c.truncated(), tc.want, tc.truncated)
		}
	}
}

func TestCaptureLines(t *testing.T) {
	c := newCapture(8)
	for _, l := range []string{"a", "b", "c", "d"} {
		c.line(l)
	}
	if got := c.String(); got != "a\nb\nc\nd\n" || c.truncated() {
		t.Fatalf("got %q", got)
	}
	c.line("e")
	if got := c.String(); got != "a\nb\n\n[... 2 bytes omitted ...]\nd\ne\n" || !c.truncated() {
		t.Fatalf("got %q", got)
	}
}
