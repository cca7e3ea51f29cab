package app

import (
	"context"
	"errors"
	"log/slog"
	"os"

	"k8s.io/klog/v2"

	"github.com/twill-net/twill/daemon"
	"github.com/twill-net/twill/internal/version"
	etcdsm "github.com/twill-net/twill/subnet/etcd"
	kubesm "github.com/twill-net/twill/subnet/kube"
)

// subnetManager is the Kubernetes subnet manager or etcd's, with what
// each offers the engine, this node's name in Kubernetes mode, and what
// closes it.
func subnetManager(ctx context.Context, log *slog.Logger, o options) (daemon.Subnets, string, func(), error) {
	if o.networkPolicy && !o.kubeSubnetMgr {
		return daemon.Subnets{}, "", nil, errors.New("--network-policy needs --kube-subnet-mgr: NetworkPolicy objects come from the Kubernetes API")
	}
	if !o.kubeSubnetMgr {
		cli, err := o.etcd.Client()
		if err != nil {
			return daemon.Subnets{}, "", nil, err
		}
		m := etcdsm.New(etcdsm.Options{Client: cli, Logger: log, Prefix: o.etcd.Prefix, TTL: o.leaseTTL, RenewMargin: o.renewMargin})
		return daemon.Subnets{SubnetManager: m, Monitor: m, Conflicts: m, DataUpdater: m, Prefetcher: m}, "", func() { cli.Close() }, nil
	}
	km, err := kubeManager(ctx, log, o)
	if err != nil {
		return daemon.Subnets{}, "", nil, err
	}
	return daemon.Subnets{SubnetManager: km, Conflicts: km, DataUpdater: km, Ready: km}, km.NodeName(), func() {}, nil
}

func kubeManager(ctx context.Context, log *slog.Logger, o options) (*kubesm.Manager, error) {
	// client-go logs through klog; send it to twilld's structured log.
	klog.SetSlogLogger(log.With("component", "client-go"))
	ann, err := kubesm.NewAnnotations(o.kubeAnnotationPrefix)
	if err != nil {
		return nil, err
	}
	cli, err := kubesm.NewClient(kubesm.ClientOptions{Kubeconfig: o.kubeconfigFile, APIURL: o.kubeAPIURL, UserAgent: "twilld/" + version.Version})
	if err != nil {
		return nil, err
	}
	node, err := kubesm.NodeName(ctx, cli, os.Getenv)
	if err != nil {
		return nil, err
	}
	return kubesm.New(kubesm.Options{Client: cli, NodeName: node, Annotations: ann, NetConfPath: o.netConfigPath,
		Logger: log, Resync: o.kubeResync}), nil
}
