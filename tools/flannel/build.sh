#!/usr/bin/env bash
# Build flanneld from the Go module proxy at the version go.mod pins, and
# cache it by version: build/flannel/<version>/flanneld. The flannel-takeover
# tests (e2e/flannel_test.go) run it as the cluster's previous network.
#
# flanneld's udp backend is written with cgo, so it is built with cgo (gcc).
# Tencent Cloud's SDK is replaced by stand-ins (go.mod); nothing of
# flannel's code is kept in this tree.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
exec bash "$here/../gotool.sh" flannel "$here" github.com/flannel-io/flannel \
	flannel flanneld github.com/flannel-io/flannel 1 \
	"-X github.com/flannel-io/flannel/pkg/version.Version={version}"
