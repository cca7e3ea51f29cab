package backend

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/twill-net/twill/subnet"
)

func TestRegistryRejectsDuplicatesAndNil(t *testing.T) {
	var r Registry
	f := func(Options) (Backend, error) { return nil, nil }
	r.Register("b", f)
	r.Register("a", f)
	if got := r.Names(); !reflect.DeepEqual(got, []string{"a", "b"}) {
		t.Fatalf("Names = %v, want sorted [a b]", got)
	}
	for name, fn := range map[string]func(){
		"duplicate": func() { r.Register("a", f) },
		"nil":       func() { r.Register("c", nil) },
		"empty":     func() { r.Register(" ", f) },
	} {
		t.Run(name, func(t *testing.T) {
			defer func() {
				if recover() == nil {
					t.Fatal("Register did not panic")
				}
			}()
			fn()
		})
	}
	if got := r.Names(); len(got) != 2 {
		t.Fatalf("a rejected registration changed the registry: %v", got)
	}
}

func TestRegistryUnknown(t *testing.T) {
	var r Registry
	r.Register("host-gw", func(Options) (Backend, error) { return nil, nil })
	_, err := r.New("vxlen", Options{})
	if !errors.Is(err, ErrUnknown) || !strings.Contains(err.Error(), `"vxlen"`) || !strings.Contains(err.Error(), "host-gw") {
		t.Fatalf("error %v: want ErrUnknown naming the type and listing host-gw", err)
	}
}

func TestDecodeConfig(t *testing.T) {
	type cfg struct {
		VNI  int
		Port int
	}
	var c cfg
	if err := DecodeConfig(json.RawMessage(`{"type":"vxlan","vni":4,"PORT":4789}`), &c); err != nil {
		t.Fatal(err)
	}
	if c.VNI != 4 || c.Port != 4789 {
		t.Fatalf("decoded %+v", c)
	}
	err := DecodeConfig(json.RawMessage(`{"Type":"vxlan","VNl":4}`), &c)
	if err == nil || !strings.Contains(err.Error(), `"VNl"`) {
		t.Fatalf("unknown key error %v, want it named", err)
	}
	err = DecodeConfig(json.RawMessage(`{"VNI":"four"}`), &c)
	if err == nil || !strings.Contains(err.Error(), "Backend.VNI") {
		t.Fatalf("type error %v, want the field named", err)
	}
}

func TestRegistryCheck(t *testing.T) {
	var r Registry
	r.Register("strict", func(o Options) (Backend, error) {
		if !o.CheckOnly || o.Netlink != nil {
			t.Errorf("Check gave the factory %+v", o)
		}
		var c struct{ VNI int }
		return nil, DecodeConfig(o.Config.Backend, &c)
	})
	for _, tt := range []struct{ conf, want string }{
		{`{"Network":"10.0.0.0/16","Backend":{"Type":"strict","VNI":1}}`, ""},
		{`{"Network":"10.0.0.0/16","Backend":{"Type":"stirct"}}`, `Backend.Type "stirct": unknown backend type (registered: strict)`},
		{`{"Network":"10.0.0.0/16","Backend":{"Type":"strict","VNl":1}}`, `Backend: unknown key "VNl"`},
		{`{"Network":"10.0.0.0/16","Backend":{"Type":"strict","VNI":"x"}}`, `Backend.VNI "x": must be a whole number`},
	} {
		cfg, err := subnet.ParseConfig([]byte(tt.conf))
		if err != nil {
			t.Fatal(err)
		}
		err = r.Check(cfg)
		if (tt.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tt.want)) {
			t.Errorf("Check(%s) = %v, want %q", tt.conf, err, tt.want)
		}
	}
}
