package backend

import (
	"encoding/json"
	"errors"
	"net/netip"
	"reflect"
	"strings"
	"testing"

	"github.com/twill-net/twill/nl"
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

func TestDiffRoutes(t *testing.T) {
	r := func(dst, gw string) nl.Route {
		return nl.Route{Dst: netip.MustParsePrefix(dst), Gw: netip.MustParseAddr(gw), LinkIndex: 2, Protocol: 167}
	}
	desired := RouteMap([]nl.Route{r("10.0.1.0/24", "192.168.0.1"), r("10.0.2.0/24", "192.168.0.2"), r("10.0.3.0/24", "192.168.0.3")})
	actual := RouteMap([]nl.Route{r("10.0.2.0/24", "192.168.0.2"), r("10.0.3.0/24", "192.168.0.99"), r("10.0.9.0/24", "192.168.0.9")})
	p := DiffRoutes(desired, actual)
	dsts := func(rs []nl.Route) (s []string) {
		for _, r := range rs {
			s = append(s, r.Dst.String())
		}
		return s
	}
	if got := dsts(p.Add); !reflect.DeepEqual(got, []string{"10.0.1.0/24"}) {
		t.Errorf("Add %v", got)
	}
	if got := dsts(p.Replace); !reflect.DeepEqual(got, []string{"10.0.3.0/24"}) || p.Replace[0].Gw.String() != "192.168.0.3" {
		t.Errorf("Replace %v", p.Replace)
	}
	if got := dsts(p.Delete); !reflect.DeepEqual(got, []string{"10.0.9.0/24"}) {
		t.Errorf("Delete %v", got)
	}
	if !DiffRoutes(desired, desired).Empty() {
		t.Error("diff of a set with itself is not empty")
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

// A backend with several watches is watching once each has made its first
// check; a watch that resubscribes and checks again does not count twice.
func TestAllChecked(t *testing.T) {
	done := 0
	checked := AllChecked(3, func() { done++ })
	checked[0]()
	checked[0]() // resubscribed before the others checked
	checked[2]()
	if done != 0 {
		t.Fatalf("done after two of three watches checked (one of them twice)")
	}
	checked[1]()
	checked[1]()
	checked[0]()
	if done != 1 {
		t.Fatalf("done called %d times once all three checked, want 1", done)
	}
	none := 0
	AllChecked(0, func() { none++ })
	if none != 1 {
		t.Fatalf("no watches: done called %d times, want 1", none)
	}
}
