// Package network holds the node-level plumbing every backend needs: the
// masquerade and forward rules for the cluster Network (their model, the
// iptables mode's chains, and the Keeper that keeps either mode's rules in
// place on change; the nftables mode is package nftables, the choice
// between them package netfilter), IP forwarding, and the choice of the
// external interface.
package network
