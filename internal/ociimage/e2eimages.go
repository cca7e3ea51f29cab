package ociimage

import (
	"fmt"
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
// upstream images), dig, getent, ip and ss, awk, ps, hostname.
var E2EUserland = []string{"bash", "dash", "coreutils", "curl", "netcat-openbsd", "bind9-dnsutils", "iproute2",
	"grep", "sed", "gawk", "procps", "hostname", "libc-bin", "findutils"}

// userlandLinks are what the packages' maintainer scripts would make.
var userlandLinks = map[string]string{
	"/usr/bin/nc":  "/bin/nc.openbsd",
	"/usr/bin/awk": "gawk",
	"/agnhost-2":   "agnhost",
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
//   - busybox and glibc-dns-testing: the userland, sh by default (the
//     specs give their commands: sh, dig, getent);
//   - nginx: /agnhost test-webserver, an HTTP server on port 80 like
//     nginx's default page (the specs only need a server that stays up);
//   - pause: twill's pause binary.
//
// Other references are returned in missing: the specs that need them
// cannot run here.
func E2EImages(refs []string, agnhost, coredns, pauseBin string, debs []string) (specs []Spec, missing []string) {
	// agnhost porter's TLS pair, in its working directory as upstream's.
	files := []File{{Src: agnhost, Dst: "/agnhost"}, {Src: coredns, Dst: "/coredns"},
		{Src: agnhost + "-localhost.crt", Dst: "/localhost.crt", Mode: 0o644}, {Src: agnhost + "-localhost.key", Dst: "/localhost.key", Mode: 0o644}}
	dirs := []string{"/tmp", "/uploads", "/results"}
	userland := func(ref string, entrypoint, cmd []string) Spec {
		return Spec{Ref: ref, Entrypoint: entrypoint, Cmd: cmd, Debs: debs, Files: files, Symlinks: userlandLinks, Dirs: dirs}
	}
	sorted := append([]string(nil), refs...)
	sort.Strings(sorted)
	for _, ref := range sorted {
		repo, _, _ := strings.Cut(path.Base(ref), ":")
		if !strings.HasPrefix(ref, "registry.k8s.io/e2e-test-images/") && !strings.HasPrefix(ref, "registry.k8s.io/pause:") {
			// Private and invalid registries: the specs that name them
			// test that a pull fails.
			repo = ""
		}
		switch repo {
		case "agnhost":
			specs = append(specs, userland(ref, []string{"/agnhost"}, []string{"pause"}))
		case "busybox", "glibc-dns-testing":
			specs = append(specs, userland(ref, nil, []string{"sh"}))
		case "nginx":
			specs = append(specs, userland(ref, []string{"/agnhost"}, []string{"test-webserver"}))
		case "pause":
			specs = append(specs, PauseImage(ref, pauseBin))
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

// WriteE2EImages writes the stand-ins for the images the e2e suite in
// kubeBinDir (e2e.test, agnhost, coredns, as tools/kube/build.sh leaves
// them) asks for to out, the userland's packages cached in debDir. It
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
	specs, missing := E2EImages(strings.Fields(string(list)), filepath.Join(kubeBinDir, "agnhost"),
		filepath.Join(kubeBinDir, "coredns"), pauseBin, debs)
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
