// Package cluster is the one bring-up of twill's etcd cluster on a
// topology: an etcd in the underlay namespace, the network configuration
// in it, and the twilld of each node with its files in a directory of its
// own. twillctl lab up and the e2e harness both build their clusters with
// it; each brings its own way of starting processes (the lab detaches and
// records them, the tests tie them to the test).
package cluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/twill-net/twill/lab/topology"
	etcdsm "github.com/twill-net/twill/subnet/etcd"
)

// EtcdPort is where the cluster's etcd listens on the underlay.
const EtcdPort = 2379

// Spawn starts a long-running process, argv, in network namespace ns.
type Spawn func(role, ns string, argv ...string) error

// Etcd is the cluster's etcd.
type Etcd struct {
	URL    string // how nodes reach it, on the underlay bridge
	Sock   string // a unix socket, for the process that made the cluster
	Client *clientv3.Client
	argv   []string
	ns     string
}

// NewEtcd describes the etcd of topo, its data and socket under dir, run
// by the twill-lab binary at labBin (`twillctl etcd`, an embedded etcd).
// Start runs it.
func NewEtcd(topo *topology.Topology, dir, labBin string) *Etcd {
	e := &Etcd{URL: "http://" + net.JoinHostPort(topo.BridgeAddr.String(), strconv.Itoa(EtcdPort)), Sock: filepath.Join(dir, "etcd.sock"), ns: topo.Underlay}
	e.argv = []string{labBin, "etcd", "--data-dir", filepath.Join(dir, "etcd"), "--listen-client-urls", e.URL + ",unix://" + e.Sock}
	return e
}

// Argv is the command that runs the etcd, in namespace NS.
func (e *Etcd) Argv() []string { return e.argv }

// NS is the namespace the etcd runs in.
func (e *Etcd) NS() string { return e.ns }

// Start runs the etcd with spawn and returns once it answers (within 30s),
// with Client connected through the socket.
func (e *Etcd) Start(ctx context.Context, spawn Spawn) error {
	if err := spawn("etcd", e.ns, e.argv...); err != nil {
		return err
	}
	if err := Poll(ctx, 30*time.Second, "etcd's socket", func() error { _, err := os.Stat(e.Sock); return err }); err != nil {
		return err
	}
	if e.Client == nil {
		cli, err := etcdsm.NewClient(etcdsm.ClientOptions{Endpoints: []string{"unix://" + e.Sock}})
		if err != nil {
			return err
		}
		e.Client = cli
	}
	return Poll(ctx, 30*time.Second, "etcd to answer", func() error {
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		_, err := e.Client.Get(cctx, "ping")
		return err
	})
}

// PutConfig stores the network configuration (net-conf.json) at the
// default prefix.
func (e *Etcd) PutConfig(ctx context.Context, conf string) error {
	_, err := e.Client.Put(ctx, etcdsm.DefaultPrefix+"/config", conf)
	return err
}

// Close closes the client.
func (e *Etcd) Close() {
	if e.Client != nil {
		e.Client.Close()
	}
}

// NodeDir is node's directory under dir: its subnet.env and state.
func NodeDir(dir, node string) string { return filepath.Join(dir, node) }

// SubnetFile is the subnet.env of a node's twilld.
func SubnetFile(nodeDir string) string { return filepath.Join(nodeDir, "subnet.env") }

// DaemonArgs are the flags a node's twilld runs with: the etcd, eth0 as
// the external interface, its files in nodeDir, then extra.
func DaemonArgs(etcdURL, nodeDir string, extra ...string) []string {
	return append([]string{"--etcd-endpoints", etcdURL, "--iface", "eth0", "--subnet-file", SubnetFile(nodeDir), "--state-dir", nodeDir}, extra...)
}

// Poll calls f every 50ms until it returns nil, ctx ends or timeout
// passes; the error then names what was awaited and f's last error.
func Poll(ctx context.Context, timeout time.Duration, what string, f func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := f()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("waiting for %s: %w", what, err)
		}
		t := time.NewTimer(50 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("waiting for %s: %w", what, errors.Join(ctx.Err(), err))
		case <-t.C:
		}
	}
}
