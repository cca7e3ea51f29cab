// Package strictjson decodes a JSON object into a struct the way twill's
// configuration files must be read: keys match fields case-insensitively,
// an unknown key is an error that names it, and a value of the wrong type
// is an error that names the field and the value given ("SubnetLen "abc":
// must be a whole number"), where encoding/json names only Go types.
package strictjson

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"sort"
	"strings"
)

// FieldError is a rejected key or value.
type FieldError struct {
	Field  string // as the file spells it, with its path ("Backend.VNI")
	Value  string // the value given, as written (strings unquoted)
	Reason string
}

func (e *FieldError) Error() string {
	if strings.HasPrefix(e.Reason, "unknown key") {
		if e.Field == "" {
			return e.Reason
		}
		return fmt.Sprintf("%s: %s", e.Field, e.Reason)
	}
	if e.Field == "" {
		return fmt.Sprintf("%q: %s", e.Value, e.Reason)
	}
	return fmt.Sprintf("%s %q: %s", e.Field, e.Value, e.Reason)
}

// Decode decodes the JSON object data into dst, a pointer to a struct.
// path prefixes field names in errors ("Backend."). skip lists keys that
// are accepted and ignored (handled elsewhere).
func Decode(data []byte, dst any, path string, skip ...string) error {
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(data, &obj); err != nil {
		var se *json.SyntaxError
		if errors.As(err, &se) {
			return fmt.Errorf("%sdecoding: %w", where(path), err)
		}
		return &FieldError{Field: strings.TrimSuffix(path, "."), Value: Shown(data), Reason: "must be a JSON object"}
	}
	v := reflect.ValueOf(dst).Elem()
	t := v.Type()
	fields := map[string]int{}
	var names []string
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		name := f.Name
		if tag, _, _ := strings.Cut(f.Tag.Get("json"), ","); tag == "-" {
			continue
		} else if tag != "" {
			name = tag
		}
		fields[strings.ToLower(name)] = i
		names = append(names, name)
	}
	ignored := map[string]bool{}
	for _, k := range skip {
		ignored[strings.ToLower(k)] = true
	}
	keys := make([]string, 0, len(obj))
	for k := range obj {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if ignored[strings.ToLower(k)] {
			continue
		}
		i, ok := fields[strings.ToLower(k)]
		if !ok {
			sort.Strings(names)
			return &FieldError{Field: strings.TrimSuffix(path, "."), Reason: fmt.Sprintf("unknown key %q (known: %s)", k, strings.Join(names, ", "))}
		}
		fv := v.Field(i)
		if err := json.Unmarshal(obj[k], fv.Addr().Interface()); err != nil {
			name := t.Field(i).Name
			if tag, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ","); tag != "" {
				name = tag
			}
			return &FieldError{Field: path + name, Value: Shown(obj[k]), Reason: want(fv.Type())}
		}
	}
	return nil
}

// Shown renders a raw JSON value for an error: a string without its
// quotes, anything else as written (shortened).
func Shown(raw []byte) string {
	raw = bytes.TrimSpace(raw)
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	if len(raw) > 64 {
		return string(raw[:61]) + "..."
	}
	return string(raw)
}

// want says what a value of type t must be, in a user's words.
func want(t reflect.Type) string {
	if t == reflect.TypeOf(json.RawMessage(nil)) {
		return "must be JSON"
	}
	switch t.Kind() {
	case reflect.Pointer:
		return want(t.Elem())
	case reflect.Bool:
		return "must be true or false"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "must be a whole number"
	case reflect.Float32, reflect.Float64:
		return "must be a number"
	case reflect.String:
		return "must be a string"
	case reflect.Slice, reflect.Array:
		return "must be a list"
	case reflect.Struct, reflect.Map:
		return "must be a JSON object"
	}
	return "has the wrong type"
}

func where(path string) string {
	if path == "" {
		return ""
	}
	return strings.TrimSuffix(path, ".") + ": "
}
