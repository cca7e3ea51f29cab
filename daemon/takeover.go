package daemon

import (
	"net/netip"

	"github.com/twill-net/twill/internal/sysctl"
	"github.com/twill-net/twill/subnet"
	"github.com/twill-net/twill/takeover"
	"github.com/twill-net/twill/takeover/rules"
)

// takeOver is the retiring of what flannel left on this node (nothing to
// do, after one look, on a node flannel never ran on).
func (d *Daemon) takeOver(cfg *subnet.Config) *takeover.Takeover {
	var nets []netip.Prefix
	if cfg.EnableIPv4 {
		nets = append(nets, cfg.Network)
	}
	if cfg.EnableIPv6 {
		nets = append(nets, cfg.IPv6Network)
	}
	return takeover.New(takeover.Options{
		Logger: d.log.With("component", "flannel-takeover"), Kernel: d.o.Netlink, Netfilter: rules.System{},
		Networks: nets, SubnetFile: d.o.FlannelSubnetFile,
		SetProxyARP: func(link string) error { return sysctl.Set("net/ipv4/conf/"+link+"/proxy_arp", "1") },
	})
}
