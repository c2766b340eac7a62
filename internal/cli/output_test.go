package cli

import (
	"bytes"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/moat-sandbox/moat/client"
)

func TestSplitWords(t *testing.T) {
	for i, tc := range []struct {
		in   string
		want []string
		err  bool
	}{
		{"tail -f /dev/null", []string{"tail", "-f", "/dev/null"}, false},
		{`  sh   -c  'echo a  b; exit 3' `, []string{"sh", "-c", "echo a  b; exit 3"}, false},
		{`python3 -c "print(\"hi\")"`, []string{"python3", "-c", `print("hi")`}, false},
		{`a\ b '' c`, []string{"a b", "", "c"}, false},
		{"", nil, false},
		{`echo 'open`, nil, true},
		{`trailing\`, nil, true},
	} {
		got, err := splitWords(tc.in)
		if (err != nil) != tc.err || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%d: splitWords(%q) = %q, %v; want %q, err %v", i, tc.in, got, err, tc.want, tc.err)
		}
	}
}

func TestShellQuote(t *testing.T) {
	for i, tc := range []struct {
		argv []string
		want string
	}{
		{[]string{"echo a; exit 3"}, "echo a; exit 3"}, // one word: a script, as is
		{[]string{"ls", "-la", "/tmp"}, "ls -la /tmp"},
		{[]string{"echo", "a b", "it's", ""}, `echo 'a b' 'it'\''s' ''`},
		{[]string{"sh", "-c", "exit 3"}, "sh -c 'exit 3'"},
		{[]string{"env", "A=1", "$HOME"}, `env A=1 '$HOME'`},
	} {
		if got := shellQuote(tc.argv); got != tc.want {
			t.Errorf("%d: shellQuote(%q) = %q, want %q", i, tc.argv, got, tc.want)
		}
	}
	// Round trip through splitWords.
	argv := []string{"a b", "c'd", `e"f`, "g"}
	if got, err := splitWords(quoteArgv(argv)); err != nil || !reflect.DeepEqual(got, argv) {
		t.Fatalf("round trip %q -> %q (%v)", argv, got, err)
	}
}

func TestParseKV(t *testing.T) {
	m, err := parseKV("env", []string{"A=1", "B=x=y", "C="})
	if err != nil || !reflect.DeepEqual(m, map[string]string{"A": "1", "B": "x=y", "C": ""}) {
		t.Fatalf("parseKV = %v, %v", m, err)
	}
	for _, bad := range []string{"NOEQ", "=v"} {
		if _, err := parseKV("env", []string{bad}); err == nil || ExitCode(err) != 2 || !strings.Contains(err.Error(), "--env") {
			t.Errorf("parseKV(%q) = %v, want an invalid-argument error naming --env", bad, err)
		}
	}
	m, err = parseKVList("resource", []string{"cpu=1, memory=512Mi", "pids=10"})
	if err != nil || !reflect.DeepEqual(m, map[string]string{"cpu": "1", "memory": "512Mi", "pids": "10"}) {
		t.Fatalf("parseKVList = %v, %v", m, err)
	}
	if got := joinKV(map[string]string{"b": "2", "a": "1"}); got != "a=1,b=2" {
		t.Fatalf("joinKV = %q", got)
	}
}

func TestOutputFlag(t *testing.T) {
	var o outputFormat
	for _, v := range []string{"table", "json", "yaml"} {
		if err := o.Set(v); err != nil || string(o) != v {
			t.Fatalf("Set(%q) = %v (%q)", v, err, o)
		}
	}
	if err := o.Set("xml"); err == nil {
		t.Fatal("Set(xml) accepted")
	}
	_, errOut, code := runMoat(t, nil, "sandbox", "ls", "--server", "http://127.0.0.1:1", "-o", "xml")
	if code != 2 || !strings.Contains(errOut, "must be table, json or yaml") {
		t.Fatalf("-o xml: exit %d, %q", code, errOut)
	}
}

func TestRender(t *testing.T) {
	created := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	exp := created.Add(10 * time.Minute)
	sb := client.Sandbox{ID: "sb1", Image: &client.ImageSpec{URI: "busybox"}, Status: client.SandboxStatus{State: "Running"},
		Metadata: map[string]string{"team": "ml"}, Entrypoint: []string{"tail", "-f", "/dev/null"}, CreatedAt: created, ExpiresAt: &exp}

	var buf bytes.Buffer
	if err := render(&buf, outputYAML, sb, nil); err != nil {
		t.Fatal(err)
	}
	want := `id: sb1
image:
  uri: busybox
status:
  state: Running
metadata:
  team: ml
entrypoint:
  - tail
  - -f
  - /dev/null
expiresAt: "2026-01-02T03:14:05Z"
createdAt: "2026-01-02T03:04:05Z"
`
	if buf.String() != want {
		t.Fatalf("yaml:\n%s\nwant:\n%s", buf.String(), want)
	}

	buf.Reset()
	if err := render(&buf, outputJSON, sb, nil); err != nil || !strings.Contains(buf.String(), "\n  \"id\": \"sb1\",\n") {
		t.Fatalf("json: %v\n%s", err, buf.String())
	}

	buf.Reset()
	now := created.Add(90 * time.Second)
	paused := sb
	paused.ID, paused.Status.State, paused.Image, paused.SnapshotID, paused.ExpiresAt, paused.Metadata = "sb2", "Paused", nil, "snap1", nil, nil
	render(&buf, outputTable, nil, func(tw *tabwriter.Writer) { sandboxTable(tw, []client.Sandbox{sb, paused}, now) })
	wantTable := `ID   STATE    IMAGE           AGE  EXPIRES  METADATA
sb1  Running  busybox         1m   in 8m    team=ml
sb2  Paused   snapshot:snap1  1m   never    -
`
	if buf.String() != wantTable {
		t.Fatalf("table:\n%s\nwant:\n%s", buf.String(), wantTable)
	}
}

func TestAge(t *testing.T) {
	now := time.Date(2026, 1, 10, 0, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		d    time.Duration
		want string
	}{{5 * time.Second, "5s"}, {3 * time.Minute, "3m"}, {5 * time.Hour, "5h"}, {72 * time.Hour, "3d"}, {-time.Second, "0s"}} {
		if got := age(now, now.Add(-tc.d)); got != tc.want {
			t.Errorf("age(%v) = %q, want %q", tc.d, got, tc.want)
		}
	}
	past := now.Add(-time.Second)
	if got := until(now, &past); got != "expired" {
		t.Errorf("until(past) = %q", got)
	}
}

func TestClassify(t *testing.T) {
	for _, tc := range []struct {
		status int
		code   int
	}{{404, 4}, {400, 2}, {422, 2}, {409, 3}, {401, 1}, {500, 1}, {503, 1}} {
		ae := &client.APIError{StatusCode: tc.status, Code: "X::Y", Message: "went wrong", RequestID: "r1"}
		err := classify(fmt.Errorf("sandbox %q: agent endpoint: %w", "s1", ae))
		if got := ExitCode(err); got != tc.code {
			t.Errorf("HTTP %d: exit %d, want %d", tc.status, got, tc.code)
		}
		want := fmt.Sprintf(`sandbox "s1": agent endpoint: X::Y: went wrong (HTTP %d, request r1)`, tc.status)
		if err.Error() != want {
			t.Errorf("HTTP %d: %q, want %q", tc.status, err.Error(), want)
		}
		if !errors.Is(err, ae) || classify(err) != err {
			t.Errorf("HTTP %d: classify is not idempotent or lost the API error", tc.status)
		}
	}
	plain := errors.New("dial tcp: refused")
	if classify(plain) != plain || classify(nil) != nil {
		t.Fatal("classify changed a non-API error")
	}
}
