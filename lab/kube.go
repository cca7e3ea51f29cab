package lab

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
)

// Addresses and ports of a Kubernetes lab.
const (
	APIServerPort = 6443
	// ClusterCIDR is kube-controller-manager's --cluster-cidr and
	// net-conf.json's Network.
	ClusterCIDR = "10.244.0.0/16"
	// ServiceCIDR holds ClusterIPs; the first is the kubernetes Service.
	ServiceCIDR   = "10.96.0.0/16"
	KubernetesSvc = "10.96.0.1"
	// ClusterCIDRV6 and ServiceCIDRV6 are their IPv6 counterparts in a
	// dual-stack or IPv6-only lab (--ip-family dual|ipv6); ClusterCIDRV6
	// is net-conf.json's IPv6Network.
	ClusterCIDRV6 = ipv6Network
	ServiceCIDRV6 = "fd00:96::/112"
	// HostPort is where the lab's hostPort pod answers on its node.
	HostPort = 8080
	// kubeNamespace holds the lab's test workload.
	kubeNamespace = "lab"
)

// KubeTools are the binaries a Kubernetes lab runs, all in one directory
// (build/kube/<version>, which make setup fills).
var KubeTools = []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "kube-proxy", "kubectl", "crictl"}

// NodeTools are what a Kubernetes lab node's operating system provides: a
// container runtime, and the CNI plugins every node has next to twill
// (Debian's containerd, runc and containernetworking-plugins).
var NodeTools = []string{"/usr/bin/containerd", "/usr/bin/containerd-shim-runc-v2", "/usr/bin/ctr", "/usr/sbin/runc",
	"/usr/bin/nsenter", "/usr/lib/cni/loopback", "/usr/lib/cni/portmap"}

// defaultBuildDir is where make puts the Kubernetes binaries and images:
// build/ next to the bin/ holding twillctl.
func defaultBuildDir(binDir string) string { return filepath.Join(binDir, "..", "build") }

