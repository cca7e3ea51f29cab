# twill — run `make help` for the targets.
SHELL := /bin/bash
GO    ?= go
BIN   ?= bin
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -s -w -X github.com/twill-net/twill/internal/version.Version=$(VERSION)
# Every go command here builds as the shipped binaries do, with cgo off and
# -trimpath, but the race detector's, which needs cgo (RACE): go vet,
# coverage, the benchmarks and the binaries the tests build then share one
# compile of twill's dependencies in the Go build cache. On a fresh machine
# each configuration is minutes of compiling.
export CGO_ENABLED ?= 0
export GOFLAGS ?= -trimpath
RACE := CGO_ENABLED=1 $(GO) test -race
# Debian packages the tests, the lab and the benchmarks run (nft and strace
# only in tests, to alter twill's table and to watch for execs): the Kubernetes
# lab's nodes run Debian's containerd and runc, with the CNI plugins a node
# provides next to twill (loopback, portmap) from containernetworking-plugins.
# make test-kernels boots Debian's kernels under qemu's emulator with a
# busybox initramfs (qemu-system-x86, busybox-static, kmod for depmod and the
# VM's modprobe, cpio).
APT_PACKAGES := iproute2 iptables nftables strace iputils-ping iperf3 ethtool containerd runc containernetworking-plugins util-linux openssl \
	qemu-system-x86 busybox-static kmod cpio
# A file each package provides, to check before installing.
APT_FILES := /usr/sbin/ip /usr/sbin/iptables /usr/sbin/nft /usr/bin/strace /usr/bin/ping /usr/bin/iperf3 /usr/sbin/ethtool /usr/bin/containerd /usr/sbin/runc \
	/usr/lib/cni/portmap /usr/bin/nsenter /usr/bin/openssl /usr/bin/qemu-system-x86_64 /bin/busybox /usr/bin/kmod /usr/bin/cpio

.DEFAULT_GOAL := help
# The lab and the tests need root (network namespaces).

.PHONY: help
help: ## Show this help
	@if [ -t 1 ]; then on='\033[36m'; off='\033[0m'; else on=; off=; fi; \
	awk -v on="$$on" -v off="$$off" 'BEGIN {FS = ":.*## "} /^[a-zA-Z0-9_-]+:.*## / {printf "  %s%-16s%s %s\n", on, $$1, off, $$2}' $(MAKEFILE_LIST)

.PHONY: lab
lab: setup-base build ## Start the local lab (3 nodes x 2 pods, vxlan) and print its connectivity matrix
	bin/twillctl lab up --nodes 3 --pods-per-node 2 --backend vxlan
	bin/twillctl lab check
	@echo; echo "The lab keeps running. Explore it with bin/twillctl lab status / lab exec node1 -- ip route;"; \
	echo "remove it with: bin/twillctl lab down"

.PHONY: lab-kube
lab-kube: setup kube-images ## Start a Kubernetes lab (2 nodes: control plane, containerd, kubelet, kube-proxy; twill from dist/kube-twill.yml) and check it
	bin/twillctl lab up --name kube --kubernetes --nodes 2 --backend vxlan
	bin/twillctl lab check --name kube
	@echo; echo "The lab keeps running: bin/twillctl lab status --name kube; bin/twillctl lab kubectl --name kube get pods -A;"; \
	echo "remove it with: bin/twillctl lab down --name kube"

# make conformance's backend (vxlan or host-gw).
BACKEND ?= vxlan

# make conformance's suite: conformance ([sig-network] [Conformance]) or
# sig-network (the rest of [sig-network]; twillctl lab conformance --suite).
SUITE ?= conformance

# make conformance's lab: ipv4, dual (dual-stack: the suite adds the
# [Feature:IPv6DualStack] specs) or ipv6.
IP_FAMILY ?= ipv4

# make conformance's kube-proxy: iptables or nftables.
KUBE_PROXY_MODE ?= iptables

