package mountinfo

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

func TestUnescape(t *testing.T) {
	for in, want := range map[string]string{
		"/plain":             "/plain",
		`/a\040b`:            "/a b",
		`/tab\011nl\012`:     "/tab\tnl\n",
		`/back\134slash`:     `/back\slash`,
		`/not\08`:            `/not\08`, // 8 is no octal digit
		`/short\04`:          `/short\04`,
		`\040\040`:           "  ",
		`/mixed\040x\134\04`: `/mixed x\\04`,
	} {
		if got := Unescape(in); got != want {
			t.Errorf("Unescape(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestUnder: the mount points at or beneath dir, unescaped, in order; a
// sibling whose name starts like dir is not beneath it.
func TestUnder(t *testing.T) {
	table := `22 1 0:21 / / rw - ext4 /dev/sda1 rw
30 22 0:40 / /srv/run rw - tmpfs tmpfs rw
31 30 0:41 / /srv/run/a\040b rw,nosuid - overlay overlay rw,lowerdir=/x
32 22 0:42 / /srv/runner rw - tmpfs tmpfs rw
33 30 0:43 / /srv/run/a\040b rw - tmpfs tmpfs rw
short line

`
	path := filepath.Join(t.TempDir(), "mountinfo")
	if err := os.WriteFile(path, []byte(table), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := Under(path, "/srv/run")
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"/srv/run", "/srv/run/a b", "/srv/run/a b"}; !slices.Equal(got, want) {
		t.Errorf("Under = %q, want %q", got, want)
	}
	if _, err := Under(filepath.Join(t.TempDir(), "none"), "/"); err == nil {
		t.Error("Under of a missing table: no error")
	}
}
