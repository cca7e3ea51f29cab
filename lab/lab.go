// Package lab builds a twill cluster on one Linux machine out of network
// namespaces: an underlay (one bridge, or two segments and a router), node
// namespaces each running the built twilld, an etcd in the underlay, and
// pods wired by the twill CNI plugin through libcni. twillctl lab drives it.
//
// Everything a lab creates is named twl-<name>-…, and its files live in
// one state directory, so `lab down` can remove a lab completely even after
// `lab up` was killed half-way: it deletes every namespace with the lab's
// prefix, stops (by PID) the processes that live in them, and removes the
// state directory. A lab never touches the namespace it is started from.
package lab

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/twill-net/twill/internal/atomicfile"
	"github.com/twill-net/twill/lab/cluster"
)

// Ports used inside the lab's namespaces.
const (
	EtcdPort    = cluster.EtcdPort
	EchoPort    = 7777
	HealthzPort = 10267
)

// DefaultStateRoot holds one directory per lab.
const DefaultStateRoot = "/run/twill-lab"

// Options describe a lab.
type Options struct {
	Name        string
	Nodes       int
	PodsPerNode int
	Backend     string // vxlan, host-gw, wireguard (or any backend the twilld in BinDir has)
	Underlay    string // flat or routed; "vpc" for eni (set by Validate)
	ENIMode     string // eni: prefix or secondary-ip
	Netfilter   string // twilld's --netfilter: auto (default), iptables or nftables
	BinDir      string // holds twilld, twill and twillctl
	StateRoot   string
	// Kubernetes makes the lab a Kubernetes cluster (control plane,
	// containerd, kubelet, kube-proxy) with twill installed from
	// dist/kube-twill.yml; KubeBinDir and ImageDir default to build/
	// next to BinDir.
	Kubernetes bool
	KubeBinDir string
	ImageDir   string
	// CRDs are applied before the network is installed (kubectl apply,
	// then wait until established). Default: the ClusterNetworkPolicy CRD
	// make setup fetches, build/cnp/current/crd-experimental.yaml next to
	// BinDir, when it is there.
	CRDs []string
	// Helm installs twill with helm install from dist/chart/twill
	// instead of kubectl apply -f dist/kube-twill.yml; HelmSet are more
	// values (helm --set), HelmBin the helm binary (default:
	// build/helm/current/helm next to BinDir).
	Helm    bool
	HelmSet []string
	HelmBin string
	// Flannel starts the Kubernetes lab on flannel instead of twill:
	// kube-flannel's DaemonSet shape, flanneld --kube-subnet-mgr from
	// ImageDir's flannel.tar, to try the migration to twill on.
	Flannel bool
	// KeepOnFailure leaves a lab whose up failed in place, to look at.
	KeepOnFailure bool
	// NetnsPrefix replaces "twl" in the names of the lab's namespaces.
	NetnsPrefix string
	// Bare makes machines only: nodes with a root of their own (private
	// /run, /var/lib, /var/log, /opt and /etc, as a Kubernetes lab's) on
	// the underlay, and nothing running, to follow an install by hand with
	// lab exec (the etcd quickstart, say). Pods and backends do not apply.
	Bare bool
	// UnderlayCIDR is the nodes' segment (an IPv4 /24; default
	// 10.99.0.0/24): nodes take .1, .2, ... and the underlay namespace .254.
	UnderlayCIDR netip.Prefix
	// IPFamily is the families of the underlay and the pods alike: ipv4
	// (the default), ipv6 or dual. An IPv6 underlay is fd99:0:0:1::/64
	// (and fd99:0:0:2::/64 past the router), IPv6 pods fd00:10::/56.
	IPFamily string
	// KubeProxyMode is a Kubernetes lab's kube-proxy mode: iptables (the
	// default) or nftables (GA since Kubernetes 1.33).
	KubeProxyMode string
}

// The lab's IPv6 underlay and pod network.
const (
	underlayV6  = "fd99:0:0:1::/64"
	ipv6Network = "fd00:10::/56"
)

