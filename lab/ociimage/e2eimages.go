package ociimage

import (
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"sort"
	"strings"
)

// E2EUserland are the Debian packages (with DebClosure's closure) under
// the stand-ins for Kubernetes' e2e test images: what the suite's specs
// run inside them, by name — sh and bash, curl, nc (OpenBSD's, as in the
// upstream images), wget (GNU's: Debian's busybox 1.35 crashes on the -T
// the specs give; e2eWgetrc makes it try once, as busybox's does), dig,
// getent, ip and ss, awk, ps, hostname, which, and iptables and conntrack
// (distroless-iptables).
var E2EUserland = []string{"bash", "dash", "coreutils", "curl", "netcat-openbsd", "wget", "bind9-dnsutils", "iproute2",
	"grep", "sed", "gawk", "procps", "hostname", "libc-bin", "findutils", "debianutils", "iptables", "conntrack"}

// userlandLinks are what the packages' maintainer scripts would make
// (Debian's alternatives: iptables in nft mode, as Debian's default).
var userlandLinks = func() map[string]string {
	m := map[string]string{
		"/usr/bin/nc":    "/bin/nc.openbsd",
		"/usr/bin/awk":   "gawk",
		"/usr/bin/which": "which.debianutils",
		"/agnhost-2":     "agnhost",
	}
	maps.Copy(m, iptablesLinks)
	return m
}()

// e2eWgetrc is the stand-ins' /etc/wgetrc: GNU wget tries a request 20
// times by default, busybox's wget (whose -T and -qO- the specs use) once.
// Specs loop over wget -T 1 and count answers, so retries would stretch a
// loop over a dropped backend from seconds to minutes.
const e2eWgetrc = "tries = 1\n"

// E2EBinaries are the files the stand-ins hold besides Debian's packages,
// built by tools/kube/build.sh at the suite's version.
type E2EBinaries struct {
	Agnhost string // the suite's test server; its TLS pair next to it (Agnhost+"-localhost.crt", .key)
	CoreDNS string
	Pause   string
	// Regression74839 is test/images/regression-issue-74839's server,
	// which sends the out-of-window packets conntrack calls invalid.
	Regression74839 string
}

// E2EImages are stand-ins, built here, for the e2e suite's images that
// the lab's specs run, each under the exact reference the suite asks for
// (refs, as `e2e.test --list-images` prints them), so no pull is ever
// attempted. All but pause share one Debian userland (debs) holding
// agnhost, the suite's test server, as /agnhost (and the TLS pair its
// porter serves, agnhost-localhost.crt and .key next to it, as
// /localhost.crt and .key) and CoreDNS as /coredns, as the upstream agnhost
// image does:
//
//   - agnhost: entrypoint /agnhost, pause by default (as upstream);
//   - busybox, glibc-dns-testing and build-image/distroless-iptables:
//     the userland, sh by default (the specs give their commands: sh,
//     wget, dig, getent; sleep, and conntrack in a privileged pod on the
//     node's network);
//   - nginx: /agnhost test-webserver, an HTTP server on port 80 like
//     nginx's default page (the specs only need a server that stays up);
//   - pause: twill's pause binary;
//   - regression-issue-74839: the userland with its server as entrypoint.
//
// Other references are returned in missing: the specs that need them
// cannot run here.
func E2EImages(refs []string, bin E2EBinaries, debs []string) (specs []Spec, missing []string) {
	// agnhost porter's TLS pair, in its working directory as upstream's.
	files := []File{{Src: bin.Agnhost, Dst: "/agnhost"}, {Src: bin.CoreDNS, Dst: "/coredns"},
		{Src: bin.Agnhost + "-localhost.crt", Dst: "/localhost.crt", Mode: 0o644},
		{Src: bin.Agnhost + "-localhost.key", Dst: "/localhost.key", Mode: 0o644},
		{Data: []byte(e2eWgetrc), Dst: "/etc/wgetrc", Mode: 0o644}}
	dirs := []string{"/tmp", "/uploads", "/results"}
	userland := func(ref string, entrypoint, cmd []string) Spec {
		return Spec{Ref: ref, Entrypoint: entrypoint, Cmd: cmd, Debs: debs, Files: files, Symlinks: userlandLinks, Dirs: dirs}
	}
	sorted := append([]string(nil), refs...)
	sort.Strings(sorted)
	for _, ref := range sorted {
		repo, _, _ := strings.Cut(path.Base(ref), ":")
		if !strings.HasPrefix(ref, "registry.k8s.io/e2e-test-images/") && !strings.HasPrefix(ref, "registry.k8s.io/pause:") &&
			!strings.HasPrefix(ref, "registry.k8s.io/build-image/distroless-iptables:") {
			// Private and invalid registries: the specs that name them
			// test that a pull fails.
			repo = ""
		}
		switch repo {
		case "agnhost":
			specs = append(specs, userland(ref, []string{"/agnhost"}, []string{"pause"}))
		case "busybox", "glibc-dns-testing", "distroless-iptables":
			specs = append(specs, userland(ref, nil, []string{"sh"}))
		case "regression-issue-74839":
			s := userland(ref, []string{"/regression-issue-74839"}, nil)
			s.Files = append(append([]File(nil), files...), File{Src: bin.Regression74839, Dst: "/regression-issue-74839"})
			specs = append(specs, s)
		case "nginx":
			specs = append(specs, userland(ref, []string{"/agnhost"}, []string{"test-webserver"}))
		case "pause":
			specs = append(specs, PauseImage(ref, bin.Pause))
		default:
			missing = append(missing, ref)
		}
	}
	return specs, missing
}

