package app

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/twill-net/twill/lab"
)

type labOptions struct {
	lab.Options
}

func newLabCommand() *cobra.Command {
	var o labOptions
	cmd := &cobra.Command{
		Use:   "lab",
		Short: "A twill cluster on this machine, made of network namespaces",
		Long: `lab builds a multi-node twill cluster on one Linux machine (as root): an
underlay, node namespaces each running twilld, an embedded etcd, and pods wired
by the twill CNI plugin. Nothing outside the lab's own namespaces is changed.`,
		Example: `  twillctl lab up                       # 3 nodes x 2 pods, vxlan
  twillctl lab check                    # TCP from every pod to every pod
  twillctl lab exec node1 -- ip route
  twillctl lab down`,
	}
	// Defaults may come from the environment, so that the docs' commands run
	// as written in a lab of one's own (tests run them side by side).
	env := func(k, def string) string {
		if v := os.Getenv(k); v != "" {
			return v
		}
		return def
	}
	cmd.PersistentFlags().StringVar(&o.Name, "name", env("TWILL_LAB_NAME", "lab"), "lab name (1-8 lowercase letters or digits; env TWILL_LAB_NAME)")
	cmd.PersistentFlags().StringVar(&o.StateRoot, "state-root", env("TWILL_LAB_STATE_ROOT", lab.DefaultStateRoot),
		"directory holding one state directory per lab (env TWILL_LAB_STATE_ROOT)")
	cmd.PersistentFlags().StringVar(&o.NetnsPrefix, "netns-prefix", env("TWILL_LAB_NETNS_PREFIX", lab.DefaultNetnsPrefix),
		"first part of the lab's namespace names, <prefix>-<name>-n1 (env TWILL_LAB_NETNS_PREFIX)")
	cmd.AddCommand(labUpCommand(&o), labCheckCommand(&o), labStatusCommand(&o), labExecCommand(&o), labDownCommand(&o),
		labKubectlCommand(&o), labHelmCommand(&o), labRestartCommand(&o), labConformanceCommand(&o), labEchoCommand(), labProbeCommand(), labHoldCommand(), labNodeRootCommand())
	return cmd
}

// binDir is the directory of this twillctl, where make build puts twilld
// and the plugin too.
func binDir() string {
	exe, err := os.Executable()
	if err != nil {
		return "."
	}
	return filepath.Dir(exe)
}

