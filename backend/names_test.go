package backend

import (
	"slices"
	"strings"
	"testing"
)

func TestNamed(t *testing.T) {
	n := Named[int]{Kind: "widget"}
	n.Add("b", 2)
	n.Add("a", 1)
	if got := n.Names(); !slices.Equal(got, []string{"a", "b"}) {
		t.Fatalf("Names %q, want [a b]", got)
	}
	if v, ok := n.Get("b"); !ok || v != 2 {
		t.Fatalf("Get(b) = %d, %v", v, ok)
	}
	if _, ok := n.Get("c"); ok {
		t.Fatal("Get(c) found something never registered")
	}
	for _, tt := range []struct{ name, want string }{{"a", `widget "a" registered twice`}, {" ", "widget registered with an empty name"}} {
		func() {
			defer func() {
				if r, _ := recover().(string); !strings.Contains(r, tt.want) {
					t.Errorf("Add(%q): panic %q, want %q", tt.name, r, tt.want)
				}
			}()
			n.Add(tt.name, 3)
		}()
	}
}
