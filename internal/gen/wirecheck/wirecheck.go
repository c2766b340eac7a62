// Package wirecheck compares hand-written wire types with the models
// generated from api/openapi, so that a field added, renamed or retyped on
// one side only fails a test. It is hand-written (unlike its sibling
// packages) and used only by tests.
package wirecheck

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"
)

// Response checks that v, a value a handler writes, is a valid instance of
// the generated model type M: it decodes into M with unknown fields
// disallowed, M encodes back to the same JSON (so no required field is
// missing and no value changes type), it carries no null (the specs omit
// optional fields instead), and every enum-typed value is a member of its
// enum.
func Response[M any](t testing.TB, what string, v any) {
	t.Helper()
	raw, err := json.Marshal(v)
	if err != nil {
		t.Fatalf("%s: marshal: %v", what, err)
	}
	var m M
	if err := strictDecode(raw, &m); err != nil {
		t.Errorf("%s: the code writes what the spec does not declare: %v\n  body: %s", what, err, raw)
		return
	}
	back, err := json.Marshal(m)
	if err != nil {
		t.Fatalf("%s: marshal model: %v", what, err)
	}
	var a, b any
	_ = json.Unmarshal(raw, &a)
	_ = json.Unmarshal(back, &b)
	if diffs := Diff("", a, b); len(diffs) > 0 {
		t.Errorf("%s: body and spec model differ (a required field is missing, or a value changed in the round trip):\n  %s\n  code:  %s\n  model: %s",
			what, strings.Join(diffs, "\n  "), raw, back)
	}
	for _, p := range Nulls("", a) {
		t.Errorf("%s: %s is null; the spec omits unset fields", what, p)
	}
	for _, p := range BadEnums("", reflect.ValueOf(m)) {
		t.Errorf("%s: %s is not one of the spec's enum values", what, p)
	}
}

// validator is the method oapi-codegen generates on enum types.
type validator interface{ Valid() bool }

// BadEnums lists the paths (with values) of enum-typed values in v that are
// not members of their enum.
func BadEnums(path string, v reflect.Value) []string {
	if !v.IsValid() {
		return nil
	}
	if v.CanInterface() {
		if e, ok := v.Interface().(validator); ok && v.Kind() != reflect.Pointer {
			if !e.Valid() {
				return []string{fmt.Sprintf("%s = %v", label(path), v.Interface())}
			}
			return nil
		}
	}
	var out []string
	switch v.Kind() {
	case reflect.Pointer, reflect.Interface:
		if !v.IsNil() {
			out = append(out, BadEnums(path, v.Elem())...)
		}
	case reflect.Slice, reflect.Array:
		for i := range v.Len() {
			out = append(out, BadEnums(fmt.Sprintf("%s[%d]", path, i), v.Index(i))...)
		}
	case reflect.Map:
		iter := v.MapRange()
		for iter.Next() {
			out = append(out, BadEnums(fmt.Sprintf("%s.%v", path, iter.Key()), iter.Value())...)
		}
	case reflect.Struct:
		for i := range v.NumField() {
			f := v.Type().Field(i)
			if !f.IsExported() {
				continue
			}
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			if name == "" || name == "-" {
				name = f.Name
			}
			out = append(out, BadEnums(path+"."+name, v.Field(i))...)
		}
	}
	sort.Strings(out)
	return out
}

// Request checks that the hand-written request type H accepts every field of
// the generated model M (a fully populated M decodes into H with unknown
// fields disallowed) and that H reads no JSON field that M lacks.
func Request[H, M any](t testing.TB, what string) {
	t.Helper()
	var m M
	Fill(reflect.ValueOf(&m).Elem())
	raw, err := json.Marshal(m)
	if err != nil {
		t.Fatalf("%s: marshal model: %v", what, err)
	}
	var h H
	if err := strictDecode(raw, &h); err != nil {
		t.Errorf("%s: the code does not accept what the spec declares: %v\n  body: %s", what, err, raw)
	}
	code, spec := Paths(reflect.TypeFor[H]()), Paths(reflect.TypeFor[M]())
	for _, p := range code.Sorted() {
		if !spec.Covers(p) {
			t.Errorf("%s: the code reads %q, which the spec does not declare", what, p)
		}
	}
}

func strictDecode(raw []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	return dec.Decode(v)
}

// Diff lists the differences between two decoded JSON trees.
func Diff(path string, a, b any) []string {
	switch av := a.(type) {
	case map[string]any:
		bv, ok := b.(map[string]any)
		if !ok {
			return []string{fmt.Sprintf("%s: %v vs %v", label(path), a, b)}
		}
		var out []string
		for _, k := range sortedKeys(av, bv) {
			x, inA := av[k]
			y, inB := bv[k]
			switch {
			case !inA:
				out = append(out, fmt.Sprintf("%s: missing from the code's body (model has %v)", path+"."+k, y))
			case !inB:
				out = append(out, fmt.Sprintf("%s: dropped by the model (code wrote %v)", path+"."+k, x))
			default:
				out = append(out, Diff(path+"."+k, x, y)...)
			}
		}
		return out
	case []any:
		bv, ok := b.([]any)
		if !ok || len(av) != len(bv) {
			return []string{fmt.Sprintf("%s: %v vs %v", label(path), a, b)}
		}
		var out []string
		for i := range av {
			out = append(out, Diff(fmt.Sprintf("%s[%d]", path, i), av[i], bv[i])...)
		}
		return out
	default:
		if !reflect.DeepEqual(a, b) {
			return []string{fmt.Sprintf("%s: %v vs %v", label(path), a, b)}
		}
		return nil
	}
}

