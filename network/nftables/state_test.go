package nftables

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/twill-net/twill/network"
)

// diff against a kernel modelled as chain states.
func TestDiff(t *testing.T) {
	want, err := desired([]network.NetworkPair{{Cluster: netip.MustParsePrefix("10.244.0.0/16"), Local: netip.MustParsePrefix("10.244.3.0/24")}}, true)
	if err != nil {
		t.Fatal(err)
	}
	var states []chainState
	for _, w := range want {
		states = append(states, w.state)
	}
	clone := func() []chainState {
		var c []chainState
		for _, s := range states {
			s.Rules = append([]ruleState(nil), s.Rules...)
			c = append(c, s)
		}
		return c
	}
	render := func(d network.RuleDrift) string {
		return "missing " + strings.Join(d.Missing, ";") + " wrong " + strings.Join(d.Wrong, ";") + " extra " + strings.Join(d.Extra, ";")
	}
	for _, tc := range []struct {
		name   string
		kernel func([]chainState) []chainState
		exists bool
		want   string // "" for clean
	}{
		{"in sync", func(c []chainState) []chainState { return c }, true, ""},
		{"no table", func([]chainState) []chainState { return nil }, false, "missing table inet twill"},
		{"no chain", func(c []chainState) []chainState { return c[:1] }, true, "missing chain inet twill forward"},
		{"extra chain", func(c []chainState) []chainState { return append(c, chainState{Name: "mine"}) }, true, "extra chain inet twill mine"},
		{"rule gone", func(c []chainState) []chainState { c[0].Rules = c[0].Rules[1:]; return c }, true, "missing rule in postrouting: twill: pod to pod (ipv4)"},
		{"rule altered", func(c []chainState) []chainState { c[1].Rules[0].Exprs = []byte("x"); return c }, true, "wrong rule in forward (handle 0): twill: from pods (ipv4): altered"},
		{"rule repeated", func(c []chainState) []chainState { c[1].Rules = append(c[1].Rules, c[1].Rules[0]); return c }, true, "extra rule in forward (handle 0): twill: from pods (ipv4)"},
		{"foreign rule", func(c []chainState) []chainState { c[1].Rules = append(c[1].Rules, ruleState{}); return c }, true, "extra rule in forward (handle 0): no comment"},
		{"out of order", func(c []chainState) []chainState {
			c[1].Rules[0], c[1].Rules[1] = c[1].Rules[1], c[1].Rules[0]
			return c
		}, true, "wrong rules in forward: out of order"},
		{"policy", func(c []chainState) []chainState { c[1].Def = "type filter hook 2 priority 0 policy drop"; return c }, true, "wrong chain inet twill forward: type filter hook 2 priority 0 policy drop, want"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := diff(states, tc.kernel(clone()), tc.exists)
			if tc.want == "" {
				if !d.Clean() {
					t.Fatalf("drift %s, want none", render(d))
				}
				return
			}
			got := render(d)
			kind, what, _ := strings.Cut(tc.want, " ")
			if !strings.Contains(got, kind+" ") || !strings.Contains(got, what) {
				t.Fatalf("drift %s, want %s", got, tc.want)
			}
		})
	}
}
