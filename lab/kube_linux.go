package lab

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/twill-net/twill/dist"
	"github.com/twill-net/twill/internal/pki"
	"github.com/twill-net/twill/internal/sysctl"
	"github.com/twill-net/twill/lab/cluster"
	"github.com/twill-net/twill/lab/topology"
)

// upKube turns the lab's namespaces into a Kubernetes cluster: the control
// plane in the underlay namespace, containerd, kubelet and kube-proxy in
// every node (each in its own mount namespace, see RunNodeRoot), then twill
// installed from dist/kube-twill.yml with kubectl, as users install it.
func (s *State) upKube(ctx context.Context, o Options, topo *topology.Topology, step func(string, ...any)) error {
	s.Kubernetes, s.KubeBinDir, s.ImageDir, s.HelmBin = true, o.KubeBinDir, o.ImageDir, o.HelmBin
	s.APIServer = "https://" + net.JoinHostPort(topo.BridgeAddr.String(), strconv.Itoa(APIServerPort))
	step("Kubernetes control plane in %s", topo.Underlay)
	p, err := pki.New(filepath.Join(s.Dir, "pki"), "twill-lab-ca")
	if err != nil {
		return err
	}
	s.CAFile = p.CAFile()
	if err := s.startControlPlane(ctx, p, topo); err != nil {
		return err
	}
	step("containerd, kubelet and kube-proxy in every node")
	// kube-proxy's identity: the built-in system:node-proxier binding
	// grants it what it needs.
	pxCrt, pxKey, err := p.Issue(pki.Cert{Name: "kube-proxy", CN: "system:kube-proxy"})
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(s.Dir, "kube-proxy.kubeconfig"), []byte(kubeconfig(s.APIServer, p.CAFile(), pxCrt, pxKey)), 0o600); err != nil {
		return err
	}
	g, gctx := errgroup.WithContext(ctx)
	for i := range s.Nodes {
		crt, key, err := p.Issue(pki.Cert{Name: "node-" + s.Nodes[i].Name, CN: "system:node:" + s.Nodes[i].Name, Orgs: []string{"system:nodes"}})
		if err != nil {
			return err
		}
		g.Go(func() error { return s.startNode(gctx, i, crt, key) })
	}
	if err := g.Wait(); err != nil {
		return err
	}
	if err := s.save(); err != nil {
		return err
	}
	if err := cluster.Poll(ctx, 60*time.Second, "every kubelet to register its Node", func() error {
		nodes, err := s.kubeNodes(ctx)
		if err != nil {
			return err
		}
		if len(nodes) < len(s.Nodes) {
			return s.nodeError(fmt.Errorf("%d of %d Nodes registered", len(nodes), len(s.Nodes)))
		}
		return nil
	}); err != nil {
		return err
	}
	if err := cluster.Poll(ctx, 60*time.Second, "every Node's pod subnet routed from the control plane", func() error {
		return s.routePodCIDRs(ctx)
	}); err != nil {
		return err
	}

	if err := s.installCRDs(ctx, o.CRDs, step); err != nil {
		return err
	}
	if err := s.installNetwork(ctx, o, step); err != nil {
		return err
	}
	step("CoreDNS, the cluster DNS at %s (image %s)", s.kubeNet().DNS, s.CoreDNSImage)
	if err := s.deployDNS(ctx); err != nil {
		return err
	}
	return s.save()
}

// installCRDs applies each CRD file and waits until the apiserver serves
// them all.
func (s *State) installCRDs(ctx context.Context, files []string, step func(string, ...any)) error {
	for _, f := range files {
		step("CRDs: kubectl apply -f %s", f)
		data, err := os.ReadFile(f)
		if err != nil {
			return fmt.Errorf("--crd: %w", err)
		}
		if out, err := s.Kubectl(ctx, bytes.NewReader(data), "apply", "--server-side", "-f", "-"); err != nil {
			return fmt.Errorf("kubectl apply -f %s: %w\n%s", f, err, out)
		}
	}
	if len(files) == 0 {
		return nil
	}
	// kubectl wait fails, rather than waits, on a CRD with no conditions
	// yet: the poll asks again.
	return cluster.Poll(ctx, 60*time.Second, "the CRDs to be established", func() error {
		if out, err := s.Kubectl(ctx, nil, "wait", "--for=condition=Established", "--timeout=5s", "crd", "--all"); err != nil {
			return fmt.Errorf("%w: %s", err, strings.TrimSpace(out))
		}
		return nil
	})
}

