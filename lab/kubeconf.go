package lab

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/twill-net/twill/dist"
)

// containerdConfig is a node's containerd (1.6 config format, which 1.7
// reads too). Paths are the standard ones: the node's root makes them the
// node's own. The CNI directories are where twill's DaemonSet installs the
// plugin and the conflist.
func containerdConfig(pauseImage string) string {
	return fmt.Sprintf(`version = 2
root = "/var/lib/containerd"
state = "/run/containerd"
disabled_plugins = [
  "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing",
]

[grpc]
  address = "/run/containerd/containerd.sock"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %q
  disable_apparmor = true
  enable_selinux = false
  # Root may lack CAP_SYS_RESOURCE (it does on the machines the lab is
  # tested on): then the sandbox's oom_score_adj -998 is refused and every
  # pod fails in runc. Clamp to containerd's own instead.
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/opt/cni/bin"
    conf_dir = "/etc/cni/net.d"
    max_conf_num = 1
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
`, pauseImage)
}

// kubeletConfig is a node's KubeletConfiguration. cgroupRoot puts every
// pod cgroup under one parent the lab owns; protectKernelDefaults makes
// kubelet check the machine-wide sysctls it would otherwise set (the
// node's root answers those checks); volumePluginDir keeps kubelet out of
// /usr.
func kubeletConfig(cgroupRoot, caFile, dns string) string {
	return fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: %s}
authorization: {mode: Webhook}
containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
cgroupDriver: cgroupfs
cgroupRoot: /%s
failCgroupV1: false
protectKernelDefaults: true
failSwapOn: false
volumePluginDir: /var/lib/kubelet/volumeplugins
clusterDomain: cluster.local
clusterDNS: [%q]
readOnlyPort: 0
serializeImagePulls: false
# The lab never pulls: images are imported. Disk-pressure eviction would
# make a busy test machine evict the lab's own pods.
imageGCHighThresholdPercent: 100
evictionHard: {memory.available: "50Mi", nodefs.available: "1%%", imagefs.available: "1%%"}
rotateCertificates: false
`, caFile, cgroupRoot, dns)
}

// kubeProxyConfig is a node's kube-proxy in iptables mode, or in mode
// ("" is iptables: nftables, the mode new clusters move to). The conntrack
// settings leave the machine-wide conntrack table size alone (maxPerCore
// and min 0; it is read-only outside the machine's own namespace) and set
// the TCP timeouts to kube-proxy's defaults, as a real node has them:
// those sysctls are the node namespace's own, so the machine's stay as
// they are.
func kubeProxyConfig(node, kubeconfigPath string, podCIDRs []string, mode string) string {
	if mode == "" {
		mode = "iptables"
	}
	return fmt.Sprintf(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: %s
clusterCIDR: %q
hostnameOverride: %s
clientConnection: {kubeconfig: %s}
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 24h0m0s, tcpCloseWaitTimeout: 1h0m0s}
iptables: {minSyncPeriod: 0s}
nftables: {minSyncPeriod: 0s}
`, mode, strings.Join(podCIDRs, ","), node, kubeconfigPath)
}

// InstallManifest is dist/kube-twill.yml as the lab applies it: the image
// reference replaced by the locally built one, and net-conf.json's
// backend set (the two edits the install docs tell an operator to make),
// and for a dual-stack or IPv6-only cluster (family dual or ipv6) its IPv6
// network (the one more edit Documentation/kubernetes.md gives); for
// wireguard, with dist/kube-twill-wireguard.yml after it.
func InstallManifest(image, backendType, family string) ([]byte, error) {
	return EditManifest(dist.KubeManifest, dist.WireGuardKeeperManifest, image, backendType, family)
}

