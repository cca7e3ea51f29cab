// Package app is twilld's command line: flags into an options struct, then
// the daemon package does the work. cmd/twilld's main calls Main with the
// default backend registry; a custom twilld with extra backends does the
// same after blank-importing them (see Documentation/writing-a-backend.md).
package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/twill-net/twill/backend"
	"github.com/twill-net/twill/daemon"
	"github.com/twill-net/twill/daemon/cleanup"
	"github.com/twill-net/twill/daemon/enforce"
	"github.com/twill-net/twill/internal/gcpace"
	"github.com/twill-net/twill/internal/version"
	"github.com/twill-net/twill/network"
	"github.com/twill-net/twill/network/netfilter"
	"github.com/twill-net/twill/nl"
	"github.com/twill-net/twill/subnet"
	etcdsm "github.com/twill-net/twill/subnet/etcd"
	"github.com/twill-net/twill/subnet/etcd/etcdflags"
	kubesm "github.com/twill-net/twill/subnet/kube"
	"github.com/twill-net/twill/takeover"
)

// gcPacer manages the GC percent through start-up (internal/gcpace)
// unless GOGC is set in the environment.
func gcPacer() *gcpace.Pacer {
	if _, set := os.LookupEnv("GOGC"); set {
		return gcpace.Start(nil)
	}
	return gcpace.Start(func(percent int) { debug.SetGCPercent(percent) })
}

// Main runs twilld with the backends in reg and returns the process exit
// code.
func Main(reg *backend.Registry) int {
	gc := gcPacer()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := newRootCommand(reg, gc.StartedUp).ExecuteContext(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "twilld:", err)
		return 1
	}
	return 0
}

type options struct {
	startedUp func() // called once the node's peers are first programmed (not a flag)

	etcd        etcdflags.Options
	leaseTTL    time.Duration
	renewMargin time.Duration

	kubeSubnetMgr        bool
	kubeconfigFile       string
	kubeAnnotationPrefix string
	kubeAPIURL           string
	kubeResync           time.Duration
	networkPolicy        bool
	networkPolicyLog     bool
	networkPolicyAllowed bool
	networkPolicySample  uint32
	netConfigPath        string

	iface         []string
	ifaceRegex    []string
	ifaceCanReach string
	publicIP      string
	publicIPv6    string

	ipMasq            bool
	subnetFile        string
	cniConflist       string
	cniConflistDest   string
	cniNetwork        string
	cniDataDir        string
	reclaimEvery      time.Duration
	stateDir          string
	flannelSubnetFile string
	healthzIP         string
	healthzPort       int
	iptablesResync    time.Duration
	netfilter         string
	resync            time.Duration
	resyncWatched     time.Duration
	logLevel          string
}