// installNetwork installs the lab's network: kube-flannel (--flannel), or
// twill with helm (--helm) or, as dist/kube-twill.yml says, kubectl apply.
func (s *State) installNetwork(ctx context.Context, o Options, step func(string, ...any)) error {
	switch {
	case s.FlannelImage != "":
		step("flannel: kube-flannel's DaemonSet (image %s, backend %s)", s.FlannelImage, o.Backend)
		return s.installFlannel(ctx, o.Backend)
	case o.Helm:
		return s.helmInstall(ctx, o, step)
	}
	step("twill: kubectl apply -f dist/kube-twill.yml (image %s)", s.TwillImage)
	manifest, err := InstallManifest(s.TwillImage, o.Backend, s.IPFamily)
	if err != nil {
		return err
	}
	if out, err := s.Kubectl(ctx, bytes.NewReader(manifest), "apply", "-f", "-"); err != nil {
		return fmt.Errorf("kubectl apply -f kube-twill.yml: %w\n%s", err, out)
	}
	return s.waitTwill(ctx)
}

// nodeImages are the image tarballs every node's containerd imports:
// twill's, pause, CoreDNS and the lab's own (its echo pods), and the stand-ins for the e2e suite's images
// when make e2e-images wrote them.
func nodeImages(dir string) []string {
	imgs := []string{"twill.tar", "pause.tar", "coredns.tar", "lab.tar"}
	if _, err := os.Stat(filepath.Join(dir, "flannel.tar")); err == nil {
		imgs = append(imgs, "flannel.tar")
	}
	if _, err := os.Stat(filepath.Join(dir, "e2e-images.tar")); err == nil {
		imgs = append(imgs, "e2e-images.tar")
	}
	return imgs
}

// startControlPlane runs kube-apiserver, kube-controller-manager and
// kube-scheduler in the underlay namespace, each with its own identity.
func (s *State) startControlPlane(ctx context.Context, p *pki.CA, topo *topology.Topology) error {
	saKey, saPub, err := p.ServiceAccountKey()
	if err != nil {
		return err
	}
	admCrt, admKey, err := p.Issue(pki.Cert{Name: "admin", CN: "twill-lab-admin", Orgs: []string{"system:masters"}})
	if err != nil {
		return err
	}
	s.AdminKubeconfig = filepath.Join(s.Dir, "admin.kubeconfig")
	if err := os.WriteFile(s.AdminKubeconfig, []byte(kubeconfig(s.APIServer, p.CAFile(), admCrt, admKey)), 0o600); err != nil {
		return err
	}
	if err := s.startAPIServer(ctx, p, topo, saKey, saPub); err != nil {
		return err
	}
	kn := s.kubeNet()
	for _, c := range []struct {
		name, cn string
		args     []string
	}{
		{"kube-controller-manager", "system:kube-controller-manager", append(kn.nodeMaskFlags(),
			"--allocate-node-cidrs", "--cluster-cidr="+strings.Join(kn.PodCIDRs, ","),
			"--service-cluster-ip-range="+strings.Join(kn.ServiceCIDRs, ","),
			"--service-account-private-key-file="+saKey, "--root-ca-file="+p.CAFile(),
			"--use-service-account-credentials", "--leader-elect=false",
			// Its default, /usr/libexec/kubernetes/..., would be created on
			// the machine.
			"--flex-volume-plugin-dir="+filepath.Join(s.Dir, "flexvolume"),
			"--bind-address=127.0.0.1", "--secure-port=10257", "--v=1")},
		{"kube-scheduler", "system:kube-scheduler", []string{"--leader-elect=false", "--bind-address=127.0.0.1", "--secure-port=10259", "--v=1"}},
	} {
		crt, key, err := p.Issue(pki.Cert{Name: c.name, CN: c.cn})
		if err != nil {
			return err
		}
		kc := filepath.Join(s.Dir, c.name+".kubeconfig")
		if err := os.WriteFile(kc, []byte(kubeconfig(s.APIServer, p.CAFile(), crt, key)), 0o600); err != nil {
			return err
		}
		args := append([]string{"--kubeconfig=" + kc, "--authentication-kubeconfig=" + kc, "--authorization-kubeconfig=" + kc}, c.args...)
		if err := s.spawn(c.name, topo.Underlay, filepath.Join(s.KubeBinDir, c.name), args...); err != nil {
			return err
		}
	}
	return s.save()
}

