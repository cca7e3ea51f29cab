// Command engine embeds twill's daemon engine (package daemon) without
// twilld's command line: etcd mode, the built-in backends plus the example
// directgw, a handful of flags of its own. A program that runs twill inside
// something larger (an agent, an installer, a test harness) starts here;
// one that wants every twilld flag builds on cmd/twilld/app instead
// (../twilld-directgw).
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	_ "github.com/twill-net/twill/Documentation/examples/directgw"
	"github.com/twill-net/twill/backend"
	_ "github.com/twill-net/twill/backend/builtin" // eni, host-gw, vxlan, wireguard
	"github.com/twill-net/twill/daemon"
	"github.com/twill-net/twill/network"
	"github.com/twill-net/twill/nl"
	etcdsm "github.com/twill-net/twill/subnet/etcd"
)

func main() {
	endpoints := flag.String("etcd-endpoints", "http://127.0.0.1:2379", "etcd endpoints, comma-separated")
	iface := flag.String("iface", "", "external interface name or address (default: the default route's)")
	subnetFile := flag.String("subnet-file", "/run/twill/subnet.env", "where to write subnet.env for the CNI plugin")
	stateDir := flag.String("state-dir", "/var/lib/twill", "directory for state kept across restarts")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: engine [flags]\nbackends: %s\n", strings.Join(backend.Default.Names(), ", "))
		flag.PrintDefaults()
	}
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := run(ctx, strings.Split(*endpoints, ","), *iface, *subnetFile, *stateDir); err != nil {
		fmt.Fprintln(os.Stderr, "engine:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, endpoints []string, iface, subnetFile, stateDir string) error {
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	cli, err := etcdsm.NewClient(etcdsm.ClientOptions{Endpoints: endpoints})
	if err != nil {
		return err
	}
	defer cli.Close()
	h, err := nl.Open("") // this network namespace
	if err != nil {
		return err
	}
	defer h.Close()
	opts := daemon.Options{
		Logger:     log,
		Registry:   backend.Default,
		Subnets:    subnets(etcdsm.New(etcdsm.Options{Client: cli, Logger: log})),
		Netlink:    h,
		SubnetFile: subnetFile,
		StateDir:   stateDir,
		IPMasq:     true,
	}
	if iface != "" {
		opts.Iface = network.IfaceOptions{Ifaces: []string{iface}}
	}
	// Run returns when ctx is done, leaving the data plane in place.
	return daemon.New(opts).Run(ctx)
}

// subnets declares what the etcd subnet manager offers the engine beyond
// leases: its connection to etcd for /readyz, overwrites of this node's
// lease counted, new backend data published, every lease read early.
func subnets(m *etcdsm.Manager) daemon.Subnets {
	return daemon.Subnets{SubnetManager: m, Monitor: m, Conflicts: m, DataUpdater: m, Prefetcher: m}
}