func newRootCommand(reg *backend.Registry, startedUp func()) *cobra.Command {
	o := options{startedUp: startedUp}
	cmd := &cobra.Command{
		Use:   "twilld",
		Short: "twill's per-node network daemon",
		Long: `twilld holds this node's subnet lease, learns every peer's lease, and has the
configured backend (` + strings.Join(reg.Names(), ", ") + `) program the kernel so pods on
different nodes reach each other. Every flag can also be set as TWILLD_<FLAG>,
for example TWILLD_ETCD_ENDPOINTS.`,
		Example: `  # etcd mode, host-gw or vxlan chosen by <prefix>/config in etcd
  twilld --etcd-endpoints=http://10.0.0.1:2379 --iface=eth0 --ip-masq

  # remove everything twill programmed on this node
  twilld cleanup`,
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			return applyEnv(cmd.Flags())
		},
		RunE: func(cmd *cobra.Command, _ []string) error { return run(cmd.Context(), reg, o) },
	}
	f := cmd.Flags()
	etcdflags.Add(f, &o.etcd)
	f.DurationVar(&o.leaseTTL, "subnet-lease-ttl", etcdsm.DefaultTTL, "TTL of this node's subnet lease in etcd")
	f.DurationVar(&o.renewMargin, "subnet-lease-renew-margin", etcdsm.DefaultRenewMargin, "renew the lease this long before it expires")
	f.BoolVar(&o.kubeSubnetMgr, "kube-subnet-mgr", false, "take leases from Kubernetes Node objects instead of etcd")
	f.StringVar(&o.kubeconfigFile, "kubeconfig-file", "", "kubeconfig for --kube-subnet-mgr (default: in-cluster)")
	f.StringVar(&o.kubeAnnotationPrefix, "kube-annotation-prefix", kubesm.DefaultAnnotationPrefix, "prefix of twill's Node annotations")
	f.StringVar(&o.kubeAPIURL, "kube-api-url", "", "apiserver URL for --kube-subnet-mgr (overrides the kubeconfig's server)")
	f.DurationVar(&o.kubeResync, "kube-resync", 30*time.Second, "how often the Node informer replays its cache to the backend")
	f.BoolVar(&o.networkPolicy, "network-policy", false, "enforce Kubernetes NetworkPolicy for this node's pods, in table inet twill-policy (needs --kube-subnet-mgr; see Documentation/network-policy.md)")
	f.BoolVar(&o.networkPolicyLog, "network-policy-log-denied", true, "with --network-policy, log the packets a policy denies (at most 10 a second per pod and direction) to the verdict log: twilld's log at level VERDICT, GET /verdicts, twillctl policy log")
	f.BoolVar(&o.networkPolicyAllowed, "network-policy-log-allowed", false, "with --network-policy, log the new connections of every pod of the node, allowed, to the verdict log (without it, only those of the namespaces annotated twill.io/log-allowed=true)")
	f.Uint32Var(&o.networkPolicySample, "network-policy-log-sample", 1, "log one allowed new connection in this many, at random (at most 100 a second per direction)")
	f.StringVar(&o.netConfigPath, "net-config-path", "/etc/kube-twill/net-conf.json", "net-conf.json path in Kubernetes mode")
	f.StringSliceVar(&o.iface, "iface", nil, "external interface name or address (repeatable; first match wins)")
	f.StringSliceVar(&o.ifaceRegex, "iface-regex", nil, "regular expression for the external interface name or address (repeatable)")
	f.StringVar(&o.ifaceCanReach, "iface-can-reach", "", "use the interface that routes to this address")
	f.StringVar(&o.publicIP, "public-ip", "", "IPv4 address peers should use to reach this node (default: the interface's)")
	f.StringVar(&o.publicIPv6, "public-ipv6", "", "IPv6 address peers should use to reach this node")
	f.BoolVar(&o.ipMasq, "ip-masq", false, "masquerade traffic leaving the cluster Network")
	cmd.PersistentFlags().StringVar(&o.subnetFile, "subnet-file", "/run/twill/subnet.env", "where to write subnet.env for the CNI plugin")
	f.StringVar(&o.cniConflist, "cni-conflist", "", "a CNI conflist to install at --cni-conflist-dest once the node is ready, and keep there")
	f.StringVar(&o.cniConflistDest, "cni-conflist-dest", "/etc/cni/net.d/10-twill.conflist", "where --cni-conflist is installed")
	f.StringVar(&o.cniNetwork, "cni-network", "twill", "the CNI network name of twill's conflist (its allocations are in <cni-data-dir>/<name>); taken from --cni-conflist when given")
	f.StringVar(&o.cniDataDir, "cni-data-dir", "/var/lib/cni/networks", "the twill plugin's dataDir; taken from --cni-conflist when given")
	f.DurationVar(&o.reclaimEvery, "reclaim-every", time.Minute, "release, this often, pod addresses whose pod is gone but whose CNI DEL never came (0 disables)")
	f.StringVar(&o.stateDir, "state-dir", "/var/lib/twill", "directory for state kept across restarts")
	f.StringVar(&o.flannelSubnetFile, "flannel-subnet-file", takeover.DefaultSubnetFile, "flannel's subnet.env on a node switched from flannel: removed with flannel's bridge, devices and rules once no pod is left on the bridge (Documentation/migrating-from-flannel.md)")
	f.StringVar(&o.healthzIP, "healthz-ip", "0.0.0.0", "address for /healthz, /readyz and /metrics")
	f.IntVar(&o.healthzPort, "healthz-port", 0, "port for /healthz, /readyz and /metrics (0 disables)")
	f.StringVar(&o.netfilter, "netfilter", "auto", "how the masquerade and forward rules are written: iptables (TWILL-* chains, through the iptables binaries), nftables (table inet twill, over netlink, no binaries) or auto (see Documentation/configuration.md)")
	f.DurationVar(&o.iptablesResync, "iptables-resync", 5*time.Second, "period of the iptables rules check with iptables-legacy (iptables-nft announces changes, which trigger the check)")
	f.DurationVar(&o.resync, "resync", 30*time.Second, "period of the full reconcile that repairs drift, until the backend's kernel watches run")
	f.DurationVar(&o.resyncWatched, "resync-watched", 5*time.Minute, "period of the full reconcile while the backend's kernel watches run (they trigger one as soon as they see drift), and of the netfilter rules' safety check while nftables announces changes (it checks only if nftables changed since); at least --resync")
	cmd.PersistentFlags().StringVar(&o.logLevel, "log-level", "info", "debug, info, warn or error")

	cmd.AddCommand(newCleanupCommand(&o), newInstallCNICommand(), newRotateKeyCommand(), newPauseCommand(), &cobra.Command{
		Use:   "version",
		Short: "Print the version",
		Args:  cobra.NoArgs,
		Run:   func(cmd *cobra.Command, _ []string) { fmt.Fprintln(cmd.OutOrStdout(), "twilld", version.Version) },
	})
	return cmd
}

