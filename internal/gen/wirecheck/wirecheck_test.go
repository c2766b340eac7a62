package wirecheck

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// recorder is a testing.TB that records failures instead of failing.
type recorder struct {
	testing.TB
	errs []string
}

func (r *recorder) Helper() {}
func (r *recorder) Errorf(format string, args ...any) {
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}
func (r *recorder) Fatalf(format string, args ...any) { r.Errorf(format, args...) }

type color string

func (c color) Valid() bool { return c == "red" || c == "blue" }

type model struct {
	ID    string      `json:"id"`
	Color *color      `json:"color,omitempty"`
	Hues  []color     `json:"hues,omitempty"`
	Name  *string     `json:"name,omitempty"`
	At    time.Time   `json:"at"`
	Tags  *[]string   `json:"tags,omitempty"`
	Inner *innerModel `json:"inner,omitempty"`
}

type innerModel struct {
	N int `json:"n"`
}

func TestResponse(t *testing.T) {
	at := "2026-01-02T03:04:05.5Z"
	for _, tc := range []struct {
		name string
		body any
		want string // substring of the failure; "" = passes
	}{
		{"conforming", map[string]any{"id": "a", "at": at, "tags": []string{"x"}, "inner": map[string]int{"n": 1}}, ""},
		{"optional omitted", map[string]any{"id": "a", "at": at}, ""},
		{"undeclared field", map[string]any{"id": "a", "at": at, "extra": 1}, `unknown field "extra"`},
		{"undeclared nested field", map[string]any{"id": "a", "at": at, "inner": map[string]int{"n": 1, "m": 2}}, `unknown field "m"`},
		{"required missing", map[string]any{"at": at}, ".id: missing from the code's body"},
		{"null optional", map[string]any{"id": "a", "at": at, "name": nil}, ".name: dropped by the model"},
		{"null required", map[string]any{"id": nil, "at": at}, ".id is null"},
		{"wrong type", map[string]any{"id": 5, "at": at}, "cannot unmarshal number"},
		{"bad time", map[string]any{"id": "a", "at": "yesterday"}, "cannot parse"},
		{"enum member", map[string]any{"id": "a", "at": at, "color": "red", "hues": []string{"blue"}}, ""},
		{"not an enum member", map[string]any{"id": "a", "at": at, "color": "green"}, ".color = green is not one of"},
		{"nested not an enum member", map[string]any{"id": "a", "at": at, "hues": []string{"red", "teal"}}, ".hues[1] = teal"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &recorder{TB: t}
			Response[model](r, tc.name, tc.body)
			got := strings.Join(r.errs, "\n")
			if tc.want == "" && got != "" {
				t.Fatalf("unexpected failure: %s", got)
			}
			if tc.want != "" && !strings.Contains(got, tc.want) {
				t.Fatalf("failure %q does not contain %q", got, tc.want)
			}
		})
	}
}

type reqModel struct {
	Name  string             `json:"name"`
	Count *int               `json:"count,omitempty"`
	Inner *innerModel        `json:"inner,omitempty"`
	Env   *map[string]string `json:"env,omitempty"`
}

type reqExact struct {
	Name  string            `json:"name"`
	Count int               `json:"count"`
	Inner struct{ N int }   `json:"inner"`
	Env   map[string]string `json:"env"`
}

type reqMissing struct {
	Name  string            `json:"name"`
	Count int               `json:"count"`
	Env   map[string]string `json:"env"`
}

type reqExtra struct {
	reqExact
	Debug bool `json:"debug"`
}

type reqRetyped struct {
	Name  string            `json:"name"`
	Count string            `json:"count"`
	Inner struct{ N int }   `json:"inner"`
	Env   map[string]string `json:"env"`
}

func TestRequest(t *testing.T) {
	for _, tc := range []struct {
		name  string
		check func(testing.TB)
		want  string
	}{
		{"exact", func(tb testing.TB) { Request[reqExact, reqModel](tb, "exact") }, ""},
		{"code lacks a spec field", func(tb testing.TB) { Request[reqMissing, reqModel](tb, "missing") }, `unknown field "inner"`},
		{"code reads an undeclared field", func(tb testing.TB) { Request[reqExtra, reqModel](tb, "extra") }, `reads "debug"`},
		{"code types a field differently", func(tb testing.TB) { Request[reqRetyped, reqModel](tb, "retyped") }, "cannot unmarshal number"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &recorder{TB: t}
			tc.check(r)
			got := strings.Join(r.errs, "\n")
			if tc.want == "" && got != "" {
				t.Fatalf("unexpected failure: %s", got)
			}
			if tc.want != "" && !strings.Contains(got, tc.want) {
				t.Fatalf("failure %q does not contain %q", got, tc.want)
			}
		})
	}
}