// validateKube checks what a Kubernetes lab needs before anything is made,
// and says which make target provides what is missing.
func (o *Options) validateKube() error {
	if o.Backend == "eni" {
		return fmt.Errorf("--kubernetes --backend eni: the Kubernetes lab runs vxlan or host-gw")
	}
	if o.KubeBinDir == "" {
		o.KubeBinDir = filepath.Join(defaultBuildDir(o.BinDir), "kube", "current")
	}
	if o.ImageDir == "" {
		o.ImageDir = filepath.Join(defaultBuildDir(o.BinDir), "images")
	}
	if o.CRDs == nil {
		if f := filepath.Join(defaultBuildDir(o.BinDir), "cnp", "current", "crd-experimental.yaml"); fileExists(f) {
			o.CRDs = []string{f}
		}
	}
	for _, f := range o.CRDs {
		if !fileExists(f) {
			return fmt.Errorf("--crd %s: no such file", f)
		}
	}
	// The nodes' processes start in mount namespaces of their own, from
	// other working directories: relative paths would not find them.
	for _, d := range []*string{&o.KubeBinDir, &o.ImageDir} {
		abs, err := filepath.Abs(*d)
		if err != nil {
			return fmt.Errorf("--kube-bin-dir or --image-dir %q: %w", *d, err)
		}
		*d = abs
	}
	var missing []string
	for _, t := range KubeTools {
		if _, err := os.Stat(filepath.Join(o.KubeBinDir, t)); err != nil {
			missing = append(missing, filepath.Join(o.KubeBinDir, t))
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("--kubernetes: missing %s (run make setup, which builds them from the Go module proxy; or point --kube-bin-dir at them)",
			strings.Join(missing, ", "))
	}
	for _, img := range []string{"twill.tar", "pause.tar", "coredns.tar", "lab.tar"} {
		if _, err := os.Stat(filepath.Join(o.ImageDir, img)); err != nil {
			return fmt.Errorf("--kubernetes: no image %s (run make kube-images; or point --image-dir at it)", filepath.Join(o.ImageDir, img))
		}
	}
	if err := o.validateHelm(); err != nil {
		return err
	}
	for _, t := range NodeTools {
		if _, err := os.Stat(t); err != nil {
			return fmt.Errorf("--kubernetes: the nodes need %s (run make setup, which installs containerd, runc and containernetworking-plugins)", t)
		}
	}
	return nil
}

// validateHelm checks --helm, --helm-set and --helm-bin. helm is found
// (--helm-bin, or build/helm/current/helm) for lab helm even in a lab
// installed with kubectl, to move it to a Helm release; --helm needs it.
func (o *Options) validateHelm() error {
	if o.Helm && o.Flannel {
		return fmt.Errorf("--helm --flannel: --helm installs twill, --flannel flannel; choose one")
	}
	if !o.Helm && len(o.HelmSet) > 0 {
		return fmt.Errorf("--helm-set %s: needs --helm", o.HelmSet[0])
	}
	given := o.HelmBin != ""
	if !given {
		o.HelmBin = filepath.Join(defaultBuildDir(o.BinDir), "helm", "current", "helm")
	}
	abs, err := filepath.Abs(o.HelmBin)
	if err != nil {
		return fmt.Errorf("--helm-bin %q: %w", o.HelmBin, err)
	}
	o.HelmBin = abs
	if _, err := os.Stat(o.HelmBin); err != nil {
		if o.Helm || given {
			return fmt.Errorf("--helm-bin: no %s (run make helm-tools, which builds helm from the Go module proxy; or point --helm-bin at one)", o.HelmBin)
		}
		o.HelmBin = ""
	}
	return nil
}

// ZoneLabel is the well-known label of a Node's zone.
const ZoneLabel = "topology.kubernetes.io/zone"

// NodeZone is the zone a Kubernetes lab's node is in: one per node.
func NodeZone(node string) string { return "zone-" + node }

// kubeNet is a Kubernetes lab's address plan for its IP family, each list
// with the primary family first (IPv4 in a dual-stack lab, as kubeadm
// makes it).
type kubeNet struct {
	PodCIDRs, ServiceCIDRs []string
	// KubernetesSvc is the kubernetes Service's ClusterIP, DNS kube-dns's.
	KubernetesSvc, DNS string
}

// kubeNetFor is the address plan of a lab of IP family family.
func kubeNetFor(family string) kubeNet {
	switch family {
	case "dual":
		return kubeNet{PodCIDRs: []string{ClusterCIDR, ClusterCIDRV6}, ServiceCIDRs: []string{ServiceCIDR, ServiceCIDRV6},
			KubernetesSvc: KubernetesSvc, DNS: ClusterDNS}
	case "ipv6":
		return kubeNet{PodCIDRs: []string{ClusterCIDRV6}, ServiceCIDRs: []string{ServiceCIDRV6},
			KubernetesSvc: "fd00:96::1", DNS: "fd00:96::a"}
	}
	return kubeNet{PodCIDRs: []string{ClusterCIDR}, ServiceCIDRs: []string{ServiceCIDR}, KubernetesSvc: KubernetesSvc, DNS: ClusterDNS}
}

// nodeMaskFlags is kube-controller-manager's node subnet size: a /24 per
// node from IPv4 and a /64 from IPv6 (the per-family flags in a dual-stack
// cluster; it refuses them in a single-stack one).
func (k kubeNet) nodeMaskFlags() []string {
	switch {
	case len(k.PodCIDRs) > 1:
		return []string{"--node-cidr-mask-size-ipv4=24", "--node-cidr-mask-size-ipv6=64"}
	case strings.Contains(k.PodCIDRs[0], ":"):
		return []string{"--node-cidr-mask-size=64"}
	}
	return []string{"--node-cidr-mask-size=24"}
}

// Family is the lab's IP family: ipv4, ipv6 or dual (ipv4 in the state
// of a lab from before --ip-family).
func (s *State) Family() string {
	if s.IPFamily == "" {
		return "ipv4"
	}
	return s.IPFamily
}

// kubeNet is the lab's address plan.
func (s *State) kubeNet() kubeNet { return kubeNetFor(s.Family()) }

// nodeIPs are a node's addresses, one per family of the lab, primary
// first: kubelet's --node-ip.
func (n Node) nodeIPs() []netip.Addr {
	if n.AddrV6.IsValid() && n.AddrV6 != n.Addr {
		return []netip.Addr{n.Addr, n.AddrV6}
	}
	return []netip.Addr{n.Addr}
}

// addrFor is the node's address of a's family (invalid if it has none).
func (n Node) addrFor(a netip.Addr) netip.Addr {
	for _, ip := range n.nodeIPs() {
		if ip.Is4() == a.Is4() {
			return ip
		}
	}
	return netip.Addr{}
}

// joinAddrs is addrs comma-separated.
func joinAddrs(addrs []netip.Addr) string {
	out := make([]string, len(addrs))
	for i, a := range addrs {
		out[i] = a.String()
	}
	return strings.Join(out, ",")
}

func fileExists(f string) bool {
	st, err := os.Stat(f)
	return err == nil && !st.IsDir()
}
