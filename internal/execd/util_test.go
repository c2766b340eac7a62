package execd

import "os"

func writeFile(p, s string) error { return os.WriteFile(p, []byte(s), 0o644) }

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}
