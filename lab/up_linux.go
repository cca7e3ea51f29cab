package lab

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/twill-net/twill/lab/cluster"
	"github.com/twill-net/twill/lab/cnidriver"
	"github.com/twill-net/twill/lab/ociimage"
	"github.com/twill-net/twill/lab/topology"
	"github.com/twill-net/twill/nl"
	"github.com/twill-net/twill/subnet"
)

// Up builds the lab and returns once every node is ready and every pod is
// wired. progress receives one line per step. On failure it removes what
// it built; if it is killed instead, Down removes it.
func Up(ctx context.Context, o Options, progress io.Writer) (_ *State, err error) {
	if err := o.Validate(); err != nil { // fills in the defaults too
		return nil, err
	}
	s, err := newState(o)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil && o.KeepOnFailure {
			fmt.Fprintf(progress, "lab up failed; kept for inspection (twillctl lab down --name %s removes it)\n", o.Name)
		} else if err != nil {
			fmt.Fprintf(progress, "lab up failed; removing what was built\n")
			if derr := Down(o.StateRoot, o.Name, o.NetnsPrefix); derr != nil {
				err = fmt.Errorf("%w (and cleaning up: %v)", err, derr)
			}
		}
	}()
	step := func(format string, args ...any) { fmt.Fprintf(progress, "• "+format+"\n", args...) }
	start := time.Now()

	step("underlay (%s) and %d node namespaces", o.Underlay, o.Nodes)
	topo, conf, err := s.buildTopology(o)
	if err != nil {
		return nil, err
	}
	switch {
	case o.Bare:
		step("a root of its own for every node (lab exec runs commands there)")
		err = s.upBare(ctx)
	default:
		step("etcd in %s", topo.Underlay)
		err = s.upEtcd(ctx, topo, conf)
	}
	if err == nil && o.Kubernetes {
		err = s.upKube(ctx, o, topo, step)
	} else if err == nil && !o.Bare {
		step("twilld (%s) in every node", o.Backend)
		err = s.upDaemons(ctx, o)
	}
	if err == nil && o.PodsPerNode > 0 && !o.Bare {
		err = s.upPods(ctx, o, step)
	}
	if err != nil {
		return nil, err
	}
	s.Ready = true
	if err := s.save(); err != nil {
		return nil, err
	}
	step("ready in %s", time.Since(start).Round(100*time.Millisecond))
	return s, nil
}

// newState records a new lab's state (o is validated); nothing is built
// yet.
func newState(o Options) (*State, error) {
	if existing, _ := namespaces(NetnsPrefix(o.NetnsPrefix, o.Name)); len(existing) > 0 {
		return nil, fmt.Errorf("lab %q already exists (%d namespaces); twillctl lab down --name %s first", o.Name, len(existing), o.Name)
	}
	dir := Dir(o.StateRoot, o.Name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("creating %s: %w", dir, err)
	}
	s := &State{Name: o.Name, NetnsPrefix: o.NetnsPrefix, Bare: o.Bare, Dir: dir, Backend: o.Backend, ENIMode: o.ENIMode, Netfilter: o.Netfilter,
		IPFamily: o.IPFamily, Underlay: o.Underlay, Created: time.Now(), BinDir: o.BinDir}
	if o.Kubernetes {
		s.KubeProxyMode = o.KubeProxyMode
	}
	if o.Kubernetes {
		// Read the images' names first: a missing or broken image fails
		// before anything is built.
		var err error
		if s.TwillImage, err = ociimage.Ref(filepath.Join(o.ImageDir, "twill.tar")); err != nil {
			return nil, err
		}
		if s.PauseImage, err = ociimage.Ref(filepath.Join(o.ImageDir, "pause.tar")); err != nil {
			return nil, err
		}
		if s.LabImage, err = ociimage.Ref(filepath.Join(o.ImageDir, "lab.tar")); err != nil {
			return nil, err
		}
		if s.CoreDNSImage, err = ociimage.Ref(filepath.Join(o.ImageDir, "coredns.tar")); err != nil {
			return nil, err
		}
		if o.Flannel {
			if s.FlannelImage, err = ociimage.Ref(filepath.Join(o.ImageDir, "flannel.tar")); err != nil {
				return nil, fmt.Errorf("--flannel: %w", err)
			}
		}
	}
	return s, s.save()
}