// startAPIServer runs kube-apiserver on the underlay bridge's address,
// waits until it is ready, and lets it reach kubelets (exec, logs).
func (s *State) startAPIServer(ctx context.Context, p *pki.CA, topo *topology.Topology, saKey, saPub string) error {
	addr, kn := topo.BridgeAddr, s.kubeNet()
	apiCrt, apiKey, err := p.Issue(pki.Cert{Name: "apiserver", CN: "kube-apiserver", Server: true,
		IPs: []netip.Addr{addr, netip.MustParseAddr(kn.KubernetesSvc), netip.MustParseAddr("127.0.0.1")},
		DNS: []string{"kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"}})
	if err != nil {
		return err
	}
	// The apiserver's identity towards kubelets: bound to
	// system:kubelet-api-admin below, not a member of system:masters.
	kcCrt, kcKey, err := p.Issue(pki.Cert{Name: "apiserver-kubelet-client", CN: "kube-apiserver-kubelet-client"})
	if err != nil {
		return err
	}
	if err := s.spawn("kube-apiserver", topo.Underlay, filepath.Join(s.KubeBinDir, "kube-apiserver"),
		"--etcd-servers="+s.EtcdURL,
		"--bind-address="+addr.String(), "--advertise-address="+addr.String(), "--secure-port="+strconv.Itoa(APIServerPort),
		"--tls-cert-file="+apiCrt, "--tls-private-key-file="+apiKey, "--client-ca-file="+p.CAFile(),
		"--authorization-mode=Node,RBAC", "--enable-admission-plugins=NodeRestriction",
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file="+saPub, "--service-account-signing-key-file="+saKey,
		"--service-cluster-ip-range="+strings.Join(kn.ServiceCIDRs, ","),
		"--kubelet-client-certificate="+kcCrt, "--kubelet-client-key="+kcKey,
		"--kubelet-preferred-address-types=InternalIP",
		"--allow-privileged=true", "--enable-priority-and-fairness=false", "--profiling=false",
		"--cert-dir="+filepath.Join(s.Dir, "apiserver"), "--v=1"); err != nil {
		return err
	}
	if err := cluster.Poll(ctx, 90*time.Second, "kube-apiserver to be ready", func() error {
		body, err := s.apiGet(ctx, "/readyz")
		if err == nil && strings.TrimSpace(string(body)) != "ok" {
			err = fmt.Errorf("/readyz: %s", body)
		}
		return s.processError(err, "kube-apiserver")
	}); err != nil {
		return err
	}
	rbac := `apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: twill-lab-apiserver-kubelet-client}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: system:kubelet-api-admin}
subjects: [{apiGroup: rbac.authorization.k8s.io, kind: User, name: kube-apiserver-kubelet-client}]
`
	if out, err := s.Kubectl(ctx, strings.NewReader(rbac), "apply", "-f", "-"); err != nil {
		return fmt.Errorf("binding the apiserver's kubelet client: %w\n%s", err, out)
	}
	return nil
}

// CNPHostPorts are the ports network-policy-api's conformance suite (v0.3.0)
// has its hostNetwork pods serve on.
const CNPHostPorts = "34345-34352"

// nodeSysctls sets, in node n's namespace, IP forwarding (a Kubernetes
// node prerequisite) and the ports network-policy-api's conformance suite
// serves on from hostNetwork pods (fixed, 34345 on), which the node's own
// connections (kubelet's, containerd's) must not take as source ports.
func (s *State) nodeSysctls(n Node) error {
	set := map[string]string{"net/ipv4/ip_forward": "1", "net/ipv4/ip_local_reserved_ports": CNPHostPorts}
	if s.IPFamily != "ipv4" {
		set["net/ipv6/conf/all/forwarding"] = "1"
	}
	for k, v := range set {
		if err := sysctl.SetIn("/var/run/netns/"+n.NS, k, v); err != nil {
			return err
		}
	}
	return nil
}

