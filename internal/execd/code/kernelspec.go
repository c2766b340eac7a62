package code

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/moat-sandbox/moat/internal/execd/proc"
)

// KernelSpec is a Jupyter kernelspec (<dir>/<name>/kernel.json).
type KernelSpec struct {
	Name          string            `json:"-"`
	Argv          []string          `json:"argv"`
	Language      string            `json:"language"`
	Env           map[string]string `json:"env"`
	InterruptMode string            `json:"interrupt_mode"` // "signal" (default) or "message"
}

// KernelDirs are the kernelspec directories in Jupyter's search order:
// $JUPYTER_PATH, the user's data dir, then the system ones.
func KernelDirs(env []string) []string {
	var dirs []string
	for _, p := range filepath.SplitList(proc.LookupEnv(env, "JUPYTER_PATH")) {
		if p != "" {
			dirs = append(dirs, filepath.Join(p, "kernels"))
		}
	}
	if d := proc.LookupEnv(env, "JUPYTER_DATA_DIR"); d != "" {
		dirs = append(dirs, filepath.Join(d, "kernels"))
	} else if h := proc.LookupEnv(env, "HOME"); h != "" {
		dirs = append(dirs, filepath.Join(h, ".local/share/jupyter/kernels"))
	}
	return append(dirs, "/usr/local/share/jupyter/kernels", "/usr/share/jupyter/kernels")
}

// FindKernelSpec returns the first usable kernelspec for language (a
// languageKey) in dirs, matched on the kernelspec's own "language" field,
// so any language the image has a kernel for works. Its argv[0] must
// resolve on the agent's PATH and its argv must take {connection_file}. As upstream execd does, a
// kernel named "python3" is used only when no other python kernel exists
// (images may ship one kernel per Python version next to it).
func FindKernelSpec(dirs []string, language string, env []string) *KernelSpec {
	var fallback *KernelSpec
	for _, dir := range dirs {
		ents, err := os.ReadDir(dir)
		if err != nil {
			continue
		}
		sort.Slice(ents, func(i, j int) bool { return ents[i].Name() < ents[j].Name() })
		for _, e := range ents {
			data, err := os.ReadFile(filepath.Join(dir, e.Name(), "kernel.json"))
			if err != nil {
				continue
			}
			var ks KernelSpec
			if json.Unmarshal(data, &ks) != nil || len(ks.Argv) == 0 || languageKey(ks.Language) != language {
				continue
			}
			if !strings.Contains(strings.Join(ks.Argv, "\x00"), "{connection_file}") {
				continue
			}
			if !filepath.IsAbs(ks.Argv[0]) {
				// A relative name with a slash would resolve against
				// whatever the agent's working directory is: only PATH
				// names and absolute paths are taken.
				p, err := proc.LookPath(ks.Argv[0], env)
				if err != nil || !filepath.IsAbs(p) {
					continue
				}
				ks.Argv[0] = p
			} else if _, err := os.Stat(ks.Argv[0]); err != nil {
				continue
			}
			ks.Name = e.Name()
			if ks.Name == "python3" && language == "python" {
				if fallback == nil {
					fallback = &ks
				}
				continue
			}
			return &ks
		}
	}
	return fallback
}

// ipykernelSpec is the spec of `python3 -m ipykernel_launcher` for an image
// that has ipykernel importable but no kernelspec installed.
func ipykernelSpec(ctx context.Context, env []string) *KernelSpec {
	for _, name := range []string{"python3", "python"} {
		py, err := proc.LookPath(name, env)
		if err != nil {
			continue
		}
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		cmd := exec.CommandContext(ctx, py, "-c", "import importlib.util, sys; sys.exit(importlib.util.find_spec('ipykernel_launcher') is None)")
		cmd.Env = env
		err = cmd.Run()
		cancel()
		if err == nil {
			return &KernelSpec{Name: "ipykernel", Argv: []string{py, "-m", "ipykernel_launcher", "-f", "{connection_file}"}, Language: "python"}
		}
		return nil
	}
	return nil
}

// kernelFor returns the Jupyter kernel to use for language (a
// languageKey), or nil to use a built-in driver. The answer is cached per
// language: kernelspecs are installed with the image, not at run time.
func (s *Service) kernelFor(ctx context.Context, language string) *KernelSpec {
	if s.opts.NoKernels {
		return nil
	}
	s.kernelMu.Lock()
	defer s.kernelMu.Unlock()
	if ks, ok := s.kernels[language]; ok {
		return ks
	}
	env := s.run.Env(nil)
	dirs := s.opts.KernelDirs
	if dirs == nil {
		dirs = KernelDirs(env)
	}
	ks := FindKernelSpec(dirs, language, env)
	if ks == nil && language == "python" && s.opts.KernelDirs == nil {
		ks = ipykernelSpec(ctx, env)
	}
	s.kernels[language] = ks
	return ks
}
