package files

import (
	"os"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestParseMode(t *testing.T) {
	for i, tc := range []struct {
		in   int
		want os.FileMode
		ok   bool
	}{
		0: {755, 0o755, true},
		1: {644, 0o644, true},
		2: {0, 0o640, true},
		3: {789, 0, false},
		4: {4755, 0o755 | os.ModeSetuid, true},
	} {
		got, err := parseMode(tc.in, 0o640)
		if (err == nil) != tc.ok || (tc.ok && got != tc.want) {
			t.Errorf("%d: parseMode(%d) = %v, %v", i, tc.in, got, err)
		}
		if tc.ok && tc.in != 0 && formatMode(got) != tc.in {
			t.Errorf("%d: formatMode = %d", i, formatMode(got))
		}
	}
}
