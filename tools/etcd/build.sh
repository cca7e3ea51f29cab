#!/usr/bin/env bash
# Build etcdctl from the Go module proxy at the version go.mod pins, and
# cache it by version: build/etcd/<version>/etcdctl. Documentation/etcd.md
# creates etcd's roles and users with it, and TestDocs runs those
# commands.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
exec bash "$here/../gotool.sh" "etcd tools" "$here" go.etcd.io/etcd/etcdctl/v3 \
	etcd etcdctl go.etcd.io/etcd/etcdctl/v3 0