// buildTopology makes the namespaces and returns the net-conf.json the
// lab's backend runs with.
func (s *State) buildTopology(o Options) (*topology.Topology, string, error) {
	topts := topology.Options{Prefix: NetnsPrefix(o.NetnsPrefix, o.Name), Nodes: o.Nodes,
		Underlay: o.UnderlayCIDR, Routed: o.Underlay == "routed", DefaultRoute: o.Kubernetes || o.Bare}
	conf := fmt.Sprintf(`{"Network":"10.244.0.0/16","Backend":{"Type":%q}}`, o.Backend)
	switch o.IPFamily {
	case "ipv6":
		topts.Underlay, topts.UnderlayV6 = netip.Prefix{}, netip.MustParsePrefix(underlayV6)
		conf = fmt.Sprintf(`{"EnableIPv4":false,"EnableIPv6":true,"IPv6Network":%q,"Backend":{"Type":%q}}`, ipv6Network, o.Backend)
	case "dual":
		topts.UnderlayV6 = netip.MustParsePrefix(underlayV6)
		conf = fmt.Sprintf(`{"Network":"10.244.0.0/16","EnableIPv6":true,"IPv6Network":%q,"Backend":{"Type":%q}}`, ipv6Network, o.Backend)
	}
	if o.Backend == "eni" {
		// A simulated VPC 10.10.0.0/16: primary NICs on 10.10.0.0/24, ENIs
		// on 10.10.1.0/24, pod prefixes (or secondary IPs) routed by the
		// fabric, up to 16 secondary IPs per ENI.
		state := filepath.Join(s.Dir, "vpc.json")
		topts.Underlay = netip.MustParsePrefix("10.10.0.0/24")
		topts.VPC = &topology.VPCOptions{Space: netip.MustParsePrefix("10.10.0.0/16"), ENISubnet: netip.MustParsePrefix("10.10.1.0/24"),
			MaxIPsPerENI: 16, StateFile: state}
		conf = fmt.Sprintf(`{"Network":"10.10.128.0/17","SubnetLen":24,"Backend":{"Type":"eni","Interface":"eth1","Mode":%q,"Provider":"sim","ProviderConfig":{"StateFile":%q}}}`,
			o.ENIMode, state)
	}
	topo, err := topology.Build(topts)
	if err != nil {
		return nil, "", err
	}
	for _, n := range topo.Nodes {
		s.Nodes = append(s.Nodes, Node{Name: n.Name, NS: n.NS, Addr: n.Addr.Addr(), AddrV6: n.AddrV6.Addr()})
	}
	return topo, conf, s.save()
}

// upBare gives every node a root of its own, for an install by hand.
func (s *State) upBare(ctx context.Context) error {
	cwd, _ := os.Getwd()
	for _, n := range s.Nodes {
		if _, err := s.startNodeRoot(ctx, n, filepath.Join(s.Dir, n.Name), s.Dir, s.BinDir, cwd); err != nil {
			return err
		}
	}
	return nil
}

// upEtcd starts the cluster's etcd and stores the network configuration.
func (s *State) upEtcd(ctx context.Context, topo *topology.Topology, conf string) error {
	e := cluster.NewEtcd(topo, s.Dir, filepath.Join(s.BinDir, "twill-lab"))
	s.EtcdURL, s.EtcdSock = e.URL, e.Sock
	defer e.Close()
	if err := e.Start(ctx, s.spawnArgv); err != nil {
		return err
	}
	return e.PutConfig(ctx, conf)
}

// upDaemons starts twilld in every node and waits for their first
// reconcile.
func (s *State) upDaemons(ctx context.Context, o Options) error {
	for _, n := range s.Nodes {
		nodeDir := cluster.NodeDir(s.Dir, n.Name)
		if err := os.MkdirAll(nodeDir, 0o755); err != nil {
			return err
		}
		argv := append([]string{filepath.Join(o.BinDir, DaemonBinary(o.Backend))},
			cluster.DaemonArgs(s.EtcdURL, nodeDir, "--ip-masq", "--netfilter", o.Netfilter, "--healthz-port", fmt.Sprint(HealthzPort))...)
		if err := s.spawnArgv("twilld", n.NS, argv...); err != nil {
			return err
		}
	}
	return s.waitReady(ctx)
}

// upPods wires pods in every node: a Deployment, a Service and a hostPort
// pod in a Kubernetes lab; pod namespaces through libcni otherwise.
func (s *State) upPods(ctx context.Context, o Options, step func(string, ...any)) error {
	if o.Kubernetes {
		step("%d pods per node (Deployment echo), a ClusterIP Service, a hostPort pod", o.PodsPerNode)
		return s.deployWorkload(ctx, o.PodsPerNode)
	}
	step("%d pods per node, wired by the twill CNI plugin through libcni", o.PodsPerNode)
	for i := range s.Nodes {
		if err := s.addPods(ctx, o, i); err != nil {
			return err
		}
	}
	return nil
}

