// Package policy enforces Kubernetes NetworkPolicy on the pods of one node.
//
// How it works: Compile turns the informers' state (pods, namespaces,
// policies) into a Ruleset, a pure description of twill's policy table,
// inet twill-policy. Its one base chain hooks forward, so it sees every
// packet a local pod sends or receives, whether from a pod on this node or
// from another node, after kube-proxy's DNAT:
//
//	forward (hook forward, policy accept)
//	  ct state established,related accept
//	  ip saddr <local pod CIDR> ip saddr != @known4 drop   # fail closed
//	  ip daddr <local pod CIDR> ip daddr != @known4 drop
//	  ip saddr 10.244.1.5 jump eg:ns/pod                   # egress-isolated
//	  ip daddr 10.244.1.7 jump in:ns/pod                   # ingress-isolated
//	in:ns/pod
//	  ip saddr @<policy set> tcp dport 80 counter return   # one per rule, peer and port
//	  counter drop
//
// The known sets hold the addresses of the local pods twilld has
// classified. An address of the node's pod CIDR that is not in them (a pod
// whose address is not yet in the apiserver, or any pod while twilld is
// down) can neither send nor receive, so a pod is isolated from its first
// packet; once twilld knows it, it is allowed, or jumps to its chains. A
// pod that no policy selects is allowed everything. Peers selected by pod
// and namespace selectors are named sets, so that a pod or label change
// rewrites set elements, not rules.
//
// Sync (policy_linux.go) diffs the Ruleset against the kernel's table and
// writes only the difference, in one transaction.
package policy