// EditManifest is InstallManifest of another kube-twill.yml and
// kube-twill-wireguard.yml (an earlier build's, for version skew).
func EditManifest(kube, keeper []byte, image, backendType, family string) ([]byte, error) {
	m := kube
	if !bytes.Contains(m, []byte(dist.ShippedImage)) {
		return nil, fmt.Errorf("kube-twill.yml no longer names %s; update dist.ShippedImage", dist.ShippedImage)
	}
	m = bytes.ReplaceAll(m, []byte(dist.ShippedImage), []byte(image))
	const vxlan = `"Type": "vxlan"`
	if !bytes.Contains(m, []byte(vxlan)) {
		return nil, fmt.Errorf("kube-twill.yml's net-conf.json no longer holds %s", vxlan)
	}
	t, err := json.Marshal(backendType)
	if err != nil {
		return nil, err
	}
	m = bytes.Replace(m, []byte(vxlan), []byte(`"Type": `+string(t)), 1)
	if m, err = withIPv6(m, family); err != nil {
		return nil, err
	}
	if backendType == "wireguard" {
		// This machine's kernel has no wireguard module: the keeper too.
		k := bytes.ReplaceAll(keeper, []byte(dist.ShippedImage), []byte(image))
		m = append(append(m, []byte("\n---\n")...), k...)
	}
	return m, nil
}

// withIPv6 edits net-conf.json in manifest m for a cluster of IP family
// family: IPv6 pods in ClusterCIDRV6 too (dual), or only (ipv6).
func withIPv6(m []byte, family string) ([]byte, error) {
	network := fmt.Sprintf(`"Network": %q,`, ClusterCIDR)
	if !bytes.Contains(m, []byte(network)) {
		return nil, fmt.Errorf("kube-twill.yml's net-conf.json no longer holds %s", network)
	}
	v6 := fmt.Sprintf(`"EnableIPv6": true, "IPv6Network": %q,`, ClusterCIDRV6)
	switch family {
	case "dual":
		return bytes.Replace(m, []byte(network), []byte(network+" "+v6), 1), nil
	case "ipv6":
		return bytes.Replace(m, []byte(network), []byte(`"EnableIPv4": false, `+v6), 1), nil
	}
	return m, nil
}

// workloadManifest is the lab's test workload: an echo Deployment spread
// over the nodes, a ClusterIP Service in front of it (of both families in
// a dual-stack lab), and one pod with a
// hostPort (served by the twill plugin's host-port table) on the first node.
func workloadManifest(image string, replicas int, firstNode string) string {
	r := strings.NewReplacer("IMAGE", image, "REPLICAS", fmt.Sprint(replicas), "NODE", firstNode,
		"ECHOPORT", fmt.Sprint(EchoPort), "HOSTPORT", fmt.Sprint(HostPort), "NAMESPACE", kubeNamespace)
	return r.Replace(`apiVersion: v1
kind: Namespace
metadata: {name: NAMESPACE}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: echo, namespace: NAMESPACE}
spec:
  replicas: REPLICAS
  selector: {matchLabels: {app: echo}}
  template:
    metadata: {labels: {app: echo}}
    spec:
      automountServiceAccountToken: false
      terminationGracePeriodSeconds: 1
      topologySpreadConstraints:
        - {maxSkew: 1, topologyKey: kubernetes.io/hostname, whenUnsatisfiable: DoNotSchedule, labelSelector: {matchLabels: {app: echo}}}
      containers:
        - name: echo
          image: IMAGE
          command: ["/usr/local/bin/twill-lab", "lab", "echo-server", "--port", "ECHOPORT"]
          ports: [{containerPort: ECHOPORT}]
          readinessProbe: {tcpSocket: {port: ECHOPORT}, periodSeconds: 1}
          resources: {requests: {cpu: 5m, memory: 16Mi}}
---
apiVersion: v1
kind: Service
metadata: {name: echo, namespace: NAMESPACE}
spec:
  selector: {app: echo}
  ipFamilyPolicy: PreferDualStack
  ports: [{name: tcp, port: 80, targetPort: ECHOPORT}, {name: udp, protocol: UDP, port: 80, targetPort: ECHOPORT}]
---
apiVersion: v1
kind: Pod
metadata: {name: hostport, namespace: NAMESPACE, labels: {app: hostport}}
spec:
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 1
  nodeSelector: {kubernetes.io/hostname: NODE}
  containers:
    - name: echo
      image: IMAGE
      command: ["/usr/local/bin/twill-lab", "lab", "echo-server", "--port", "ECHOPORT"]
      ports: [{containerPort: ECHOPORT, hostPort: HOSTPORT}]
      readinessProbe: {tcpSocket: {port: ECHOPORT}, periodSeconds: 1}
      resources: {requests: {cpu: 5m, memory: 16Mi}}
`)
}