func labUpCommand(o *labOptions) *cobra.Command {
	up := noArgs("up", "Build a lab and wait until every node is ready",
		func(cmd *cobra.Command) error {
			o.BinDir = binDir()
			s, err := lab.Up(cmd.Context(), o.Options, cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			w := cmd.OutOrStdout()
			if s.Bare {
				fmt.Fprintf(w, "\nlab %q is up: %d bare machines on the underlay (state in %s)\n", s.Name, len(s.Nodes), s.Dir)
			} else {
				fam := ""
				if s.IPFamily != "" && s.IPFamily != "ipv4" {
					fam = " " + s.IPFamily
				}
				fmt.Fprintf(w, "\nlab %q is up: %d nodes, %d pods, backend %s, %s%s underlay (state in %s)\n", s.Name, len(s.Nodes), len(s.Pods), s.Backend, s.Underlay, fam, s.Dir)
			}
			flag := ""
			if o.Name != "lab" {
				flag = " --name " + o.Name
			}
			fmt.Fprintf(w, "  twillctl lab check%s                   connectivity matrix\n", flag)
			fmt.Fprintf(w, "  twillctl lab status%s                  nodes, leases, pods, daemons\n", flag)
			fmt.Fprintf(w, "  twillctl lab exec%s node1 -- ip route  run a command in a node or pod\n", flag)
			fmt.Fprintf(w, "  twillctl lab down%s                    remove it all\n", flag)
			return nil
		})
	up.Flags().IntVar(&o.Nodes, "nodes", 3, "number of nodes")
	up.Flags().IntVar(&o.PodsPerNode, "pods-per-node", 2, "pods per node")
	up.Flags().StringVar(&o.Backend, "backend", "vxlan", "vxlan, host-gw, wireguard or eni (eni runs on a simulated cloud VPC)")
	up.Flags().StringVar(&o.Underlay, "underlay", "flat", "flat (one L2 segment) or routed (two segments and a router); eni always uses its VPC")
	up.Flags().StringVar(&o.IPFamily, "ip-family", "ipv4", "ipv4, ipv6 or dual: the underlay's, the pods' and (--kubernetes) the Services' address families (vxlan, host-gw; wireguard without --kubernetes)")
	up.Flags().StringVar(&o.KubeProxyMode, "kube-proxy-mode", "", "with --kubernetes: kube-proxy's mode, iptables (the default) or nftables")
	up.Flags().StringVar(&o.Netfilter, "netfilter", "auto", "twilld's --netfilter: auto, iptables or nftables (not with --kubernetes, whose DaemonSet chooses)")
	up.Flags().StringVar(&o.ENIMode, "eni-mode", "prefix", "with --backend eni: prefix or secondary-ip")
	up.Flags().BoolVar(&o.Bare, "bare", false, "machines only: node namespaces with a root of their own and nothing running, to install twill by hand with lab exec")
	up.Flags().Var(prefixFlag{&o.UnderlayCIDR}, "underlay-cidr", "the nodes' segment, an IPv4 /24 (default 10.99.0.0/24)")
	up.Flags().BoolVar(&o.KeepOnFailure, "keep-on-failure", false, "leave what was built in place when up fails, to inspect it (lab down removes it)")
	up.Flags().BoolVar(&o.Kubernetes, "kubernetes", false, "a Kubernetes cluster: control plane, containerd, kubelet and kube-proxy per node, twill installed from dist/kube-twill.yml")
	up.Flags().BoolVar(&o.Helm, "helm", false, "with --kubernetes: install twill with helm install from dist/chart/twill instead of kubectl apply -f dist/kube-twill.yml")
	up.Flags().StringArrayVar(&o.HelmSet, "helm-set", nil, "with --helm: a chart value, key=value as helm --set takes it (repeatable)")
	up.Flags().StringArrayVar(&o.CRDs, "crd", nil, "with --kubernetes: a CRD file to apply before the network (repeatable; default: build/cnp/current/crd-experimental.yaml, the ClusterNetworkPolicy CRD make setup fetches, when present)")
	up.Flags().StringVar(&o.HelmBin, "helm-bin", "", "with --kubernetes: the helm binary of --helm and lab helm (default: build/helm/current/helm next to bin/, made by make helm-tools)")
	up.Flags().BoolVar(&o.Flannel, "flannel", false, "with --kubernetes: install flannel (kube-flannel's DaemonSet, image-dir's flannel.tar) instead of twill, to try the migration on")
	up.Flags().StringVar(&o.KubeBinDir, "kube-bin-dir", "", "with --kubernetes: the Kubernetes binaries (default: build/kube/current next to bin/, made by make setup)")
	up.Flags().StringVar(&o.ImageDir, "image-dir", "", "with --kubernetes: twill.tar, pause.tar, coredns.tar and optionally e2e-images.tar (default: build/images next to bin/, made by make kube-images)")

	return up
}

func labCheckCommand(o *labOptions) *cobra.Command {
	var hold time.Duration
	check := onLab(o, "check", "Connect over TCP from every pod to every pod and print the matrix; exit 1 on any failure", cobra.NoArgs,
		func(cmd *cobra.Command, s *lab.State, _ []string) error {
			if hold > 0 {
				sum, err := lab.HoldCheck(cmd.Context(), s, binDir(), hold, cmd.OutOrStdout())
				if err != nil {
					return err
				}
				if sum.Broken > 0 {
					return fmt.Errorf("%d established connections broke", sum.Broken)
				}
				return nil
			}
			res, err := lab.Check(cmd.Context(), s, binDir())
			if err != nil {
				return err
			}
			res.Print(cmd.OutOrStdout())
			if res.Failed > 0 {
				return fmt.Errorf("%d pod pairs cannot connect", res.Failed)
			}
			return nil
		})
	check.Flags().DurationVar(&hold, "hold", 0, "instead, hold connections for this long between every pair of pods on different nodes (and to the echo Service): "+
		"a heartbeat every 100 ms on a long-lived TCP connection, new connections and UDP echoes; print what broke, the longest stall and gap; exit 1 if any held connection broke")
	return check
}

func labHoldCommand() *cobra.Command {
	var until time.Duration
	hold := &cobra.Command{
		Use:    "hold ADDR:PORT...",
		Short:  "Hold connections to each echo server for --for, printing a JSON window per target every second (runs inside a pod namespace)",
		Hidden: true,
		Args:   cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var targets []netip.AddrPort
			for _, a := range args {
				t, err := netip.ParseAddrPort(a)
				if err != nil {
					return fmt.Errorf("target %q: want address:port", a)
				}
				targets = append(targets, t)
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), until)
			defer cancel()
			return lab.Hold(ctx, targets, cmd.OutOrStdout())
		},
	}
	hold.Flags().DurationVar(&until, "for", time.Minute, "how long")
	return hold
}

