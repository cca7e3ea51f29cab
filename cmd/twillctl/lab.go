package main

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/twill-net/twill/internal/lab"
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
	cmd.PersistentFlags().StringVar(&o.Name, "name", "lab", "lab name (1-8 lowercase letters or digits)")
	cmd.PersistentFlags().StringVar(&o.StateRoot, "state-root", lab.DefaultStateRoot, "directory holding one state directory per lab")
	binDir := func() string {
		exe, err := os.Executable()
		if err != nil {
			return "."
		}
		return filepath.Dir(exe)
	}

	up := &cobra.Command{
		Use:   "up",
		Short: "Build a lab and wait until every node is ready",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.BinDir = binDir()
			s, err := lab.Up(cmd.Context(), o.Options, cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			w := cmd.OutOrStdout()
			fmt.Fprintf(w, "\nlab %q is up: %d nodes, %d pods, backend %s, %s underlay (state in %s)\n", s.Name, len(s.Nodes), len(s.Pods), s.Backend, s.Underlay, s.Dir)
			flag := ""
			if o.Name != "lab" {
				flag = " --name " + o.Name
			}
			fmt.Fprintf(w, "  twillctl lab check%s                   connectivity matrix\n", flag)
			fmt.Fprintf(w, "  twillctl lab status%s                  nodes, leases, pods, daemons\n", flag)
			fmt.Fprintf(w, "  twillctl lab exec%s node1 -- ip route  run a command in a node or pod\n", flag)
			fmt.Fprintf(w, "  twillctl lab down%s                    remove it all\n", flag)
			return nil
		},
	}
	up.Flags().IntVar(&o.Nodes, "nodes", 3, "number of nodes")
	up.Flags().IntVar(&o.PodsPerNode, "pods-per-node", 2, "pods per node")
	up.Flags().StringVar(&o.Backend, "backend", "vxlan", "vxlan, host-gw or eni (eni runs on a simulated cloud VPC)")
	up.Flags().StringVar(&o.Underlay, "underlay", "flat", "flat (one L2 segment) or routed (two segments and a router); eni always uses its VPC")
	up.Flags().StringVar(&o.ENIMode, "eni-mode", "prefix", "with --backend eni: prefix or secondary-ip")

	check := &cobra.Command{
		Use:   "check",
		Short: "Connect over TCP from every pod to every pod and print the matrix; exit 1 on any failure",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			s, err := lab.Load(o.StateRoot, o.Name)
			if err != nil {
				return err
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
		},
	}

	status := &cobra.Command{
		Use:   "status",
		Short: "Show the lab's nodes, leases, pods and daemons",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			s, err := lab.Load(o.StateRoot, o.Name)
			if err != nil {
				return err
			}
			w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintf(w, "lab %s\tbackend %s\tunderlay %s\tup since %s\n\n", s.Name, s.Backend, s.Underlay, s.Created.Format(time.RFC3339))
			fmt.Fprintln(w, "NODE\tNETNS\tADDRESS\tSUBNET\tTWILLD")
			for _, n := range s.Nodes {
				state := "not running"
				for _, p := range s.Processes {
					if p.NS == n.NS && p.Role == "twilld" && syscallAlive(p.PID) {
						state = fmt.Sprintf("running (pid %d)", p.PID)
					}
				}
				fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", n.Name, n.NS, n.Addr, n.Subnet, state)
			}
			fmt.Fprintln(w, "\nPOD\tNODE\tIP")
			for _, p := range s.Pods {
				fmt.Fprintf(w, "%s\t%s\t%s\n", p.Name, p.Node, p.IP)
			}
			return w.Flush()
		},
	}

	execCmd := &cobra.Command{
		Use:   "exec NODE|POD -- COMMAND [ARG...]",
		Short: "Run a command inside a lab node or pod",
		Args:  cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			s, err := lab.Load(o.StateRoot, o.Name)
			if err != nil {
				return err
			}
			ns, ok := s.Find(args[0])
			if !ok {
				return fmt.Errorf("no node or pod %q in lab %q (see twillctl lab status)", args[0], o.Name)
			}
			c := exec.Command("ip", append([]string{"netns", "exec", ns}, args[1:]...)...)
			c.Stdin, c.Stdout, c.Stderr = os.Stdin, cmd.OutOrStdout(), cmd.ErrOrStderr()
			return c.Run()
		},
	}

	down := &cobra.Command{
		Use:   "down",
		Short: "Remove every namespace, process and file of the lab (also after a crashed lab up)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := lab.Down(o.StateRoot, o.Name); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "lab %q removed\n", o.Name)
			return nil
		},
	}

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
	probe := &cobra.Command{
		Use:    "probe IP...",
		Short:  "Connect to each IP's echo server and print the results as JSON",
		Hidden: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			var targets []netip.Addr
			for _, a := range args {
				ip, err := netip.ParseAddr(a)
				if err != nil {
					return fmt.Errorf("target %q: %w", a, err)
				}
				targets = append(targets, ip)
			}
			return json.NewEncoder(cmd.OutOrStdout()).Encode(lab.Probe(targets, port, 3*time.Second))
		},
	}
	probe.Flags().IntVar(&port, "port", lab.EchoPort, "port")
	cmd.AddCommand(up, check, status, execCmd, down, echo, probe)
	return cmd
}

func syscallAlive(pid int) bool {
	p, err := os.FindProcess(pid)
	if err != nil {
		return false
	}
	return p.Signal(syscall.Signal(0)) == nil
}
