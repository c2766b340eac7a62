// Package mountinfo reads the kernel's mount tables
// (/proc/<pid>/mountinfo): the one place that knows their format, for the
// runtime's and the tests' checks and cleanups of what is mounted where.
package mountinfo

import (
	"os"
	"strconv"
	"strings"
)

// Under lists the mount points at or beneath dir (a clean path) in the
// mount table at path, such as /proc/self/mountinfo, in the table's
// order (a point mounted over twice is listed twice).
func Under(path, dir string) ([]string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var out []string
	for line := range strings.SplitSeq(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) < 5 {
			continue
		}
		mp := Unescape(f[4])
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			out = append(out, mp)
		}
	}
	return out, nil
}

// Unescape decodes the octal escapes of a mountinfo field (\040 for a
// space, \011 a tab, \012 a newline, \134 a backslash).
func Unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