// startNode makes node i a Kubernetes node: its own root (mount
// namespace), Debian's containerd with the lab's images imported, kubelet
// and kube-proxy.
func (s *State) startNode(ctx context.Context, i int, nodeCrt, nodeKey string) error {
	n := s.Nodes[i]
	dir := filepath.Join(s.Dir, n.Name)
	if err := os.MkdirAll(filepath.Join(dir, "rootfs", "opt", "cni", "bin"), 0o755); err != nil {
		return err
	}
	// The node's operating system: its sysctls, the CNI plugins the OS
	// package provides, cgroups for its pods under a parent the lab owns.
	if err := s.nodeSysctls(n); err != nil {
		return err
	}
	for _, p := range []string{"loopback", "portmap"} {
		if err := copyFile("/usr/lib/cni/"+p, filepath.Join(dir, "rootfs", "opt", "cni", "bin", p), 0o755); err != nil {
			return err
		}
	}
	if err := makeCgroupRoot(n.NS); err != nil {
		return err
	}
	root, err := s.startNodeRoot(ctx, n, dir, s.Dir, s.KubeBinDir, s.ImageDir, s.BinDir)
	if err != nil {
		return err
	}
	for name, content := range map[string]string{
		"containerd.toml":    containerdConfig(s.PauseImage),
		"kubelet.yaml":       kubeletConfig(n.NS, s.CAFile, s.kubeNet().DNS),
		"kubelet.kubeconfig": kubeconfig(s.APIServer, s.CAFile, nodeCrt, nodeKey),
		"kube-proxy.yaml":    kubeProxyConfig(n.Name, filepath.Join(s.Dir, "kube-proxy.kubeconfig"), s.kubeNet().PodCIDRs, s.KubeProxyMode),
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600); err != nil {
			return err
		}
	}
	if err := s.spawnInNode("containerd", n.NS, root, "/usr/bin/containerd", "--config", filepath.Join(dir, "containerd.toml")); err != nil {
		return err
	}
	if err := cluster.Poll(ctx, 30*time.Second, n.Name+"'s containerd", func() error {
		_, err := s.NodeExec(ctx, n.Name, nil, "/usr/bin/ctr", "-a", "/run/containerd/containerd.sock", "version")
		return s.processError(err, "containerd")
	}); err != nil {
		return err
	}
	// Content only: containerd's CRI unpacks an image into a snapshot the
	// first time a container uses it, so the e2e stand-ins no pod
	// on this node runs cost a copy of their blobs, not a filesystem each
	// (3 nodes, e2e images: 45 s to Ready rather than 62-75 s).
	for _, img := range nodeImages(s.ImageDir) {
		if out, err := s.NodeExec(ctx, n.Name, nil, "/usr/bin/ctr", "-a", "/run/containerd/containerd.sock", "-n", "k8s.io",
			"images", "import", "--no-unpack", filepath.Join(s.ImageDir, img)); err != nil {
			return fmt.Errorf("importing %s into %s's containerd: %w\n%s", img, n.Name, err, out)
		}
	}
	// twill's image under the name the manifests ship with too, so that
	// what the docs apply as written (dist/flannel-migration) runs here.
	if out, err := s.NodeExec(ctx, n.Name, nil, "/usr/bin/ctr", "-a", "/run/containerd/containerd.sock", "-n", "k8s.io",
		"images", "tag", "--force", s.TwillImage, dist.ShippedImage); err != nil {
		return fmt.Errorf("tagging %s as %s in %s's containerd: %w\n%s", s.TwillImage, dist.ShippedImage, n.Name, err, out)
	}
	// Each node in a zone of its own, as a cloud labels its nodes, so
	// the suite's topology specs (hints, trafficDistribution) run.
	if err := s.spawnInNode("kubelet", n.NS, root, filepath.Join(s.KubeBinDir, "kubelet"),
		"--config="+filepath.Join(dir, "kubelet.yaml"), "--kubeconfig="+filepath.Join(dir, "kubelet.kubeconfig"),
		"--hostname-override="+n.Name, "--node-ip="+joinAddrs(n.nodeIPs()), "--node-labels="+ZoneLabel+"="+NodeZone(n.Name),
		"--v=1"); err != nil {
		return err
	}
	return s.spawnInNode("kube-proxy", n.NS, root, filepath.Join(s.KubeBinDir, "kube-proxy"),
		"--config="+filepath.Join(dir, "kube-proxy.yaml"), "--v=1")
}

// processError adds the end of a lab process's log to err when a process
// in one of roles has exited, so a failed wait says why.
func (s *State) processError(err error, roles ...string) error {
	if err == nil {
		return nil
	}
	s.mu.Lock()
	procs := slices.Clone(s.Processes)
	s.mu.Unlock()
	for _, p := range procs {
		if slices.Contains(roles, p.Role) && !alive(p.PID) {
			return fmt.Errorf("%w; %s (pid %d) exited; the end of %s:\n%s", err, p.Role, p.PID, p.Log, tailFile(p.Log, 1500))
		}
	}
	return err
}

// nodeError is processError for every node process.
func (s *State) nodeError(err error) error {
	return s.processError(err, "node-root", "containerd", "kubelet", "kube-proxy")
}

func tailFile(path string, n int) string {
	b, _ := os.ReadFile(path)
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

func copyFile(src, dst string, mode os.FileMode) error {
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	return os.WriteFile(dst, b, mode)
}
