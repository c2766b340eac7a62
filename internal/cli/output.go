package cli

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"
	"gopkg.in/yaml.v3"

	"github.com/moat-sandbox/moat/client"
	"github.com/moat-sandbox/moat/internal/errdefs"
)

// outputFormat is the -o flag of listing and get verbs.
type outputFormat string

const (
	outputTable outputFormat = "table"
	outputJSON  outputFormat = "json"
	outputYAML  outputFormat = "yaml"
)

func (o *outputFormat) String() string { return string(*o) }
func (o *outputFormat) Type() string   { return "format" }
func (o *outputFormat) Set(v string) error {
	switch outputFormat(v) {
	case outputTable, outputJSON, outputYAML:
		*o = outputFormat(v)
		return nil
	case "wide":
		*o = outputTable
		return nil
	}
	return fmt.Errorf("must be table, json or yaml")
}

func addOutputFlag(cmd *cobra.Command, o *outputFormat) {
	*o = outputTable
	cmd.Flags().VarP(o, "output", "o", "output format: table, json or yaml")
}

// render writes v as JSON or YAML, or calls table for the human form.
func render(w io.Writer, o outputFormat, v any, table func(tw *tabwriter.Writer)) error {
	switch o {
	case outputJSON:
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	case outputYAML:
		b, err := toYAML(v)
		if err != nil {
			return err
		}
		_, err = w.Write(b)
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	table(tw)
	return tw.Flush()
}

// toYAML renders v's JSON form as block YAML, keeping the JSON field
// names and order (JSON is YAML, so it parses into a node tree whose
// flow styles are then cleared).
func toYAML(v any) ([]byte, error) {
	j, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	var n yaml.Node
	if err := yaml.Unmarshal(j, &n); err != nil {
		return nil, err
	}
	var clear func(*yaml.Node)
	clear = func(n *yaml.Node) {
		n.Style = 0
		for _, c := range n.Content {
			clear(c)
		}
	}
	clear(&n)
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(&n); err != nil {
		return nil, err
	}
	return buf.Bytes(), enc.Close()
}

// apiError is an SDK error as the CLI shows it ("CODE: message (HTTP 404,
// request id)"), carrying the errdefs class that ExitCode maps.
type apiError struct {
	ae    *client.APIError
	class error
}

func (e *apiError) Error() string {
	var b strings.Builder
	if e.ae.Code != "" {
		b.WriteString(e.ae.Code + ": ")
	}
	b.WriteString(e.ae.Message)
	fmt.Fprintf(&b, " (HTTP %d", e.ae.StatusCode)
	if e.ae.RequestID != "" {
		b.WriteString(", request " + e.ae.RequestID)
	}
	b.WriteString(")")
	return b.String()
}

func (e *apiError) Unwrap() []error { return []error{e.class, e.ae} }

// classify turns an SDK error into a CLI error whose class ExitCode knows.
func classify(err error) error {
	var ae *client.APIError
	var done *apiError
	if err == nil || !errors.As(err, &ae) || errors.As(err, &done) {
		return err
	}
	class := errdefs.ErrInternal
	switch {
	case ae.StatusCode == http.StatusNotFound:
		class = errdefs.ErrNotFound
	case client.IsInvalid(ae):
		class = errdefs.ErrInvalidArgument
	case ae.StatusCode == http.StatusConflict:
		class = errdefs.ErrConflict
	case ae.StatusCode == http.StatusUnauthorized:
		class = errdefs.ErrUnauthenticated
	case ae.StatusCode == http.StatusForbidden:
		class = errdefs.ErrPermissionDenied
	case ae.StatusCode == http.StatusNotImplemented:
		class = errdefs.ErrNotImplemented
	case ae.StatusCode == http.StatusServiceUnavailable || ae.StatusCode == http.StatusBadGateway:
		class = errdefs.ErrUnavailable
	}
	e := &apiError{ae: ae, class: class}
	if ae.Error() == err.Error() || !strings.HasSuffix(err.Error(), ": "+ae.Error()) {
		return e
	}
	// Keep the SDK's context ("sandbox x: agent endpoint: ...") but show
	// the API error in the CLI's form.
	return fmt.Errorf("%s: %w", strings.TrimSuffix(err.Error(), ": "+ae.Error()), e)
}

// classifyTree wraps the RunE of cmd and its descendants with classify,
// and makes flag and argument errors invalid-argument errors (exit 2).
func classifyTree(cmd *cobra.Command) *cobra.Command {
	usage := func(err error) error {
		if err == nil {
			return nil
		}
		return errdefs.Invalid("CLI::INVALID_ARGS", err.Error())
	}
	cmd.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usage(err) })
	if run := cmd.RunE; run != nil {
		cmd.RunE = func(c *cobra.Command, args []string) error { return classify(run(c, args)) }
	}
	if check := cmd.Args; check != nil {
		cmd.Args = func(c *cobra.Command, args []string) error { return usage(check(c, args)) }
	}
	for _, c := range cmd.Commands() {
		classifyTree(c)
	}
	return cmd
}