var nameRE = regexp.MustCompile(`^[a-z0-9]{1,8}$`)

// Validate checks the options and says what is wrong, before anything is
// created.
func (o *Options) Validate() error {
	if o.StateRoot == "" {
		o.StateRoot = DefaultStateRoot
	}
	if !nameRE.MatchString(o.Name) {
		return fmt.Errorf("--name %q: use 1 to 8 lowercase letters or digits", o.Name)
	}
	if !o.UnderlayCIDR.IsValid() {
		o.UnderlayCIDR = netip.MustParsePrefix("10.99.0.0/24")
	}
	if !o.UnderlayCIDR.Addr().Is4() || o.UnderlayCIDR.Bits() != 24 || o.UnderlayCIDR.Masked() != o.UnderlayCIDR {
		return fmt.Errorf("--underlay-cidr %s: an IPv4 /24 network address", o.UnderlayCIDR)
	}
	if o.Bare && (o.Kubernetes || o.Underlay != "flat") {
		return errors.New("--bare: a flat underlay of bare machines; drop --kubernetes and --underlay")
	}
	if o.Nodes < 1 || o.Nodes > 50 {
		return fmt.Errorf("--nodes %d: between 1 and 50", o.Nodes)
	}
	if o.PodsPerNode < 0 || o.PodsPerNode > 20 {
		return fmt.Errorf("--pods-per-node %d: between 0 and 20", o.PodsPerNode)
	}
	if err := oneOf("--underlay", &o.Underlay, "", "flat", "routed"); err != nil {
		return err
	}
	if err := oneOf("--ip-family", &o.IPFamily, "ipv4", "ipv4", "ipv6", "dual"); err != nil {
		return err
	}
	if o.IPFamily != "ipv4" && (o.Bare || o.Backend == "eni") {
		return fmt.Errorf("--ip-family %s: the vxlan, host-gw and wireguard labs only (the bare and eni labs are IPv4)", o.IPFamily)
	}
	if o.IPFamily != "ipv4" && o.Kubernetes && (o.Flannel || (o.Backend != "vxlan" && o.Backend != "host-gw")) {
		return fmt.Errorf("--ip-family %s --kubernetes: twill's vxlan or host-gw (--backend, without --flannel)", o.IPFamily)
	}
	if err := oneOf("--netfilter", &o.Netfilter, "auto", "auto", "iptables", "nftables"); err != nil {
		return err
	}
	if o.KubeProxyMode != "" && !o.Kubernetes {
		return fmt.Errorf("--kube-proxy-mode %s: a Kubernetes lab's (--kubernetes)", o.KubeProxyMode)
	}
	if err := oneOf("--kube-proxy-mode", &o.KubeProxyMode, "iptables", "iptables", "nftables"); err != nil {
		return err
	}
	if o.Flannel && (!o.Kubernetes || (o.Backend != "vxlan" && o.Backend != "host-gw")) {
		return fmt.Errorf("--flannel: a Kubernetes lab (--kubernetes) with --backend vxlan or host-gw, the backends twill takes over from flannel")
	}
	if o.Kubernetes && o.Netfilter != "auto" {
		return fmt.Errorf("--netfilter %s --kubernetes: the Kubernetes lab runs dist/kube-twill.yml as shipped, whose twilld chooses the mode itself (auto); drop --netfilter", o.Netfilter)
	}
	if o.Backend == "eni" {
		if o.Underlay == "routed" {
			return errors.New("--backend eni --underlay routed: the eni lab runs on its own simulated VPC; drop --underlay")
		}
		o.Underlay = "vpc"
		switch o.ENIMode {
		case "":
			o.ENIMode = "prefix"
		case "prefix", "secondary-ip":
		default:
			return fmt.Errorf("--eni-mode %q: prefix or secondary-ip", o.ENIMode)
		}
	}
	if o.Backend == "host-gw" && o.Underlay == "routed" {
		return errors.New("--backend host-gw --underlay routed: host-gw routes each peer's subnet via the peer's own address, " +
			"which must be on the same L2 segment; across a router it cannot work. Use --underlay flat, or --backend vxlan")
	}
	for _, b := range []string{DaemonBinary(o.Backend), "twill", "twillctl", "twill-lab"} {
		if _, err := os.Stat(filepath.Join(o.BinDir, b)); err != nil {
			return fmt.Errorf("%s not found next to twillctl in %s (run make build): %w", b, o.BinDir, err)
		}
	}
	if o.Kubernetes {
		return o.validateKube()
	}
	return nil
}