// spawnArgv is spawn in cluster.Spawn's shape.
func (s *State) spawnArgv(role, ns string, argv ...string) error {
	return s.spawn(role, ns, argv[0], argv[1:]...)
}

// spawn starts a process in a namespace, detached from the caller (its own
// session, output to a log file), and records its PID.
func (s *State) spawn(role, ns, bin string, args ...string) error {
	_, err := s.start(role, ns, append([]string{"ip", "netns", "exec", ns, bin}, args...), &syscall.SysProcAttr{Setsid: true})
	return err
}

// start runs argv (a launcher such as `ip netns exec` or nsenter, which
// exec the process in place, so the PID is the process's own), logs to
// <role>-<ns>.log and records the PID.
func (s *State) start(role, ns string, argv []string, attr *syscall.SysProcAttr) (int, error) {
	log := filepath.Join(s.Dir, fmt.Sprintf("%s-%s.log", role, strings.TrimPrefix(ns, s.prefix()+"-")))
	f, err := os.OpenFile(log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = attr
	cmd.Env = append(os.Environ(), labMark+"="+s.Dir) // lab down finds it by this, recorded or not
	if err := cmd.Start(); err != nil {
		return 0, fmt.Errorf("starting %s in %s: %w", role, ns, err)
	}
	s.mu.Lock()
	s.Processes = append(s.Processes, Process{PID: cmd.Process.Pid, Role: role, NS: ns, Log: log, Argv: argv})
	s.mu.Unlock()
	go func() { _ = cmd.Wait() }() // reap it if it dies while we run
	return cmd.Process.Pid, s.save()
}

// readyWithin bounds each of waitReady's waits. A node's twilld is ready
// in a second or two here; under make test-kernels' emulator on a loaded
// machine, a dual-stack host-gw lab with iptables did not write subnet.env
// within 30s on 6.1 and 6.12 (and did in 29s, everything included, with
// the machine otherwise idle).
const readyWithin = 90 * time.Second

// waitReady waits until every node wrote subnet.env and routes to every
// peer (the daemon's first reconcile is done).
func (s *State) waitReady(ctx context.Context) error {
	for i := range s.Nodes {
		n := &s.Nodes[i]
		path := filepath.Join(s.Dir, n.Name, "subnet.env")
		if err := cluster.Poll(ctx, readyWithin, n.Name+" to write subnet.env", func() error {
			env, err := subnet.ReadEnv(path)
			if err != nil {
				return s.daemonError(n.NS, err)
			}
			n.Subnet, n.IPv6Subnet = env.Subnet, env.IPv6Subnet
			return nil
		}); err != nil {
			return err
		}
	}
	for _, n := range s.Nodes {
		h, err := nl.Open(n.NS)
		if err != nil {
			return err
		}
		filter, want, family := nl.RouteFilter{Protocol: nl.RouteProtocol}, len(s.Nodes)-1, nl.FamilyV4
		switch s.IPFamily {
		case "ipv6":
			family = nl.FamilyV6
		case "dual":
			family, want = nl.FamilyAll, 2*want
		}
		if s.Backend == "eni" {
			// The ENI table: the VPC subnet, the gateway, and (prefix
			// mode) a route per peer prefix.
			filter.Table, want = nl.ENIRouteTable, 2
			if s.ENIMode == "prefix" {
				want += len(s.Nodes) - 1
			}
		}
		err = cluster.Poll(ctx, readyWithin, n.Name+" to route to every peer", func() error {
			rs, err := h.Routes(family, filter)
			if err != nil {
				return err
			}
			// A peer's route, not the wireguard backend's blackhole.
			rs = slices.DeleteFunc(rs, func(r nl.Route) bool { return r.Type == nl.RouteBlackhole })
			if len(rs) < want {
				return s.daemonError(n.NS, fmt.Errorf("%d of %d routes", len(rs), want))
			}
			return nil
		})
		h.Close()
		if err != nil {
			return fmt.Errorf("%w\n%s", err, s.daemonLogTails(15))
		}
	}
	return s.save()
}

// daemonLogTails is the last n lines of every node's twilld log, for a
// failure whose daemons are alive but have not done what was waited for.
func (s *State) daemonLogTails(n int) string {
	var b strings.Builder
	for _, p := range s.Processes {
		if p.Role != "twilld" {
			continue
		}
		data, _ := os.ReadFile(p.Log)
		lines := strings.Split(strings.TrimSpace(string(data)), "\n")
		fmt.Fprintf(&b, "twilld in %s, last %d lines of %s:\n", p.NS, min(n, len(lines)), p.Log)
		for _, l := range lines[max(0, len(lines)-n):] {
			fmt.Fprintf(&b, "  %s\n", l)
		}
	}
	return b.String()
}

// daemonError adds the end of a node's twilld log to err when the daemon
// has exited, so a failure says why.
func (s *State) daemonError(ns string, err error) error {
	for _, p := range s.Processes {
		if p.NS == ns && p.Role == "twilld" && !alive(p.PID) {
			b, _ := os.ReadFile(p.Log)
			lines := strings.Split(strings.TrimSpace(string(b)), "\n")
			return fmt.Errorf("twilld in %s exited: %s", ns, lines[len(lines)-1])
		}
	}
	return err
}

func (s *State) addPods(ctx context.Context, o Options, i int) error {
	n := s.Nodes[i]
	nodeDir := filepath.Join(s.Dir, n.Name)
	var pods []Pod
	var atts []cnidriver.Attachment
	for k := 1; k <= o.PodsPerNode; k++ {
		p := Pod{Name: fmt.Sprintf("%s-pod%d", n.Name, k), Node: n.Name, NS: fmt.Sprintf("%s-p%d", n.NS, k)}
		if out, err := exec.Command("ip", "netns", "add", p.NS).CombinedOutput(); err != nil {
			return fmt.Errorf("ip netns add %s: %w: %s", p.NS, err, out)
		}
		if err := topology.IP(p.NS, "link", "set", "lo", "up"); err != nil {
			return err
		}
		pods = append(pods, p)
		atts = append(atts, cnidriver.Attachment{ContainerID: p.Name, IfName: "eth0", Netns: "/var/run/netns/" + p.NS})
	}
	// The versions dist/10-twill.conflist declares: every runtime reads it.
	list := fmt.Sprintf(`{"cniVersion":"1.0.0","cniVersions":["1.0.0","1.1.0"],"name":"lab","plugins":[{"type":"twill","subnetFile":%q,"dataDir":%q}]}`,
		filepath.Join(nodeDir, "subnet.env"), filepath.Join(nodeDir, "networks"))
	if err := os.WriteFile(filepath.Join(nodeDir, "10-twill.conflist"), []byte(list), 0o644); err != nil {
		return err
	}
	resp, err := CNI(ctx, o.BinDir, n.NS, cnidriver.Request{Op: "add", ConfList: json.RawMessage(list), BinDirs: []string{o.BinDir},
		CacheDir: filepath.Join(nodeDir, "cni-cache"), Attachments: atts, Parallel: true})
	if err != nil {
		return err
	}
	for k, out := range resp.Outcomes {
		if out.Error != "" {
			return fmt.Errorf("CNI ADD of %s: %s", pods[k].Name, out.Error)
		}
		var r struct {
			IPs []struct{ Address netip.Prefix } `json:"ips"`
		}
		if err := json.Unmarshal(out.Result, &r); err != nil || len(r.IPs) == 0 {
			return fmt.Errorf("CNI ADD of %s: result %s", pods[k].Name, out.Result)
		}
		pods[k].IP = r.IPs[0].Address.Addr()
		for _, ip := range r.IPs[1:] {
			if a := ip.Address.Addr(); a.Is6() && pods[k].IP.Is4() {
				pods[k].IPv6 = a
			}
		}
		ready := filepath.Join(nodeDir, pods[k].Name+".echo-ready")
		if err := s.spawn("echo", pods[k].NS, filepath.Join(o.BinDir, "twill-lab"), "lab", "echo-server",
			"--port", fmt.Sprint(EchoPort), "--ready-file", ready); err != nil {
			return err
		}
	}
	for _, p := range pods {
		ready := filepath.Join(nodeDir, p.Name+".echo-ready")
		if err := cluster.Poll(ctx, 10*time.Second, p.Name+"'s echo server", func() error {
			_, err := os.Stat(ready)
			return err
		}); err != nil {
			return err
		}
	}
	s.Pods = append(s.Pods, pods...)
	return s.save()
}

// CNI runs a libcni request inside a node's namespace through twillctl.
func CNI(ctx context.Context, binDir, ns string, req cnidriver.Request) (cnidriver.Response, error) {
	return cnidriver.RunIn(ctx, filepath.Join(binDir, "twill-lab"), ns, req)
}
