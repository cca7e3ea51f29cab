package cnpapi

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
)

// Decode reads one policy from its JSON form (an unstructured object's
// content). The fields it does not know (a newer API's) are listed in
// Unknown with their paths ("spec.egress[0].to[1].someNewPeer"): the
// caller must not enforce a policy, or a rule, it read only in part.
func Decode(obj map[string]any) (*ClusterNetworkPolicy, error) {
	var unknowns []string
	unknown(obj, reflect.TypeFor[ClusterNetworkPolicy](), "", &unknowns)
	raw, err := json.Marshal(obj)
	if err != nil {
		return nil, fmt.Errorf("encoding: %w", err)
	}
	var p ClusterNetworkPolicy
	if err := json.Unmarshal(raw, &p); err != nil {
		if te := (*json.UnmarshalTypeError)(nil); errors.As(err, &te) {
			return nil, fmt.Errorf("%s: %s is not a %s", te.Field, te.Value, te.Type)
		}
		return nil, fmt.Errorf("decoding: %w", err)
	}
	p.Unknown = unknowns
	return &p, nil
}

// unknown adds to out the path of each key of v (as JSON decodes it) that
// type t has no field for.
func unknown(v any, t reflect.Type, path string, out *[]string) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.Struct:
		m, ok := v.(map[string]any)
		if !ok {
			return // a type error: json.Unmarshal names it
		}
		if t.PkgPath() == "k8s.io/apimachinery/pkg/apis/meta/v1" && (t.Name() == "ObjectMeta" || t.Name() == "Time") {
			return // the apiserver's own, not the policy's
		}
		fields := jsonFields(t)
		for _, k := range slices.Sorted(maps.Keys(m)) {
			f, ok := fields[k]
			if !ok {
				*out = append(*out, join(path, k))
				continue
			}
			unknown(m[k], f.typ, join(path, k), out)
		}
	case reflect.Slice:
		s, ok := v.([]any)
		if !ok {
			return
		}
		for i, e := range s {
			unknown(e, t.Elem(), fmt.Sprintf("%s[%d]", path, i), out)
		}
	case reflect.Map:
		m, ok := v.(map[string]any)
		if !ok {
			return
		}
		for _, k := range slices.Sorted(maps.Keys(m)) {
			unknown(m[k], t.Elem(), join(path, k), out)
		}
	}
}

type field struct {
	typ reflect.Type
}

// jsonFields maps a struct's JSON keys to their types, inlined structs'
// fields included (TypeMeta's apiVersion and kind).
func jsonFields(t reflect.Type) map[string]field {
	out := map[string]field{}
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		tag, opts, _ := strings.Cut(f.Tag.Get("json"), ",")
		if tag == "-" {
			continue
		}
		if tag == "" && (f.Anonymous || strings.Contains(opts, "inline")) {
			for k, v := range jsonFields(f.Type) {
				out[k] = v
			}
			continue
		}
		if tag == "" {
			tag = f.Name
		}
		out[tag] = field{typ: f.Type}
	}
	return out
}

func join(path, k string) string {
	if path == "" {
		return k
	}
	return path + "." + k
}
