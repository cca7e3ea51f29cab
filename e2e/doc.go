// Package e2e runs the built twill binaries on simulated multi-node
// clusters made of network namespaces, with a real etcd. Tests need root;
// without it they skip saying so (and fail under CI=true).
package e2e