func newCleanupCommand(o *options) *cobra.Command {
	var (
		stateDir string
		remove   []string
		release  bool
		wait     time.Duration
		handOver bool
		etcd     etcdflags.Options
	)
	cmd := &cobra.Command{
		Use:   "cleanup",
		Short: "Remove every route, rule, device, iptables chain, nftables table and file twill created on this node",
		Long: `cleanup removes what twilld programmed in this network namespace: routes with
twill's protocol number (167) in any table, twill's policy rules, twill.* devices,
the TWILL-* iptables chains and their jumps, the nftables table inet twill, subnet.env, and twill's files in the
state directory (the vxlan VTEP MAC). It waits for this node's twilld to stop
(--wait) and then runs alone; pods on this node lose cross-node connectivity.

It leaves: IP forwarding on (other software may rely on it); the pods' own veths
and /32 routes (protocol 168; CNI DEL removes them with each pod); and, unless
--release-lease is given, the node's lease in etcd, so the other nodes keep a
route to this node until the lease expires (24 h by default). In Kubernetes mode
the lease is the Node's podCIDR: delete the Node (kubectl delete node) instead.`,
		Example: `  # take a node out of an etcd-mode cluster for good
  twilld cleanup --release-lease --etcd-endpoints http://10.0.0.1:2379`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log, err := newLogger(o.logLevel)
			if err != nil {
				return err
			}
			h, err := nl.Open("")
			if err != nil {
				return err
			}
			defer h.Close()
			co := cleanup.Options{SubnetFile: o.subnetFile, StateDir: stateDir, RemoveFiles: remove, Wait: wait, HandOverToFlannel: handOver}
			if release {
				co.ReleaseLease = func(env subnet.Env) error {
					return etcd.Do(cmd.Context(), func(ctx context.Context, cli *clientv3.Client) error {
						return etcdsm.ReleaseLease(ctx, cli, etcd.Prefix, env.Subnet, env.IPv6Subnet)
					})
				}
			}
			return cleanup.Node(log, h, co)
		},
	}
	cmd.Flags().StringVar(&stateDir, "state-dir", "/var/lib/twill", "twilld's state directory")
	cmd.Flags().StringArrayVar(&remove, "remove-file", nil, "also remove this file (the CNI conflist or plugin binary, say; repeatable); one already gone is no error")
	cmd.Flags().DurationVar(&wait, "wait", time.Minute, "wait at most this long for this node's twilld (the one writing --subnet-file) to stop: a twilld still running would put back what cleanup removes")
	cmd.Flags().BoolVar(&handOver, "hand-over-to-flannel", false, "leave the data plane to the flanneld starting next (a node rolled back to flannel): keep twill's routes, and make its VXLAN device flanneld's (flannel.<VNI>, with its neighbours, forwarding entries and routes), so pods are not cut off until flanneld runs")
	cmd.Flags().BoolVar(&release, "release-lease", false, "also delete this node's lease from etcd (read from subnet.env), so peers stop routing to it now")
	etcdflags.Add(cmd.Flags(), &etcd)
	return cmd
}