.PHONY: conformance
conformance: setup e2e-images ## Kubernetes' own [sig-network] [Conformance] specs (SUITE=sig-network: the rest of [sig-network]) on a 3-node Kubernetes lab (BACKEND=vxlan|host-gw, IP_FAMILY=ipv4|dual|ipv6, KUBE_PROXY_MODE=iptables|nftables); fails if any spec does
	@name=$$(case '$(SUITE)/$(IP_FAMILY)/$(KUBE_PROXY_MODE)' in sig-network/*) echo sn;; */dual/*) echo ds;; */ipv6/*) echo v6;; */nftables) echo nf;; *) echo cf;; esac)$$(echo '$(BACKEND)' | tr -dc a-z | cut -c1-6); \
	bin/twillctl lab up --name $$name --kubernetes --nodes 3 --pods-per-node 1 --backend '$(BACKEND)' --ip-family '$(IP_FAMILY)' --kube-proxy-mode '$(KUBE_PROXY_MODE)'; rc=$$?; \
	if [ $$rc = 0 ]; then rm -rf build/conformance/$$name; \
		bin/twillctl lab conformance --name $$name --suite '$(SUITE)' --markdown --report-dir build/conformance/$$name; rc=$$?; fi; \
	bin/twillctl lab down --name $$name; exit $$rc

.PHONY: netpol
netpol: setup e2e-images ## Kubernetes' own [sig-network] Netpol (NetworkPolicy) specs on a 3-node Kubernetes lab (BACKEND=vxlan|host-gw), with ClusterNetworkPolicies that select nothing present; fails if any spec does
	@name=np$$(echo '$(BACKEND)' | tr -dc a-z | cut -c1-6); \
	bin/twillctl lab up --name $$name --kubernetes --nodes 3 --pods-per-node 1 --backend '$(BACKEND)'; rc=$$?; \
	if [ $$rc = 0 ]; then bin/twillctl lab kubectl --name $$name apply -f - < tools/cnp/select-nothing.yaml; rc=$$?; fi; \
	if [ $$rc = 0 ]; then rm -rf build/conformance/$$name; \
		bin/twillctl lab conformance --name $$name --suite netpol --markdown --report-dir build/conformance/$$name; rc=$$?; fi; \
	bin/twillctl lab down --name $$name; exit $$rc

.PHONY: cnp
cnp: setup e2e-images ## network-policy-api's own ClusterNetworkPolicy conformance suite (its profile, experimental features on; SCTP left out: this kernel has none) on a 3-node Kubernetes lab (BACKEND=vxlan|host-gw); its report in build/conformance/cnp<backend>/
	@name=cn$$(echo '$(BACKEND)' | tr -dc a-z | cut -c1-6); dir=build/conformance/cnp$$(echo '$(BACKEND)' | tr -dc a-z); \
	bin/twillctl lab up --name $$name --kubernetes --nodes 3 --pods-per-node 1 --backend '$(BACKEND)'; rc=$$?; \
	if [ $$rc = 0 ]; then rm -rf $$dir; \
		bin/twillctl lab conformance --name $$name --suite cnp --markdown --report-dir $$dir; rc=$$?; fi; \
	bin/twillctl lab down --name $$name; exit $$rc

.PHONY: build
build: ## Build twilld, twillctl, the twill CNI plugin, twill-wg and the lab (twill-lab, which runs twillctl lab) into bin/
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/ ./cmd/...

# mkimage writes twill's image, and the lab's pause image and its own
# (twill-lab, for its echo pods); the targets below add
# to what it writes in the same run.
MKIMAGE = CGO_ENABLED=0 $(GO) build -trimpath -ldflags '-s -w' -o build/images/.pause ./tools/pause && \
	$(GO) run ./tools/mkimage -bin $(BIN) -pause build/images/.pause -debs build/debs -out build/images -tag $(VERSION)

.PHONY: image
image: build ## Build twill's image and the lab's pause and lab images as tarballs in build/images (no Docker needed; ctr images import reads them)
	$(MKIMAGE)

