package e2bcode

import (
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strings"
)

// envName is a variable name every language can set.
var envName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// checkEnv refuses a variable name not every language can set.
func checkEnv(envs map[string]string) error {
	for k := range envs {
		if !envName.MatchString(k) {
			return fmt.Errorf("invalid environment variable name %q", k)
		}
	}
	return nil
}

// withEnv returns code preceded by what sets envs in the interpreter of
// language, and the cleanup cell that puts the previous values back after
// it ("" when envs is empty). A language without a way to set them is an
// error.
func withEnv(language, code string, envs map[string]string) (cell, cleanup string, err error) {
	if len(envs) == 0 {
		return code, "", nil
	}
	if err := checkEnv(envs); err != nil {
		return "", "", err
	}
	keys := make([]string, 0, len(envs))
	for k := range envs {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	js := func(v any) string { b, _ := json.Marshal(v); return string(b) }
	switch language {
	case "python":
		// JSON strings are Python string literals.
		set := "import os as _e2b_os; _e2b_prev = {k: _e2b_os.environ.get(k) for k in " + js(keys) + "}; _e2b_os.environ.update(" + js(envs) + ")\n"
		return set + code, "for _e2b_k, _e2b_v in _e2b_prev.items():\n" +
			"    _e2b_os.environ.pop(_e2b_k, None) if _e2b_v is None else _e2b_os.environ.__setitem__(_e2b_k, _e2b_v)\n", nil
	case "javascript", "typescript":
		// eval keeps the statements out of TypeScript's type checks.
		set := "globalThis.__e2bPrev = Object.fromEntries(" + js(keys) + ".map(k => [k, process.env[k]])); Object.assign(process.env, " + js(envs) + ");"
		restore := "for (const [k, v] of Object.entries(globalThis.__e2bPrev)) { if (v === undefined) delete process.env[k]; else process.env[k] = v; }"
		return "eval(" + js(set) + ");\n" + code, "eval(" + js(restore) + ");\n", nil
	case "bash":
		var set, restore strings.Builder
		for _, k := range keys {
			fmt.Fprintf(&set, "_e2b_prev_%s=${%s-__e2b_unset__}; export %s=%s\n", k, k, k, shellQuote(envs[k]))
			fmt.Fprintf(&restore, "if [ \"$_e2b_prev_%s\" = __e2b_unset__ ]; then unset %s; else export %s=\"$_e2b_prev_%s\"; fi; unset _e2b_prev_%s\n", k, k, k, k, k)
		}
		return set.String() + code, restore.String(), nil
	case "r":
		var set, restore strings.Builder
		set.WriteString(".e2b_prev <- Sys.getenv(" + rVector(keys) + ", unset = NA); ")
		set.WriteString("invisible(do.call(Sys.setenv, as.list(" + rNamed(envs, keys) + ")))\n")
		restore.WriteString("invisible(lapply(names(.e2b_prev), function(k) if (is.na(.e2b_prev[[k]])) Sys.unsetenv(k) else do.call(Sys.setenv, setNames(list(.e2b_prev[[k]]), k))))\n")
		return set.String() + code, restore.String(), nil
	}
	return "", "", fmt.Errorf("env_vars are not supported for language %s", language)
}

// shellQuote quotes s for bash.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// rVector is an R character vector of ss (JSON strings are R strings).
func rVector(ss []string) string {
	parts := make([]string, len(ss))
	for i, s := range ss {
		b, _ := json.Marshal(s)
		parts[i] = string(b)
	}
	return "c(" + strings.Join(parts, ", ") + ")"
}

// rNamed is an R named character vector of envs, in keys' order.
func rNamed(envs map[string]string, keys []string) string {
	parts := make([]string, len(keys))
	for i, k := range keys {
		b, _ := json.Marshal(envs[k])
		parts[i] = k + " = " + string(b)
	}
	return "c(" + strings.Join(parts, ", ") + ")"
}
