package backend

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
)

// DecodeConfig decodes a backend's raw net-conf.json Backend object into
// dst, a pointer to a struct. Keys match field names case-insensitively, and
// a key that matches no field is rejected with its name. "Type" is always
// accepted.
func DecodeConfig(raw json.RawMessage, dst any) error {
	if len(bytes.TrimSpace(raw)) == 0 || string(bytes.TrimSpace(raw)) == "null" {
		return nil
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(raw, &obj); err != nil {
		return fmt.Errorf("net-conf.json: Backend: %w", err)
	}
	known := map[string]bool{"type": true}
	t := reflect.TypeOf(dst).Elem()
	for i := range t.NumField() {
		f := t.Field(i)
		name := f.Name
		if tag, _, _ := strings.Cut(f.Tag.Get("json"), ","); tag != "" && tag != "-" {
			name = tag
		}
		known[strings.ToLower(name)] = true
	}
	for k := range obj {
		if !known[strings.ToLower(k)] {
			return fmt.Errorf("net-conf.json: Backend: unknown key %q", k)
		}
	}
	if err := json.Unmarshal(raw, dst); err != nil {
		var te *json.UnmarshalTypeError
		if ok := asTypeError(err, &te); ok {
			return fmt.Errorf("net-conf.json: Backend.%s: value of type %s where %s is expected", te.Field, te.Value, te.Type)
		}
		return fmt.Errorf("net-conf.json: Backend: %w", err)
	}
	return nil
}

func asTypeError(err error, te **json.UnmarshalTypeError) bool {
	return errors.As(err, te)
}