// Nulls lists the paths of JSON nulls in a decoded tree.
func Nulls(path string, v any) []string {
	var out []string
	switch x := v.(type) {
	case nil:
		out = append(out, label(path))
	case map[string]any:
		for _, k := range sortedKeys(x, nil) {
			out = append(out, Nulls(path+"."+k, x[k])...)
		}
	case []any:
		for i, c := range x {
			out = append(out, Nulls(fmt.Sprintf("%s[%d]", path, i), c)...)
		}
	}
	return out
}

func label(p string) string {
	if p == "" {
		return "(body)"
	}
	return p
}

func sortedKeys(a, b map[string]any) []string {
	seen := map[string]bool{}
	for k := range a {
		seen[k] = true
	}
	for k := range b {
		seen[k] = true
	}
	out := make([]string, 0, len(seen))
	for k := range seen {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

var (
	timeType        = reflect.TypeFor[time.Time]()
	unmarshalerType = reflect.TypeFor[json.Unmarshaler]()
)

// Fill sets every field reachable from v to a non-zero value: strings "x",
// numbers 1, booleans true, a fixed time, one element per slice and one
// "k" entry per map.
func Fill(v reflect.Value) {
	if v.Type() == timeType {
		v.Set(reflect.ValueOf(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)))
		return
	}
	switch v.Kind() {
	case reflect.String:
		v.SetString("x")
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		v.SetInt(1)
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		v.SetUint(1)
	case reflect.Float32, reflect.Float64:
		v.SetFloat(1)
	case reflect.Pointer:
		p := reflect.New(v.Type().Elem())
		Fill(p.Elem())
		v.Set(p)
	case reflect.Slice:
		s := reflect.MakeSlice(v.Type(), 1, 1)
		Fill(s.Index(0))
		v.Set(s)
	case reflect.Map:
		m := reflect.MakeMap(v.Type())
		k := reflect.New(v.Type().Key()).Elem()
		Fill(k)
		e := reflect.New(v.Type().Elem()).Elem()
		Fill(e)
		m.SetMapIndex(k, e)
		v.Set(m)
	case reflect.Interface:
		v.Set(reflect.ValueOf("x"))
	case reflect.Struct:
		for i := range v.NumField() {
			f := v.Type().Field(i)
			if !f.IsExported() || f.Tag.Get("json") == "-" {
				continue
			}
			Fill(v.Field(i))
		}
	}
}

// PathSet is the set of JSON paths a type reads or writes: "a", "a.b",
// "a[]", "a.*" (map values), in lower case. Opaque marks paths whose type
// decodes itself.
type PathSet struct {
	All, Opaque map[string]bool
}

// Sorted returns the paths in order.
func (s PathSet) Sorted() []string {
	out := make([]string, 0, len(s.All))
	for p := range s.All {
		out = append(out, p)
	}
	sort.Strings(out)
	return out
}

// Covers reports whether p is in s or lies under an opaque path of s.
func (s PathSet) Covers(p string) bool {
	p = strings.ToLower(p)
	if s.All[p] {
		return true
	}
	for q := range s.Opaque {
		if strings.HasPrefix(p, q+".") || strings.HasPrefix(p, q+"[]") {
			return true
		}
	}
	return false
}

// Paths returns the JSON paths of t.
func Paths(t reflect.Type) PathSet {
	s := PathSet{All: map[string]bool{}, Opaque: map[string]bool{}}
	paths(t, "", s, map[reflect.Type]bool{})
	return s
}

func paths(t reflect.Type, prefix string, s PathSet, seen map[reflect.Type]bool) {
	if t == timeType {
		return
	}
	if t.Kind() != reflect.Pointer && reflect.PointerTo(t).Implements(unmarshalerType) {
		if prefix != "" {
			s.Opaque[prefix] = true
		}
		return
	}
	switch t.Kind() {
	case reflect.Pointer:
		paths(t.Elem(), prefix, s, seen)
	case reflect.Slice, reflect.Array:
		s.All[prefix+"[]"] = true
		paths(t.Elem(), prefix+"[]", s, seen)
	case reflect.Map:
		s.All[prefix+".*"] = true
		paths(t.Elem(), prefix+".*", s, seen)
	case reflect.Interface:
		if prefix != "" {
			s.Opaque[prefix] = true
		}
	case reflect.Struct:
		if seen[t] {
			return
		}
		seen[t] = true
		defer delete(seen, t)
		for i := range t.NumField() {
			f := t.Field(i)
			tag := f.Tag.Get("json")
			if tag == "-" {
				continue
			}
			name, _, _ := strings.Cut(tag, ",")
			if f.Anonymous && name == "" {
				paths(f.Type, prefix, s, seen)
				continue
			}
			if !f.IsExported() {
				continue
			}
			if name == "" {
				name = f.Name
			}
			// encoding/json matches names case-insensitively; so do paths.
			name = strings.ToLower(name)
			p := name
			if prefix != "" {
				p = prefix + "." + name
			}
			s.All[p] = true
			paths(f.Type, p, s, seen)
		}
	}
}
