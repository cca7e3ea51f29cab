//go:build tools

// Package tools pins flanneld, which the flannel-takeover tests run as the
// cluster's previous network (see build.sh). It is a module of its own so
// that flannel's dependencies never move twill's.
package tools

import _ "github.com/flannel-io/flannel"
