package rules

import (
	"slices"
	"testing"
)

func TestSplitArgs(t *testing.T) {
	spec, ok := jumpSpec(`-A FORWARD -m comment --comment "flanneld forward" -j FLANNEL-FWD`, "FORWARD", "FLANNEL-FWD")
	if want := []string{"-m", "comment", "--comment", "flanneld forward", "-j", "FLANNEL-FWD"}; !ok || !slices.Equal(spec, want) {
		t.Errorf("got %q %v, want %q", spec, ok, want)
	}
	if _, ok := jumpSpec(`-A FORWARD -j KUBE-FORWARD`, "FORWARD", "FLANNEL-FWD"); ok {
		t.Error("a jump to another chain matched")
	}
}