.PHONY: kube-images
kube-images: build kube-tools flannel-tools ## make image, the Kubernetes lab's CoreDNS image (build/images/coredns.tar) and kube-flannel's (flannel.tar, for lab up --flannel)
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '-s -w' -o build/images/.flannelcni ./tools/flannelcni
	$(MKIMAGE) -coredns build/kube/current -flannel build/flannel/current/flanneld -flannelcni build/images/.flannelcni

.PHONY: e2e-images
e2e-images: build kube-tools ## make kube-images, and stand-ins for the images Kubernetes' e2e suite runs, under the names it asks for (build/images/e2e-images.tar)
	$(MKIMAGE) -coredns build/kube/current -e2e build/kube/current

.PHONY: setup
setup: setup-base setup-tools ## Install what a fresh machine lacks: Debian packages (iproute2, iptables, containerd, ...), Go modules, the Kubernetes binaries, flanneld, etcdctl, helm; only what is missing

.PHONY: setup-tools
setup-tools: kube-tools flannel-tools etcd-tools helm-tools cnp-tools ## The tools the e2e tier runs, built from the Go module proxy: the Kubernetes binaries, e2e.test, flanneld, etcdctl, helm, the ClusterNetworkPolicy CRDs

.PHONY: setup-base
setup-base: ## What the lab needs: the Debian packages and the Go modules
	@missing=""; for f in $(APT_FILES); do [ -e $$f ] || missing="$$missing $$f"; done; \
	if [ -z "$$missing" ]; then echo "setup: all packages present"; exit 0; fi; \
	echo "setup: missing:$$missing; installing $(APT_PACKAGES)"; \
	if [ "$$(id -u)" != 0 ]; then echo "setup: need root to apt-get install; run: sudo make setup" >&2; exit 1; fi; \
	export DEBIAN_FRONTEND=noninteractive; \
	policy=""; if [ -d /run/systemd/system ] && [ ! -e /usr/sbin/policy-rc.d ]; then \
		policy=/usr/sbin/policy-rc.d; printf '#!/bin/sh\nexit 101\n' > $$policy; chmod 755 $$policy; fi; \
	apt-get update -qq && apt-get install -y -qq --no-install-recommends $(APT_PACKAGES) >/dev/null; rc=$$?; \
	[ -z "$$policy" ] || rm -f $$policy; exit $$rc
	$(GO) mod download

.PHONY: kube-tools
kube-tools: ## Build the Kubernetes binaries and crictl from the Go module proxy (cached in build/kube/<version>)
	bash tools/kube/build.sh

.PHONY: flannel-tools
flannel-tools: ## Build flanneld from the Go module proxy, for the flannel-takeover tests (cached in build/flannel/<version>)
	bash tools/flannel/build.sh

.PHONY: cnp-tools
cnp-tools: ## Fetch the ClusterNetworkPolicy CRDs of sigs.k8s.io/network-policy-api from the Go module proxy (cached in build/cnp/<version>)
	bash tools/cnp/build.sh

.PHONY: helm-tools
helm-tools: ## Build helm from the Go module proxy, for dist/chart/twill's tests and lab up --helm (cached in build/helm/<version>)
	bash tools/helm/build.sh

.PHONY: etcd-tools
etcd-tools: ## Build etcdctl from the Go module proxy, for Documentation/etcd.md's RBAC commands (cached in build/etcd/<version>)
	bash tools/etcd/build.sh

