package wire

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// parseFrames splits a stream into its events.
func parseFrames(t *testing.T, b []byte) []Event {
	t.Helper()
	var evs []Event
	for _, f := range bytes.Split(bytes.TrimSuffix(b, []byte("\n\n")), []byte("\n\n")) {
		if len(f) == 0 {
			continue
		}
		var ev Event
		if err := json.Unmarshal(f, &ev); err != nil {
			t.Fatalf("frame %q: %v", f, err)
		}
		evs = append(evs, ev)
	}
	return evs
}

func TestLineSplitterTable(t *testing.T) {
	for i, tc := range []struct {
		chunks []string
		want   []string
	}{
		0: {[]string{"a\nb"}, []string{"a", "b"}},
		1: {[]string{"a\r", "\nb\n"}, []string{"a", "b"}},
		2: {[]string{"\n\n"}, []string{"\n", "\n"}},
		3: {[]string{"ab", "cd\r\r\n"}, []string{"abcd", "\n"}},
		4: {[]string{""}, nil},
	} {
		l := NewLineSplitter(EvStdout)
		var out []byte
		for _, c := range tc.chunks {
			out = l.Append(out, []byte(c))
		}
		out = l.Flush(out)
		var got []string
		for _, ev := range parseFrames(t, out) {
			got = append(got, ev.Text)
		}
		if strings.Join(got, "|") != strings.Join(tc.want, "|") {
			t.Errorf("%d: got %q, want %q", i, got, tc.want)
		}
	}
}

func TestAppendJSONStringMatchesEncodingJSON(t *testing.T) {
	for i, s := range []string{"", "plain", `q"b\s`, "\x00\x01\x1f\t\n\r\b\f", "héllo ✓", "bad\xff\xfeutf8", "\u2028\u2029", "<&>", strings.Repeat("ab\x7f", 10)} {
		var buf bytes.Buffer
		enc := json.NewEncoder(&buf)
		enc.SetEscapeHTML(false)
		enc.Encode(s)
		want := strings.TrimSuffix(buf.String(), "\n")
		if got := string(AppendJSONString(nil, s)); got != want {
			t.Errorf("%d: got %s, want %s", i, got, want)
		}
	}
}
