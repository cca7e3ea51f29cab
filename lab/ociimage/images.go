package ociimage

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
)

// TwillDebs are the Debian packages in twill's image: the iptables
// binaries twilld's iptables mode needs (iptables-save and
// iptables-restore write its chains, iptables checks single rules), and the
// libraries they link. dist/Dockerfile installs the
// same from Debian, so both paths give the same layout.
var TwillDebs = []string{
	"libc6", "libgcc-s1", "libmnl0", "libnftnl11", "libxtables12", "libip4tc2", "libip6tc2",
	"libnfnetlink0", "libnetfilter-conntrack3", "iptables",
}

// iptablesLinks are what Debian's update-alternatives would make: the
// image uses the nft variant, as Debian (and kube-proxy on it) does.
var iptablesLinks = map[string]string{
	"/usr/sbin/iptables":          "iptables-nft",
	"/usr/sbin/iptables-save":     "iptables-nft-save",
	"/usr/sbin/iptables-restore":  "iptables-nft-restore",
	"/usr/sbin/ip6tables":         "ip6tables-nft",
	"/usr/sbin/ip6tables-save":    "ip6tables-nft-save",
	"/usr/sbin/ip6tables-restore": "ip6tables-nft-restore",
}

// TwillImage is twill's image: twilld, the twill CNI plugin, twillctl and
// twill-wg in /usr/local/bin (where dist/kube-twill.yml runs them from), on top of
// debs (the files FetchDebs returned for TwillDebs).
func TwillImage(ref, binDir string, debs []string) Spec {
	var files []File
	for _, b := range []string{"twilld", "twill", "twillctl", "twill-wg"} {
		files = append(files, File{Src: filepath.Join(binDir, b), Dst: "/usr/local/bin/" + b})
	}
	return Spec{Ref: ref, Entrypoint: []string{"/usr/local/bin/twilld"}, Debs: debs, Files: files, Symlinks: iptablesLinks,
		Dirs: []string{"/tmp", "/run", "/var/lib/twill"}}
}

// LabImage is the Kubernetes lab's own image: twill-lab (static) in
// /usr/local/bin, for the lab's echo and probe pods (`twillctl lab
// echo-server`, `twillctl lab probe`). twill's image, as shipped, has no lab.
func LabImage(ref, labBin string) Spec {
	return Spec{Ref: ref, Entrypoint: []string{"/usr/local/bin/twill-lab"},
		Files: []File{{Src: labBin, Dst: "/usr/local/bin/twill-lab"}}, Dirs: []string{"/tmp"}}
}

// FlannelImage is the Kubernetes lab's kube-flannel image: flanneld (built
// with cgo: tools/flannel), twill's stand-in for flannel's CNI plugin
// (tools/flannelcni) and the reference bridge and host-local plugins it
// delegates to (from cniDir), in /opt/bin, on twill's userland (debs: libc
// and iptables-nft, which flanneld runs).
func FlannelImage(ref, flanneld, standIn, cniDir string, debs []string) Spec {
	files := []File{{Src: flanneld, Dst: "/opt/bin/flanneld"}, {Src: standIn, Dst: "/opt/bin/flannelcni"}}
	for _, p := range []string{"bridge", "host-local"} {
		files = append(files, File{Src: filepath.Join(cniDir, p), Dst: "/opt/bin/" + p})
	}
	return Spec{Ref: ref, Entrypoint: []string{"/opt/bin/flanneld"}, Debs: debs, Files: files, Symlinks: iptablesLinks,
		Dirs: []string{"/tmp", "/run"}}
}

// PauseImage is a pod sandbox image holding one static pause binary.
func PauseImage(ref, pauseBin string) Spec {
	return Spec{Ref: ref, Entrypoint: []string{"/pause"}, Files: []File{{Src: pauseBin, Dst: "/pause"}}}
}

// FetchDebs returns the .deb file of each package, from dir when an
// earlier call put it there, otherwise downloaded into dir with apt-get
// (refreshing the package lists once if apt-get cannot find one).
func FetchDebs(dir string, pkgs []string) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	var missing []string
	for _, p := range pkgs {
		if _, ok := cached(dir, p); !ok {
			missing = append(missing, p)
		}
	}
	if len(missing) > 0 {
		if err := aptDownload(dir, missing); err != nil {
			if out, uerr := exec.Command("apt-get", "update", "-qq").CombinedOutput(); uerr != nil {
				return nil, fmt.Errorf("%w (and apt-get update: %v: %s)", err, uerr, out)
			}
			if err := aptDownload(dir, missing); err != nil {
				return nil, err
			}
		}
	}
	debs := make([]string, 0, len(pkgs))
	for _, p := range pkgs {
		f, ok := cached(dir, p)
		if !ok {
			return nil, fmt.Errorf("package %s: no .deb in %s after apt-get download", p, dir)
		}
		debs = append(debs, f)
	}
	return debs, nil
}

func aptDownload(dir string, pkgs []string) error {
	cmd := exec.Command("apt-get", append([]string{"download", "-qq"}, pkgs...)...)
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("apt-get download %s: %w: %s", strings.Join(pkgs, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// cached finds pkg's .deb in dir (the newest name, should there be more).
func cached(dir, pkg string) (string, bool) {
	m, _ := filepath.Glob(filepath.Join(dir, pkg+"_*.deb"))
	if len(m) == 0 {
		return "", false
	}
	sort.Strings(m)
	return m[len(m)-1], true
}