# make test's go test runs skip go vet (-vet=off): lint has just run go vet
# over every package, a superset of go test's checks; on a fresh machine
# each go test invocation (race or not) would first work out vet's facts
# for every dependency again.
#
# Only the e2e tier runs the tools setup-tools builds (about 20 minutes of
# compiling on a fresh machine): tools/overlap.sh builds what the
# Kubernetes labs run (KUBE_TOOLS_E2E=0, CNP_SUITE=0: not the conformance
# suites), after the kernel matrix's kernels (a download), niced while
# lint, the unit tier, make build and the kernel matrix run (the matrix's
# emulated machines, not niced, take the CPU before the build does).
#
# The e2e tier's parallel tests wait for a lane of their own (two
# Kubernetes labs at once, one lighter test beside them: e2e/share_test.go),
# so -parallel is well above the number of parallel tests (about 60): a
# test waiting for its lane never holds up another, and a waiting test
# costs only its goroutine. The lanes alone left about 45% of a fresh
# 2-core machine idle (sampled 2026-11-29); with a third Kubernetes lab in
# the tier's last minutes and the work below beside it, 12%. Beside the
# tier run the conformance suites' build (the tier's conformance subsets,
# which come after the tests that take the whole lane, wait for it:
# tools/kube/build.sh) and then
# cover and bench-smoke, niced, their scheduler autogroup at nice 10
# (overlap.sh -g), so that the tier's tests, some of which bound a gap in
# traffic, keep the CPU they ask for; cover and bench-smoke start once the
# test that takes the whole machine (TestKubeLabWireGuard, aloneOnMachine)
# has ended, which it says in build/e2e-alone-done (20 minutes at most).
# cover (the unit tier again, without -race, for coverage: about a minute
# of two busy cores) went there from before the tier, whose CPU the
# compiles keep busy on a fresh machine. If the tier fails, bench-smoke
# still ends on its own (-w), removing its labs.
#
# The kernel matrix cannot go beside the tier too (on a fresh machine,
# 2026-11-29): at nice 10, beside bench-smoke, its emulated machines got
# so little CPU that a twilld in them took 36 s to start and three checks
# timed out; at the usual priority, the tier's tests alone in their lane
# failed (held connections broken, gaps of 1.5-4.9 s).
# make build runs before the tier: the docs' tests then find bin/ up to
# date rather than write it while another reads it.
# tools/hostguard runs the tiers and fails make test if the machine's own
# paths, sysctls, links, rules, routes or nftables tables changed meanwhile,
# naming the step and the tests that were running when it first saw it.
.PHONY: test
test: setup-base ## Everything this machine can run, as root: lint, coverage, unit, privileged, e2e (listed test by test), fuzz seeds, benchmarks once; fails if the machine itself changed
	$(GO) run ./tools/hostguard -- $(MAKE) --no-print-directory test-tiers

.PHONY: test-tiers
test-tiers:
	bash tools/overlap.sh build/setup-tools.log 'KUBE_TOOLS_E2E=0 CNP_SUITE=0 $(MAKE) --no-print-directory kernels-fetch setup-tools' \
		'$(MAKE) --no-print-directory lint test-packages build test-kernels'
	@rm -f build/e2e-alone-done
	bash tools/overlap.sh -w -g 10 build/beside-e2e.log '$(MAKE) --no-print-directory setup-tools && $(WAIT_ALONE) && $(MAKE) --no-print-directory cover bench-smoke' \
		'TWILL_E2E_ALONE_DONE=$(CURDIR)/build/e2e-alone-done $(RACE) -vet=off -count=1 -timeout 60m -v -parallel 256 ./e2e/'

# WAIT_ALONE waits, 20 minutes at most, for the e2e tier's test alone on
# the machine to end (see above).
WAIT_ALONE = { for i in $$(seq 1200); do [ -e build/e2e-alone-done ] && break; sleep 1; done; \
	[ -e build/e2e-alone-done ] || echo "no build/e2e-alone-done after 20 minutes: starting anyway"; }

.PHONY: kernels-fetch
kernels-fetch: ## Download and unpack the kernels of tools/kernels/kernels.list from Debian's archive (cached in build/kernels/<package>_<version>)
	@for n in $$(awk '!/^#/ && NF {print $$1}' tools/kernels/kernels.list); do tools/kernels/fetch.sh "$$n" >/dev/null || exit 1; done

.PHONY: test-kernels
test-kernels: build ## Boot each kernel of tools/kernels/kernels.list (Debian's 5.10, 6.1, 6.12) under qemu's TCG emulator and run the lab (vxlan, host-gw, kernel WireGuard; IPv4 and dual-stack; nftables and iptables), TestEtcdWireGuard on the kernel device, vxlan's checksum workaround, the nftables seam's transactions, the policy table and the plugin's host ports inside it (part of make test)
	bash tools/kernels/matrix.sh