func labStatusCommand(o *labOptions) *cobra.Command {
	return onLab(o, "status", "Show the lab's nodes, leases, pods and daemons", cobra.NoArgs,
		func(cmd *cobra.Command, s *lab.State, _ []string) error {
			return lab.PrintStatus(cmd.Context(), s, cmd.OutOrStdout())
		})
}

func labExecCommand(o *labOptions) *cobra.Command {
	return onLab(o, "exec NODE|POD -- COMMAND [ARG...]", "Run a command inside a lab node or pod", cobra.MinimumNArgs(2),
		func(cmd *cobra.Command, s *lab.State, args []string) error {
			c, err := lab.ExecCommand(s, args[0], args[1:])
			if err != nil {
				return fmt.Errorf("%w (see twillctl lab status)", err)
			}
			c.Stdin, c.Stdout, c.Stderr = os.Stdin, cmd.OutOrStdout(), cmd.ErrOrStderr()
			return commandExit(c.Run())
		})
}

// onLab is a command that runs on the lab --name names, loaded from its
// state.
func onLab(o *labOptions, use, short string, args cobra.PositionalArgs, run func(cmd *cobra.Command, s *lab.State, args []string) error) *cobra.Command {
	return &cobra.Command{Use: use, Short: short, Args: args, RunE: func(cmd *cobra.Command, args []string) error {
		s, err := lab.Load(o.StateRoot, o.Name)
		if err != nil {
			return err
		}
		return run(cmd, s, args)
	}}
}

func labRestartCommand(o *labOptions) *cobra.Command {
	return onLab(o, "restart ROLE", "Stop and start a control-plane process of the lab ("+strings.Join(lab.Restartable, ", ")+
		") and wait until it serves again: with lab check --hold beside it, what users' connections see", cobra.ExactArgs(1),
		func(cmd *cobra.Command, s *lab.State, args []string) error {
			start := time.Now()
			if err := s.Restart(cmd.Context(), args[0]); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s restarted; serving again after %s\n", args[0], time.Since(start).Round(10*time.Millisecond))
			return nil
		})
}

func labDownCommand(o *labOptions) *cobra.Command {
	return noArgs("down", "Remove every namespace, process and file of the lab (also after a crashed lab up)",
		func(cmd *cobra.Command) error {
			if err := lab.Down(o.StateRoot, o.Name, o.NetnsPrefix); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "lab %q removed\n", o.Name)
			return nil
		})
}

// noArgs is a command that takes no positional arguments.
func noArgs(use, short string, run func(cmd *cobra.Command) error) *cobra.Command {
	return &cobra.Command{Use: use, Short: short, Args: cobra.NoArgs, RunE: func(cmd *cobra.Command, _ []string) error { return run(cmd) }}
}

func labKubectlCommand(o *labOptions) *cobra.Command {
	return labAdminTool(o, "kubectl [ARG...]", "Run kubectl as the admin of a Kubernetes lab (lab up --kubernetes)",
		func(s *lab.State, args []string) (*exec.Cmd, error) {
			if !s.Kubernetes {
				return nil, fmt.Errorf("lab %q is not a Kubernetes lab (lab up --kubernetes)", s.Name)
			}
			return s.KubectlCommand(args...), nil
		})
}

func labHelmCommand(o *labOptions) *cobra.Command {
	return labAdminTool(o, "helm [ARG...]", "Run helm as the admin of a Kubernetes lab (lab up --kubernetes; twill's release, with --helm, is \"twill\")",
		func(s *lab.State, args []string) (*exec.Cmd, error) { return s.HelmCommand(args...) })
}

// labAdminTool is a command that runs a tool as the lab's admin (kubectl,
// helm): its arguments are the tool's, but for --name and --state-root.
func labAdminTool(o *labOptions, use, short string, command func(s *lab.State, args []string) (*exec.Cmd, error)) *cobra.Command {
	return &cobra.Command{
		Use:                use,
		Short:              short,
		DisableFlagParsing: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			name, stateRoot, rest, err := labFlags(args, o.Name, o.StateRoot)
			if err != nil {
				return err
			}
			s, err := lab.Load(stateRoot, name)
			if err != nil {
				return err
			}
			c, err := command(s, rest)
			if err != nil {
				return err
			}
			c.Stdin, c.Stdout, c.Stderr = os.Stdin, cmd.OutOrStdout(), cmd.ErrOrStderr()
			return commandExit(c.Run())
		},
	}
}