// parseKV parses K=V pairs (repeatable --env/--metadata values). An empty
// key is an error; an empty value is allowed.
func parseKV(flag string, pairs []string) (map[string]string, error) {
	if len(pairs) == 0 {
		return nil, nil
	}
	m := make(map[string]string, len(pairs))
	for _, p := range pairs {
		k, v, ok := strings.Cut(p, "=")
		if !ok || k == "" {
			return nil, errdefs.Invalid("CLI::INVALID_FLAG", fmt.Sprintf("--%s %q: want KEY=VALUE", flag, p))
		}
		m[k] = v
	}
	return m, nil
}

// parseKVList parses comma-separated K=V lists, repeatable
// (--resource cpu=1,memory=512Mi --resource pids=100).
func parseKVList(flag string, lists []string) (map[string]string, error) {
	var pairs []string
	for _, l := range lists {
		for p := range strings.SplitSeq(l, ",") {
			if p = strings.TrimSpace(p); p != "" {
				pairs = append(pairs, p)
			}
		}
	}
	return parseKV(flag, pairs)
}

// joinKV renders a map as sorted k=v pairs.
func joinKV(m map[string]string) string {
	if len(m) == 0 {
		return "-"
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for i, k := range keys {
		keys[i] = k + "=" + m[k]
	}
	return strings.Join(keys, ",")
}

// shellQuote joins argv into one command line for the agent's `sh -c`,
// quoting only the words that need it. A single argument is passed as is,
// so `moat exec ID -- 'echo a; exit 3'` runs a script.
func shellQuote(argv []string) string {
	if len(argv) == 1 {
		return argv[0]
	}
	return quoteArgv(argv)
}

// quoteArgv joins argv into a command line, quoting words as sh needs.
func quoteArgv(argv []string) string {
	out := make([]string, len(argv))
	for i, a := range argv {
		out[i] = quoteWord(a)
	}
	return strings.Join(out, " ")
}

func quoteWord(s string) string {
	if s == "" {
		return "''"
	}
	safe := true
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_./=:,+@%^", r)) {
			safe = false
			break
		}
	}
	if safe {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// splitWords splits a command line into words (whitespace separated,
// with '…' and "…" quoting and \ escapes), for --entrypoint.
func splitWords(s string) ([]string, error) {
	var words []string
	var cur strings.Builder
	inWord := false
	var quote rune
	escaped := false
	for _, r := range s {
		switch {
		case escaped:
			cur.WriteRune(r)
			escaped = false
		case quote != 0:
			if r == quote {
				quote = 0
			} else if r == '\\' && quote == '"' {
				escaped = true
			} else {
				cur.WriteRune(r)
			}
		case r == '\\':
			escaped, inWord = true, true
		case r == '\'' || r == '"':
			quote, inWord = r, true
		case r == ' ' || r == '\t' || r == '\n':
			if inWord {
				words = append(words, cur.String())
				cur.Reset()
				inWord = false
			}
		default:
			cur.WriteRune(r)
			inWord = true
		}
	}
	if quote != 0 || escaped {
		return nil, errdefs.Invalid("CLI::INVALID_FLAG", fmt.Sprintf("unterminated quote or escape in %q", s))
	}
	if inWord {
		words = append(words, cur.String())
	}
	return words, nil
}

// age renders the time since t ("45s", "3m", "2h", "5d").
func age(now, t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	d := now.Sub(t)
	switch {
	case d < 0:
		return "0s"
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh", int(d.Hours()))
	}
	return fmt.Sprintf("%dd", int(d.Hours()/24))
}

// until renders the time left until t ("in 9m", "expired", "never").
func until(now time.Time, t *time.Time) string {
	if t == nil {
		return "never"
	}
	if !t.After(now) {
		return "expired"
	}
	return "in " + age(now, now.Add(-t.Sub(now)))
}

// isTerminal reports whether w is a terminal.
func isTerminal(w any) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}