# TIMED_UNIT bounds how long traffic stops (a key rotation's, within 1 s);
# it runs after the other packages' tests, on its own: beside them, the
# compiles and tests of two packages at once (-p 2, race detector on)
# once held its process off the CPU for about a second (CI, 2026-12-02:
# the rotation's first handshake went out 1.1 s after it). It skips
# itself under -short (cover, test-unit), which runs beside other work.
TIMED_UNIT = ^TestRotationRecoversWithinASecond$$

.PHONY: test-packages
test-packages: ## Every package's tests but e2e's, race detector on, privileged ones included as root (make test's unit tier); the timed one after the rest, alone
	$(RACE) -vet=off -count=1 -timeout 30m -skip '$(TIMED_UNIT)' $$($(GO) list ./... | grep -v '/e2e$$')
	$(RACE) -vet=off -count=1 -timeout 10m -run '$(TIMED_UNIT)' ./backend/wireguard/

.PHONY: test-unit
test-unit: ## Unit tier: no root needed (privileged tests skip themselves in -short)
	$(RACE) -short -count=1 ./...

# The unit tier's coverage of backend/ (the netlink seam nl/ is the
# privileged tier's: it is the code that talks to a real kernel).
COVER_DIRS = ./backend/... ./daemon ./policy ./network/nftables ./takeover ./nl/nftsync ./plugin/hostport
COVER_PKGS = $$($(GO) list $(COVER_DIRS) | grep -v '/backend/backendtest$$' | paste -sd, -)
COVER_FLOOR = $(addprefix github.com/twill-net/twill/,backend backend/kernelsync backend/hostgw backend/vxlan backend/wireguard backend/wireguard/uapi backend/wireguard/userspace backend/wireguard/wgkeeper backend/eni backend/eni/cni daemon policy network/nftables takeover nl/nftsync plugin/hostport)

.PHONY: cover
cover: ## Statement coverage by the unit tier, no root involved, per package: every backend/ package, the daemon's engine, policy, network/nftables, takeover, the nftables engine and the plugin's host ports at 80% or more each
	@mkdir -p build
	@echo '$(GO) test -vet=off -short -count=1 -coverpkg=... -coverprofile=build/cover.out $(COVER_DIRS)'
	@$(GO) test -vet=off -short -count=1 -coverpkg=$(COVER_PKGS) -coverprofile=build/cover.out $(COVER_DIRS) >build/cover.log 2>&1 || \
		{ grep -v -e '^ok ' -e 'no test files' -e 'coverage: 0.0% of statements' build/cover.log; exit 1; }
	@awk -v floor="$(COVER_FLOOR)" -f tools/cover.awk build/cover.out

.PHONY: test-privileged
test-privileged: setup ## Privileged tier: real netns, netlink, iptables (root)
	$(RACE) -count=1 -run 'Privileged' ./nl/... ./backend/... ./network/... ./policy/... ./daemon/... ./internal/... ./lab/... ./subnet/... ./plugin/...

.PHONY: e2e
e2e: setup ## Multi-node clusters in network namespaces with the built binaries (root)
	$(GO) test -count=1 -timeout 60m -v -parallel 256 ./e2e/...

