package ociimage

import (
	"slices"
	"testing"
)

// Each reference the sig-network specs name gets its stand-in under that
// very name, with what the specs run in it; the rest are reported.
func TestE2EImages(t *testing.T) {
	refs := []string{
		"registry.k8s.io/e2e-test-images/agnhost:2.59",
		"registry.k8s.io/e2e-test-images/busybox:1.37.0-1",
		"registry.k8s.io/build-image/distroless-iptables:v0.9.6",
		"registry.k8s.io/e2e-test-images/regression-issue-74839:1.4",
		"registry.k8s.io/pause:3.10.1",
		"registry.k8s.io/e2e-test-images/volume/nfs:1.4.0",
		"invalid.registry.k8s.io/invalid/alpine:3.1",
	}
	bin := E2EBinaries{Agnhost: "/b/agnhost", CoreDNS: "/b/coredns", Pause: "/b/pause", Regression74839: "/b/regression-issue-74839"}
	specs, missing := E2EImages(refs, bin, []string{"/debs/busybox.deb"})
	byRef := map[string]Spec{}
	for _, s := range specs {
		byRef[s.Ref] = s
	}
	if want := []string{"invalid.registry.k8s.io/invalid/alpine:3.1", "registry.k8s.io/e2e-test-images/volume/nfs:1.4.0"}; !slices.Equal(missing, want) {
		t.Errorf("missing = %v, want %v", missing, want)
	}
	hasFile := func(s Spec, dst, src string) bool {
		return slices.ContainsFunc(s.Files, func(f File) bool { return f.Dst == dst && f.Src == src })
	}
	busybox := byRef["registry.k8s.io/e2e-test-images/busybox:1.37.0-1"]
	wgetrc := slices.IndexFunc(busybox.Files, func(f File) bool { return f.Dst == "/etc/wgetrc" })
	if !slices.Equal(busybox.Cmd, []string{"sh"}) || wgetrc < 0 || string(busybox.Files[wgetrc].Data) != "tries = 1\n" {
		t.Errorf("busybox: %+v; want sh, and wget trying once", busybox)
	}
	ipt := byRef["registry.k8s.io/build-image/distroless-iptables:v0.9.6"]
	if ipt.Symlinks["/usr/sbin/iptables"] == "" || !slices.Equal(ipt.Debs, []string{"/debs/busybox.deb"}) {
		t.Errorf("distroless-iptables: %+v; want the userland, with iptables", ipt)
	}
	reg := byRef["registry.k8s.io/e2e-test-images/regression-issue-74839:1.4"]
	if !slices.Equal(reg.Entrypoint, []string{"/regression-issue-74839"}) || !hasFile(reg, "/regression-issue-74839", bin.Regression74839) {
		t.Errorf("regression-issue-74839: %+v; want its server as entrypoint", reg)
	}
	// Its own file list: the others do not carry its server.
	if hasFile(busybox, "/regression-issue-74839", bin.Regression74839) || !hasFile(busybox, "/agnhost", bin.Agnhost) {
		t.Errorf("busybox's files: %+v", busybox.Files)
	}
	if a := byRef["registry.k8s.io/e2e-test-images/agnhost:2.59"]; !slices.Equal(a.Entrypoint, []string{"/agnhost"}) {
		t.Errorf("agnhost: %+v", a)
	}
}
