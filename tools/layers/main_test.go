package main

import (
	"strings"
	"testing"
)

func TestCheck(t *testing.T) {
	for _, tc := range []struct {
		name string
		pkgs []pkg
		want []string // substrings of the problems, in order; none: no problem
	}{
		{
			name: "layered",
			pkgs: []pkg{
				{module + "/daemon", []string{module + "/backend", module + "/internal/backoff", "fmt"}},
				{module + "/backend/vxlan", []string{module + "/backend", module + "/nl", module + "/internal/backoff"}},
				{module + "/internal/backoff", []string{"time"}},
				{module + "/internal/desiredfile", []string{module + "/internal/atomicfile"}},
			},
		},
		{
			// The tree before the daemon engine left internal/.
			name: "engine in internal",
			pkgs: []pkg{
				{module + "/internal/daemon", []string{module + "/backend"}},
				{module + "/backend/vxlan", []string{module + "/internal/backoff"}},
			},
			want: []string{
				"internal/daemon imports github.com/twill-net/twill/backend: internal/ holds leaves",
				"a cycle, backend -> internal -> backend:\n  github.com/twill-net/twill/backend/vxlan imports github.com/twill-net/twill/internal/backoff\n  github.com/twill-net/twill/internal/daemon imports github.com/twill-net/twill/backend",
			},
		},
		{
			name: "three folders",
			pkgs: []pkg{
				{module + "/lab", []string{module + "/testsupport/kubetest"}},
				{module + "/testsupport/kubetest", []string{module + "/policy"}},
				{module + "/policy", []string{module + "/lab/pki"}},
			},
			want: []string{"lab -> testsupport -> policy -> lab:"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := check(tc.pkgs)
			if len(got) != len(tc.want) {
				t.Fatalf("got %d problems, want %d:\n%s", len(got), len(tc.want), strings.Join(got, "\n"))
			}
			for i, w := range tc.want {
				if !strings.Contains(got[i], w) {
					t.Errorf("problem %d:\n%s\nwant it to contain:\n%s", i, got[i], w)
				}
			}
		})
	}
}
