package lab

import (
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/twill-net/twill/subnet"
)

// The manifest the lab applies, per IP family, holds a net-conf.json that
// twill accepts and whose networks are kube-controller-manager's
// --cluster-cidr ranges, family by family.
func TestInstallManifestFamilies(t *testing.T) {
	for _, family := range []string{"ipv4", "dual", "ipv6"} {
		t.Run(family, func(t *testing.T) {
			m, err := InstallManifest("twill.local/twill:test", "host-gw", family)
			if err != nil {
				t.Fatal(err)
			}
			raw := netConfOf(t, m)
			cfg, err := subnet.ParseConfig([]byte(raw))
			if err != nil {
				t.Fatalf("net-conf.json %s: %v", raw, err)
			}
			var nets []string
			if cfg.EnableIPv4 {
				nets = append(nets, cfg.Network.String())
			}
			if cfg.EnableIPv6 {
				nets = append(nets, cfg.IPv6Network.String())
			}
			if want := kubeNetFor(family).PodCIDRs; !slices.Equal(nets, want) {
				t.Errorf("net-conf.json's networks %v, want --cluster-cidr's %v", nets, want)
			}
			if cfg.BackendType != "host-gw" {
				t.Errorf("backend %q, want host-gw", cfg.BackendType)
			}
		})
	}
}

// netConfOf is net-conf.json from the manifest's ConfigMap.
func netConfOf(t *testing.T, manifest []byte) string {
	t.Helper()
	for _, doc := range strings.Split(string(manifest), "\n---\n") {
		var obj struct {
			Kind string            `json:"kind"`
			Data map[string]string `json:"data"`
		}
		if err := yaml.Unmarshal([]byte(doc), &obj); err != nil {
			t.Fatalf("manifest document: %v", err)
		}
		if c, ok := obj.Data["net-conf.json"]; ok && obj.Kind == "ConfigMap" {
			return c
		}
	}
	t.Fatal("no ConfigMap with net-conf.json in the manifest")
	return ""
}

// Each family's plan: Service ranges, the kubernetes and DNS Services'
// addresses inside them, and node subnet sizes kube-controller-manager
// accepts for the families it has.
func TestKubeNetFor(t *testing.T) {
	for _, tc := range []struct {
		family string
		masks  []string
	}{
		{"ipv4", []string{"--node-cidr-mask-size=24"}},
		{"dual", []string{"--node-cidr-mask-size-ipv4=24", "--node-cidr-mask-size-ipv6=64"}},
		{"ipv6", []string{"--node-cidr-mask-size=64"}},
	} {
		k := kubeNetFor(tc.family)
		if got := k.nodeMaskFlags(); !slices.Equal(got, tc.masks) {
			t.Errorf("%s: node mask flags %v, want %v", tc.family, got, tc.masks)
		}
		primary := netip.MustParsePrefix(k.ServiceCIDRs[0])
		for _, a := range []string{k.KubernetesSvc, k.DNS} {
			if !primary.Contains(netip.MustParseAddr(a)) {
				t.Errorf("%s: %s outside the primary Service range %s", tc.family, a, primary)
			}
		}
		if len(k.PodCIDRs) != len(k.ServiceCIDRs) {
			t.Errorf("%s: pod ranges %v and Service ranges %v differ in families", tc.family, k.PodCIDRs, k.ServiceCIDRs)
		}
	}
}

// The kubelet and kube-proxy configurations are YAML that keeps an IPv6
// DNS address and both pod ranges as written.
func TestNodeConfigsFamilies(t *testing.T) {
	k := kubeNetFor("ipv6")
	var kc struct {
		ClusterDNS []string `json:"clusterDNS"`
	}
	if err := yaml.Unmarshal([]byte(kubeletConfig("twl-x-n1", "/ca.crt", k.DNS)), &kc); err != nil || !slices.Equal(kc.ClusterDNS, []string{k.DNS}) {
		t.Errorf("kubelet clusterDNS %v (%v), want [%s]", kc.ClusterDNS, err, k.DNS)
	}
	dual := kubeNetFor("dual")
	var pc struct {
		ClusterCIDR string `json:"clusterCIDR"`
		Mode        string `json:"mode"`
	}
	if err := yaml.Unmarshal([]byte(kubeProxyConfig("node1", "/kc", dual.PodCIDRs, "")), &pc); err != nil || pc.ClusterCIDR != strings.Join(dual.PodCIDRs, ",") || pc.Mode != "iptables" {
		t.Errorf("kube-proxy clusterCIDR %q, mode %q (%v), want %q, iptables", pc.ClusterCIDR, pc.Mode, err, strings.Join(dual.PodCIDRs, ","))
	}
	if err := yaml.Unmarshal([]byte(kubeProxyConfig("node1", "/kc", dual.PodCIDRs, "nftables")), &pc); err != nil || pc.Mode != "nftables" {
		t.Errorf("kube-proxy mode %q (%v), want nftables", pc.Mode, err)
	}
}

// A relative --kube-bin-dir or --image-dir is made absolute: the nodes'
// processes start from other working directories.
func TestValidateKubeAbsolutePaths(t *testing.T) {
	t.Chdir(t.TempDir())
	o := Options{Kubernetes: true, Backend: "vxlan", KubeBinDir: "kube", ImageDir: "images"}
	err := o.validateKube()
	wd, _ := os.Getwd()
	want := filepath.Join(wd, "kube", KubeTools[0])
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("validateKube with no tools: %v, want it to name %s", err, want)
	}
	if o.KubeBinDir != filepath.Join(wd, "kube") || o.ImageDir != filepath.Join(wd, "images") {
		t.Errorf("KubeBinDir %q, ImageDir %q: want both absolute under %s", o.KubeBinDir, o.ImageDir, wd)
	}
}
