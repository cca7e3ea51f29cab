// Package subnet holds twill's data model: the network configuration
// (net-conf.json), the per-node subnet Lease and its published attributes,
// and subnet.env, the file through which the daemon tells the CNI plugin
// what it holds. Subnet managers (subnet/etcd, subnet/kube) produce leases;
// backends consume them.
package subnet