.PHONY: fuzz
fuzz: ## Fuzz every parser of untrusted input for FUZZTIME each (default 30s)
	@for f in FuzzParseConfig FuzzParseLeaseAttrs FuzzScanLeaseAttrs FuzzParseEnv FuzzParseSubnetKey; do \
		$(GO) test -run '^$$' -fuzz "^$$f\$$" -fuzztime $${FUZZTIME:-30s} ./subnet/ || exit 1; done
	$(GO) test -run '^$$' -fuzz '^FuzzParseConf$$' -fuzztime $${FUZZTIME:-30s} ./plugin/
	$(GO) test -run '^$$' -fuzz '^FuzzParse$$' -fuzztime $${FUZZTIME:-30s} ./plugin/hostport/
	$(GO) test -run '^$$' -fuzz '^FuzzNodeLease$$' -fuzztime $${FUZZTIME:-30s} ./subnet/kube/
	$(GO) test -run '^$$' -fuzz '^FuzzParseConfig$$' -fuzztime $${FUZZTIME:-30s} ./backend/eni/
	$(GO) test -run '^$$' -fuzz '^FuzzDecode$$' -fuzztime $${FUZZTIME:-30s} ./internal/strictjson/
	$(GO) test -run '^$$' -fuzz '^FuzzIncrementalReconcileIsFull$$' -fuzztime $${FUZZTIME:-30s} ./backend/vxlan/
	$(GO) test -run '^$$' -fuzz '^FuzzParseConfig$$' -fuzztime $${FUZZTIME:-30s} ./backend/wireguard/
	$(GO) test -run '^$$' -fuzz '^FuzzIncrementalIsFull$$' -fuzztime $${FUZZTIME:-30s} ./backend/wireguard/
	$(GO) test -run '^$$' -fuzz '^FuzzParseGet$$' -fuzztime $${FUZZTIME:-30s} ./backend/wireguard/uapi/
	$(GO) test -run '^$$' -fuzz '^FuzzParseHeader$$' -fuzztime $${FUZZTIME:-30s} ./policy/verdictlog/
	$(GO) test -run '^$$' -fuzz '^FuzzRouteEvents$$' -fuzztime $${FUZZTIME:-30s} ./nl/
	$(GO) test -run '^$$' -fuzz '^FuzzReply$$' -fuzztime $${FUZZTIME:-30s} ./nl/nft/
	$(GO) test -run '^$$' -fuzz '^FuzzCompile$$' -fuzztime $${FUZZTIME:-30s} ./policy/
	$(GO) test -run '^$$' -fuzz '^FuzzIncrementalIsFull$$' -fuzztime $${FUZZTIME:-30s} ./policy/

.PHONY: lint
lint: ## gofmt, go vet, netlink only through nl/, no tracked file over 1 MB, no function over 80 lines (tools/sizecheck), one version of each shared dependency across the tools modules (tools/modalign), top-level folders layered and internal/ leaves only (tools/layers)
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	@bad=$$(grep -rln --include='*.go' '"github.com/vishvananda/netlink"' . | grep -v '^./nl/' || true); \
	if [ -n "$$bad" ]; then echo "netlink used outside nl/ (use the seam):"; echo "$$bad"; exit 1; fi
	@big=$$(git ls-files -z | xargs -0 -r stat -c '%s %n' 2>/dev/null | awk '$$1 > 1048576 {print "  " $$2 " (" $$1 " bytes)"}'); \
	if [ -n "$$big" ]; then echo "tracked files over 1 MB (build output? use make build, which writes bin/):"; echo "$$big"; exit 1; fi
	$(GO) run ./tools/sizecheck
	$(GO) run ./tools/modalign
	$(GO) run ./tools/layers

# The packages with benchmarks: go test ./... would link a test binary for
# each of the others too, for nothing.
BENCH_PKGS = $$(grep -l '^func Benchmark' $$($(GO) list -f '{{range .TestGoFiles}}{{$$.Dir}}/{{.}} {{end}}{{range .XTestGoFiles}}{{$$.Dir}}/{{.}} {{end}}' ./...) | xargs -n1 dirname | sort -u)

.PHONY: bench
bench: setup ## Benchmarks with full output (root); figures go in Documentation/benchmarks.md
	$(GO) test -p 1 -run '^$$' -bench . -benchtime 1x -count 1 -timeout 30m -v $(BENCH_PKGS)

.PHONY: bench-smoke
bench-smoke: ## Run every benchmark once so none rots (part of make test): each at its smallest size and shortest run (TWILL_BENCH_SMOKE)
	TWILL_BENCH_SMOKE=1 $(GO) test -vet=off -p 1 -run '^$$' -bench . -benchtime 1x -count 1 -timeout 30m $(BENCH_PKGS)

.PHONY: clean
clean: ## Remove build output
	rm -rf $(BIN)