// oneOf checks a flag's value against its choices, an empty one taking def
// first ("" for none).
func oneOf(flag string, v *string, def string, choices ...string) error {
	if *v == "" {
		*v = def
	}
	if slices.Contains(choices, *v) {
		return nil
	}
	last := len(choices) - 1
	return fmt.Errorf("%s %q: %s or %s", flag, *v, strings.Join(choices[:last], ", "), choices[last])
}

// DaemonBinary names the twilld a lab of the backend runs: twilld-lab (the
// built-in backends plus the eni backend's simulated cloud) for eni, the
// shipped twilld otherwise.
func DaemonBinary(backend string) string {
	if backend == "eni" {
		return "twilld-lab"
	}
	return "twilld"
}

// DefaultNetnsPrefix starts the names of every lab's namespaces (and
// cgroups): twl-<name>-n1 and so on.
const DefaultNetnsPrefix = "twl"

// NetnsPrefix is a lab's namespace name prefix ("twl-<name>"). A prefix of
// one's own keeps labs of the same names apart (tests running the docs'
// commands use one per run).
func NetnsPrefix(prefix, name string) string {
	if prefix == "" {
		prefix = DefaultNetnsPrefix
	}
	return prefix + "-" + name
}

func (s *State) prefix() string { return NetnsPrefix(s.NetnsPrefix, s.Name) }

// underlayNS is the namespace of the lab's underlay: its bridge, etcd and a
// Kubernetes lab's control plane.
func (s *State) underlayNS() string { return s.prefix() + "-ul" }

// Dir is the lab's state directory.
func Dir(stateRoot, name string) string { return filepath.Join(stateRoot, name) }

// State is what a running lab is made of, recorded in <dir>/state.json as
// `lab up` goes.
type State struct {
	Name        string `json:"name"`
	NetnsPrefix string `json:"netnsPrefix,omitempty"`
	Dir         string `json:"dir"`
	Backend     string `json:"backend"`
	ENIMode     string `json:"eniMode,omitempty"`
	Netfilter   string `json:"netfilter,omitempty"`
	IPFamily    string `json:"ipFamily,omitempty"`
	// KubeProxyMode is a Kubernetes lab's kube-proxy mode ("": iptables).
	KubeProxyMode string    `json:"kubeProxyMode,omitempty"`
	Underlay      string    `json:"underlay"`
	Bare          bool      `json:"bare,omitempty"`
	Created       time.Time `json:"created"`
	EtcdURL       string    `json:"etcdURL"`
	EtcdSock      string    `json:"etcdSock"`
	Nodes         []Node    `json:"nodes"`
	Pods          []Pod     `json:"pods"`
	// Processes the lab started, by PID, with the namespace they run in.
	Processes []Process `json:"processes"`
	Ready     bool      `json:"ready"`
	BinDir    string    `json:"binDir"`

	// A Kubernetes lab's control plane, binaries and images.
	Kubernetes      bool   `json:"kubernetes,omitempty"`
	KubeBinDir      string `json:"kubeBinDir,omitempty"`
	ImageDir        string `json:"imageDir,omitempty"`
	APIServer       string `json:"apiserver,omitempty"`
	CAFile          string `json:"caFile,omitempty"`
	AdminKubeconfig string `json:"adminKubeconfig,omitempty"`
	TwillImage      string `json:"twillImage,omitempty"`
	PauseImage      string `json:"pauseImage,omitempty"`
	LabImage        string `json:"labImage,omitempty"` // twill-lab, for the echo pods
	CoreDNSImage    string `json:"corednsImage,omitempty"`
	FlannelImage    string `json:"flannelImage,omitempty"`
	// HelmBin is the helm lab helm runs (lab up --helm's, or the one
	// found when the lab came up).
	HelmBin string `json:"helmBin,omitempty"`

	// mu guards Processes and saving while nodes start in parallel.
	mu sync.Mutex
}

