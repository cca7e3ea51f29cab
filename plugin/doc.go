// Package plugin is the twill CNI plugin: it wires a pod into its node
// without a bridge, from what the daemon wrote in subnet.env.
//
// How it works. For a pod with address P on a node:
//
//	pod netns                        node (host) netns
//	eth0  P/32                       tw<hash>  (veth peer of eth0, proxy_arp=1)
//	169.254.1.1 dev eth0 scope link  P/32 dev tw<hash> proto 168
//	default via 169.254.1.1
//	neigh 169.254.1.1 lladdr <tw<hash> MAC> PERMANENT
//
// The pod sends everything to 169.254.1.1, which resolves (statically) to
// the host end of its veth, so every packet enters the node's routing table;
// replies reach the pod through its /32 route. No address of the node's
// subnet is spent on a gateway and there is no bridge to flood.
//
// Addresses come from an in-process allocator with host-local's on-disk
// layout (/var/lib/cni/networks/<network>/<ip>, last_reserved_ip.0, a file
// lock), or from the IPAM plugin named in the configuration. The host veth
// carries the alias twill/<network>/<container>/<ifname> so GC can find
// attachments that no longer exist.
package plugin