// applyEnv sets every flag not given on the command line from
// TWILLD_<FLAG> (dashes as underscores), when that variable is set.
func applyEnv(fs *pflag.FlagSet) error {
	var errs []error
	fs.VisitAll(func(f *pflag.Flag) {
		if f.Changed {
			return
		}
		name := "TWILLD_" + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
		v, ok := os.LookupEnv(name)
		if !ok {
			return
		}
		if err := fs.Set(f.Name, v); err != nil {
			errs = append(errs, fmt.Errorf("%s=%q: %w", name, v, err))
		}
	})
	return errors.Join(errs...)
}

func newLogger(level string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level %q: want debug, info, warn or error", level)
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: l})), nil
}

func parseOptionalAddr(flag, s string) (netip.Addr, error) {
	if s == "" {
		return netip.Addr{}, nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("--%s %q: not an IP address", flag, s)
	}
	return a, nil
}

func run(ctx context.Context, reg *backend.Registry, o options) error {
	log, err := newLogger(o.logLevel)
	if err != nil {
		return err
	}
	iface := network.IfaceOptions{Ifaces: o.iface, IfaceRegex: o.ifaceRegex}
	if iface.CanReach, err = parseOptionalAddr("iface-can-reach", o.ifaceCanReach); err != nil {
		return err
	}
	if iface.PublicIP, err = parseOptionalAddr("public-ip", o.publicIP); err != nil {
		return err
	}
	if iface.PublicIPv6, err = parseOptionalAddr("public-ipv6", o.publicIPv6); err != nil {
		return err
	}
	mode, err := netfilter.ParseMode(o.netfilter)
	if err != nil {
		return err
	}
	subnets, node, closeSubnets, err := subnetManager(ctx, log, o)
	if err != nil {
		return err
	}
	defer closeSubnets()
	var conflist []byte
	network, dataDir := o.cniNetwork, o.cniDataDir
	if o.cniConflist != "" {
		if conflist, err = readConflist(o.cniConflist); err != nil {
			return err
		}
		network, dataDir = conflistStore(conflist, dataDir)
	}
	var pol *enforce.Enforcement
	if o.networkPolicy {
		if pol, err = newEnforcement(log, o, node, filepath.Join(dataDir, network)); err != nil {
			return err
		}
	}
	h, err := nl.Open("")
	if err != nil {
		return err
	}
	defer h.Close()
	health := healthAddr(o)
	log.Info("starting twilld", "version", version.Version, "backends", reg.Names())
	var dest string
	if conflist != nil {
		dest = o.cniConflistDest
	}
	d := daemon.New(daemon.Options{
		KeyRotations:    keyRotations(ctx),
		CNIConflistPath: dest,
		Logger:          log,
		Registry:        reg,
		Subnets:         subnets,
		Netlink:         h,
		Iface:           iface,
		SubnetFile:      o.subnetFile,
		CNIConflist:     conflist,
		Allocations:     daemon.AllocationsOptions{Dir: filepath.Join(dataDir, network), Every: o.reclaimEvery},
		StateDir:        o.stateDir,
		IPMasq:          o.ipMasq,
		Netfilter:       mode,
		IPTablesResync:  o.iptablesResync,
		Resync:          o.resync,
		WatchedResync:   o.resyncWatched,
		HealthAddr:      health,
		StartedUp:       o.startedUp,
		// What flannel left on a node switched from it.
		FlannelSubnetFile: o.flannelSubnetFile,
		Policy:            pol.Run(),
		Collectors:        pol.Collectors(),
		Handlers:          pol.Handlers(),
	})
	if err := d.Run(ctx); err != nil {
		return err
	}
	log.Info("stopped; the data plane stays in place (twilld cleanup removes it)")
	return nil
}

// keyRotations turns SIGUSR1 into requests to replace the backend's key
// pair (the wireguard backend's), until ctx is done.
func keyRotations(ctx context.Context) <-chan struct{} {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGUSR1)
	out := make(chan struct{}, 1)
	go func() {
		defer signal.Stop(sig)
		for {
			select {
			case <-ctx.Done():
				return
			case <-sig:
				select {
				case out <- struct{}{}:
				default:
				}
			}
		}
	}()
	return out
}

// healthAddr is where /healthz, /readyz and /metrics are served ("": not).
func healthAddr(o options) string {
	if o.healthzPort == 0 {
		return ""
	}
	return net.JoinHostPort(o.healthzIP, strconv.Itoa(o.healthzPort))
}