// Node is one simulated host.
type Node struct {
	Name string     `json:"name"`
	NS   string     `json:"netns"`
	Addr netip.Addr `json:"addr"`
	// AddrV6 is the node's IPv6 address on an IPv6 or dual-stack underlay
	// (on an IPv6-only one, Addr too).
	AddrV6 netip.Addr   `json:"addrV6,omitzero"`
	Subnet netip.Prefix `json:"subnet"`
	// IPv6Subnet is the node's IPv6 pod subnet, in a lab with IPv6 pods.
	IPv6Subnet netip.Prefix `json:"ipv6Subnet,omitzero"`
}

// Pod is one pod: a network namespace wired by the plugin through
// libcni, or in a Kubernetes lab a pod of the lab's workload (UID set, NS
// empty: its namespace is found through its cgroup).
type Pod struct {
	Name string     `json:"name"`
	Node string     `json:"node"`
	NS   string     `json:"netns,omitempty"`
	IP   netip.Addr `json:"ip"`
	// IPv6 is a dual-stack pod's IPv6 address (IP is its IPv4 one).
	IPv6 netip.Addr `json:"ipv6,omitzero"`
	UID  string     `json:"uid,omitempty"`
}

// addrList is the pod's addresses, comma-separated.
func (p Pod) addrList() string {
	var ips []string
	for _, a := range p.Addrs() {
		ips = append(ips, a.String())
	}
	return strings.Join(ips, ",")
}

// subnets is the node's pod subnets, comma-separated.
func (n Node) subnets() string {
	var out []string
	for _, s := range []netip.Prefix{n.Subnet, n.IPv6Subnet} {
		if s.IsValid() {
			out = append(out, s.String())
		}
	}
	return strings.Join(out, ",")
}

// Addrs are the pod's addresses, one per family it has.
func (p Pod) Addrs() []netip.Addr {
	if p.IPv6.IsValid() {
		return []netip.Addr{p.IP, p.IPv6}
	}
	return []netip.Addr{p.IP}
}

// Process is a process the lab started.
type Process struct {
	PID  int    `json:"pid"`
	Role string `json:"role"`
	NS   string `json:"netns"`
	Log  string `json:"log"`
	// Argv is how it was started (its launcher, ip netns exec or
	// nsenter, first), for lab restart.
	Argv []string `json:"argv,omitempty"`
}

func (s *State) save() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := atomicfile.WriteJSON(filepath.Join(s.Dir, "state.json"), s, 0o644); err != nil {
		return fmt.Errorf("recording lab state: %w", err)
	}
	return nil
}

// Load reads a lab's recorded state.
func Load(stateRoot, name string) (*State, error) {
	var s State
	err := atomicfile.ReadJSON(filepath.Join(Dir(stateRoot, name), "state.json"), &s)
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("no lab %q (nothing in %s): start one with twillctl lab up --name %s", name, Dir(stateRoot, name), name)
	}
	if err != nil {
		return nil, fmt.Errorf("reading lab %q state: %w", name, err)
	}
	return &s, nil
}

// Find returns the namespace of a node or pod by name.
func (s *State) Find(name string) (string, bool) {
	for _, n := range s.Nodes {
		if n.Name == name || n.NS == name {
			return n.NS, true
		}
	}
	for _, p := range s.Pods {
		if p.Name == name || p.NS == name {
			return p.NS, true
		}
	}
	return "", false
}