// CoreDNSImage is the lab's cluster DNS: one static CoreDNS binary.
func CoreDNSImage(ref, coredns string) Spec {
	return Spec{Ref: ref, Entrypoint: []string{"/coredns"}, Files: []File{{Src: coredns, Dst: "/coredns"}}}
}

// CNPConformanceImages are the images network-policy-api's conformance
// suite (make cnp) runs, stood in for with the e2e suite's: its client and
// server pods run agnhost's connect, serve-hostname and porter.
var CNPConformanceImages = []string{"registry.k8s.io/e2e-test-images/agnhost:2.45"}

// WriteE2EImages writes the stand-ins for the images the e2e suite in
// kubeBinDir (e2e.test, agnhost, coredns, regression-issue-74839, as
// tools/kube/build.sh leaves them) asks for, and CNPConformanceImages, to out, the userland's packages cached in debDir. It
// returns the references it has no stand-in for.
func WriteE2EImages(out, kubeBinDir, pauseBin, debDir string) (missing []string, err error) {
	list, err := exec.Command(filepath.Join(kubeBinDir, "e2e.test"), "--list-images").Output()
	if err != nil {
		return nil, fmt.Errorf("e2e.test --list-images: %w", err)
	}
	pkgs, err := DebClosure(E2EUserland, MaintainerOnly)
	if err != nil {
		return nil, err
	}
	debs, err := FetchDebs(debDir, pkgs)
	if err != nil {
		return nil, err
	}
	refs := append(strings.Fields(string(list)), CNPConformanceImages...)
	specs, missing := E2EImages(refs, E2EBinaries{Agnhost: filepath.Join(kubeBinDir, "agnhost"),
		CoreDNS: filepath.Join(kubeBinDir, "coredns"), Pause: pauseBin,
		Regression74839: filepath.Join(kubeBinDir, "regression-issue-74839")}, debs)
	if len(specs) == 0 {
		return nil, fmt.Errorf("e2e.test --list-images named none of the images this lab stands in for:\n%s", list)
	}
	return missing, WriteAll(out, specs)
}

// WriteCoreDNS writes the lab's CoreDNS image, from kubeBinDir's coredns
// and tagged with the version its stamp file names, to out, and returns
// its reference.
func WriteCoreDNS(out, kubeBinDir string) (string, error) {
	v, err := os.ReadFile(filepath.Join(kubeBinDir, "coredns.version"))
	if err != nil {
		return "", fmt.Errorf("CoreDNS's version (built by make kube-tools): %w", err)
	}
	ref := "twill.local/coredns:" + strings.TrimSpace(string(v))
	return ref, Write(out, CoreDNSImage(ref, filepath.Join(kubeBinDir, "coredns")))
}
