package code

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/execd/wire"
)

// languageKey is the form in which languages are compared: lower case,
// with the usual aliases folded (kernelspecs say "R" or "python3", clients
// send "r" or "python"). Contexts keep the language as the client sent it.
func languageKey(l string) string {
	switch l = strings.ToLower(strings.TrimSpace(l)); l {
	case "python3", "py":
		return "python"
	case "js", "node", "nodejs":
		return "javascript"
	case "ts":
		return "typescript"
	case "golang":
		return "go"
	case "sh", "shell":
		return "bash"
	}
	return l
}

// upstreamLanguages are the languages OpenSandbox's execd knows
// (runtime.Language): a context for one of them that the image cannot run
// is a missing runtime, not an unknown language.
var upstreamLanguages = map[string]bool{
	"bash": true, "python": true, "java": true, "javascript": true, "typescript": true, "go": true, "sql": true,
}

// validLanguage reports whether l can name a language: kernelspec
// languages are short identifiers ("python", "R", "c++", "q#").
func validLanguage(l string) bool {
	if l == "" || len(l) > 64 {
		return false
	}
	for _, c := range l {
		if c <= ' ' || c > '~' || c == '/' || c == '\\' {
			return false
		}
	}
	return true
}

// backendFor picks what runs a new context of language: the image's
// Jupyter kernel for it when there is one (any language a kernelspec
// declares), else a built-in driver, else an error that says what the
// image lacks.
func (s *Service) backendFor(ctx context.Context, language string) (*KernelSpec, *driver, error) {
	key := languageKey(language)
	if ks := s.kernelFor(ctx, key); ks != nil {
		return ks, nil, nil
	}
	d, err := findDriver(key, s.run.BaseEnv(), s.run.Shell())
	if err != nil {
		return nil, nil, err
	}
	if d != nil {
		return nil, d, nil
	}
	if upstreamLanguages[key] {
		return nil, nil, errdefs.WithPublic(fmt.Errorf("language %s: %w", key, errdefs.ErrNotImplemented), wire.CodeRuntimeError,
			"language runtime not available: the image has no Jupyter kernel for "+key+
				" (built-in interpreters: bash, python, javascript, typescript, java)")
	}
	return nil, nil, errdefs.Invalid(wire.CodeInvalidRequestBody, "unknown language "+strconv.Quote(language)+
		": the image has no Jupyter kernel whose kernelspec declares it (built-in interpreters: bash, python, javascript, typescript, java)")
}
