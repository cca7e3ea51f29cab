// Package nftables keeps twill's masquerade and forward rules in a table of
// its own, inet twill, written over netlink (github.com/google/nftables):
// no nft or iptables binary is needed. The rules are network.DesiredRules,
// the same ones the iptables mode writes; every change is one transaction,
// and only a table that differs from them is rewritten.
package nftables
