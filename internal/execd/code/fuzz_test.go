package code

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// FuzzKernelSpec reads arbitrary kernel.json files (an image's, so
// untrusted) for arbitrary languages: no panic, and a spec is picked only
// if it is usable: its language is the one asked for, argv[0] is an
// absolute path that exists and argv takes {connection_file}.
func FuzzKernelSpec(f *testing.F) {
	f.Add("python", `{"argv":["python3","-m","ipykernel_launcher","-f","{connection_file}"],"display_name":"Python 3","language":"python"}`)
	f.Add("javascript", `{"argv":["/bin/sh","--kernel","{connection_file}"],"language":"JavaScript","env":{"A":"1"},"interrupt_mode":"message"}`)
	f.Add("go", `{"argv":["sh"],"language":"go"}`)
	f.Add("python", `{"argv":[],"language":"python"}`)
	f.Add("r", `{"argv":["../../bin/sh","{connection_file}"],"language":"R"}`)
	f.Add("python", `{"argv":null,"language":7}`)
	f.Add("bash", `[`)
	f.Fuzz(func(t *testing.T, language, kernelJSON string) {
		dir := filepath.Join(t.TempDir(), "kernels")
		if err := os.MkdirAll(filepath.Join(dir, "k"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "k", "kernel.json"), []byte(kernelJSON), 0o644); err != nil {
			t.Fatal(err)
		}
		lang := languageKey(language)
		ks := FindKernelSpec([]string{dir}, lang, []string{"PATH=/usr/bin:/bin"})
		if ks == nil {
			return
		}
		if languageKey(ks.Language) != lang || len(ks.Argv) == 0 || !filepath.IsAbs(ks.Argv[0]) ||
			!slices.ContainsFunc(ks.Argv, func(a string) bool { return strings.Contains(a, "{connection_file}") }) {
			t.Fatalf("picked an unusable spec for %q: %+v", lang, ks)
		}
		if _, err := os.Stat(ks.Argv[0]); err != nil {
			t.Fatalf("argv[0] does not exist: %+v", ks)
		}
	})
}