// The lab's own processes: lab up starts them, users do not.

func labEchoCommand() *cobra.Command {
	var (
		port      int
		readyFile string
	)
	echo := &cobra.Command{
		Use:    "echo-server",
		Short:  "Echo one line per TCP connection (runs inside lab pods)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE:   func(cmd *cobra.Command, _ []string) error { return lab.ServeEcho(cmd.Context(), port, readyFile) },
	}
	echo.Flags().IntVar(&port, "port", lab.EchoPort, "port")
	echo.Flags().StringVar(&readyFile, "ready-file", "", "file to create once listening")
	return echo
}

func labProbeCommand() *cobra.Command {
	var (
		port         int
		every, until time.Duration
	)
	probe := &cobra.Command{
		Use:    "probe IP...",
		Short:  "Connect to each IP's echo server and print the results as JSON",
		Hidden: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			for _, a := range args {
				if _, err := lab.ProbeTarget(a, port); err != nil {
					return err
				}
			}
			enc := json.NewEncoder(cmd.OutOrStdout())
			if every <= 0 {
				return enc.Encode(lab.Probe(args, port, 3*time.Second))
			}
			// From the first moment (a pod's first instruction), one line
			// per round, each probe waiting at most --every.
			end := time.Now().Add(until)
			for start := time.Now(); start.Before(end); start = time.Now() {
				if err := enc.Encode(lab.Probe(args, port, every)); err != nil {
					return err
				}
				time.Sleep(every - time.Since(start))
			}
			return nil
		},
	}
	probe.Flags().IntVar(&port, "port", lab.EchoPort, "port")
	probe.Flags().DurationVar(&every, "every", 0, "probe again this often (each probe waits at most this long), for --for")
	probe.Flags().DurationVar(&until, "for", 10*time.Second, "with --every, how long to go on")
	return probe
}

func labNodeRootCommand() *cobra.Command {
	var root lab.NodeRootOptions
	nodeRoot := noArgs("node-root", "Hold a Kubernetes lab node's mount namespace (started by lab up)",
		func(cmd *cobra.Command) error { return lab.RunNodeRoot(cmd.Context(), root) })
	nodeRoot.Hidden = true
	nodeRoot.Flags().StringVar(&root.Dir, "dir", "", "the node's directory")
	nodeRoot.Flags().StringVar(&root.ReadyFile, "ready-file", "", "created once the mounts are in place")
	nodeRoot.Flags().StringSliceVar(&root.Keep, "keep", nil, "a path of the machine the node must still see")
	nodeRoot.Flags().StringVar(&root.Hostname, "hostname", "", "the node's host name, set in its own UTS namespace")
	return nodeRoot
}

// prefixFlag is a netip.Prefix flag.
type prefixFlag struct{ p *netip.Prefix }

func (f prefixFlag) String() string {
	if f.p == nil || !f.p.IsValid() {
		return ""
	}
	return f.p.String()
}
func (f prefixFlag) Set(v string) error {
	p, err := netip.ParsePrefix(v)
	if err != nil {
		return err
	}
	*f.p = p
	return nil
}
func (prefixFlag) Type() string { return "cidr" }

// commandExit turns a command's failing exit status into twillctl's own.
func commandExit(err error) error {
	var ee *exec.ExitError
	if errors.As(err, &ee) && ee.ExitCode() > 0 {
		return exitCode(ee.ExitCode())
	}
	return err
}

// labFlags takes --name and --state-root out of args (for commands that
// pass the rest through untouched, such as lab kubectl).
func labFlags(args []string, name, stateRoot string) (string, string, []string, error) {
	var rest []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "--name" || a == "--state-root":
			if i+1 >= len(args) {
				return "", "", nil, fmt.Errorf("%s needs a value", a)
			}
			if a == "--name" {
				name = args[i+1]
			} else {
				stateRoot = args[i+1]
			}
			i++
		case strings.HasPrefix(a, "--name="):
			name = strings.TrimPrefix(a, "--name=")
		case strings.HasPrefix(a, "--state-root="):
			stateRoot = strings.TrimPrefix(a, "--state-root=")
		default:
			rest = append(rest, a)
		}
	}
	return name, stateRoot, rest, nil
}
