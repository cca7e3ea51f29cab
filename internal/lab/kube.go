package lab

import (
	"fmt"
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
	for _, img := range []string{"twill.tar", "pause.tar", "coredns.tar"} {
		if _, err := os.Stat(filepath.Join(o.ImageDir, img)); err != nil {
			return fmt.Errorf("--kubernetes: no image %s (run make kube-images; or point --image-dir at it)", filepath.Join(o.ImageDir, img))
		}
	}
	for _, t := range NodeTools {
		if _, err := os.Stat(t); err != nil {
			return fmt.Errorf("--kubernetes: the nodes need %s (run make setup, which installs containerd, runc and containernetworking-plugins)", t)
		}
	}
	return nil
}

// ZoneLabel is the well-known label of a Node's zone.
const ZoneLabel = "topology.kubernetes.io/zone"

// NodeZone is the zone a Kubernetes lab's node is in: one per node.
func NodeZone(node string) string { return "zone-" + node }
