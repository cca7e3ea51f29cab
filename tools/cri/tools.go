//go:build tools

// Package tools pins crictl, the CRI command-line client the lab and the
// tests drive containerd with. It is a module of its own so that its
// dependencies never move those Kubernetes itself is built with
// (tools/kube).
package tools

import _ "sigs.k8s.io/cri-tools/cmd/crictl"
