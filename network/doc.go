// Package network holds the node-level plumbing every backend needs: the
// masquerade and FORWARD rules for the cluster Network (in chains of
// twill's own, resynced periodically), IP forwarding, and the choice of
// the external interface.
package network
