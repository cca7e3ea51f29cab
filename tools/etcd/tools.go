//go:build tools

// Package tools pins etcdctl, which Documentation/etcd.md's role and user
// commands use and TestDocs runs (see build.sh). It is a module of its own
// so that etcdctl's dependencies never move twill's.
package tools

import _ "go.etcd.io/etcd/etcdctl/v3"
