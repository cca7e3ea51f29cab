package lab

import (
	"encoding/xml"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
)

// ConformanceFocus selects Kubernetes' own network conformance specs, what
// `make conformance` runs.
var ConformanceFocus = []string{`\[sig-network\].*\[Conformance\]`}

// ConformanceFast is the pod-networking subset `make test` runs: pod to
// pod and node to pod over HTTP and UDP, a Service's endpoints, a NodePort,
// a pod reaching itself through its own Service (hairpin), and host ports
// (twill serves them itself: one bound to 127.0.0.1, one to the node's
// address over TCP and one over UDP).
var ConformanceFast = []string{
	`\[sig-network\] HostPort validates that there is no conflict between pods with same hostPort but different hostIP and protocol`,
	`\[sig-network\] Networking Granular Checks: Pods should function for intra-pod communication: (http|udp)`,
	`\[sig-network\] Networking Granular Checks: Pods should function for node-pod communication: (http|udp)`,
	`\[sig-network\] Services should serve a basic endpoint from pods`,
	`\[sig-network\] Services should be able to create a functioning NodePort service`,
	`\[sig-network\] Services should allow pods to hairpin back to themselves through services`,
}

// NetpolFocus selects Kubernetes' own NetworkPolicy specs, what `make
// netpol` runs: their truth tables of reachability over three namespaces.
var NetpolFocus = []string{`\[sig-network\] Netpol `}

// NetpolFast is the NetworkPolicy subset `make test` runs: default deny,
// an allow by pod and namespace selectors, named ports, an ipBlock with
// except, and a live label update.
var NetpolFast = []string{
	`\[sig-network\] Netpol NetworkPolicy between server and client should support a 'default-deny-ingress' policy`,
	`\[sig-network\] Netpol NetworkPolicy between server and client should enforce policy to allow traffic only from a pod in a different namespace based on PodSelector and NamespaceSelector`,
	`\[sig-network\] Netpol NetworkPolicy between server and client should allow egress access on one named port`,
	`\[sig-network\] Netpol NetworkPolicy between server and client should enforce except clause while egress access to server in CIDR block`,
	`\[sig-network\] Netpol NetworkPolicy between server and client should allow ingress access from updated pod`,
}

// SigNetworkFocus selects the rest of Kubernetes' [sig-network] specs,
// what `make conformance SUITE=sig-network` runs: every one that neither
// ConformanceSkips nor SigNetworkSkips leaves out.
var SigNetworkFocus = []string{`\[sig-network\]`}

// DualStackFocus selects the dual-stack specs a dual-stack lab's `make
// conformance IP_FAMILY=dual` runs besides ConformanceFocus: pod IPs and
// host IPs of both families, pod to pod and pod, node and endpoint to a
// Service in the secondary family, Services of each family policy.
var DualStackFocus = []string{`\[sig-network\] \[Feature:IPv6DualStack\]`}

// DualStackFast is the dual-stack subset `make test` runs: a pod reached
// on both of its addresses, Services of both families created, and pod to
// Service over the secondary family (HTTP, UDP).
var DualStackFast = []string{
	`\[sig-network\] \[Feature:IPv6DualStack\] should be able to reach pod on ipv4 and ipv6 ip`,
	`\[sig-network\] \[Feature:IPv6DualStack\] should create service with ipv4,v6 cluster ip`,
	`\[sig-network\] \[Feature:IPv6DualStack\] Granular Checks: Services Secondary IP Family \[LinuxOnly\] should function for pod-Service: (http|udp)`,
}

// Skip leaves specs matching Pattern out of a run, for Reason: out of
// every run, or only of runs on Backends, or on labs of Families, when
// those are set.
type Skip struct {
	Pattern, Reason string
	Backends        []string
	Families        []string
}

// SkipsFor are the skips that apply to a lab running backend, of IP
// family family (ipv4, ipv6 or dual).
func SkipsFor(skips []Skip, backend, family string) []Skip {
	var out []Skip
	for _, s := range skips {
		if (len(s.Backends) == 0 || slices.Contains(s.Backends, backend)) &&
			(len(s.Families) == 0 || slices.Contains(s.Families, family)) {
			out = append(out, s)
		}
	}
	return out
}

// ConformanceSkips are every spec the lab's runs leave out, and why: only
// what needs something this machine cannot give. Documentation/
// conformance.md lists them (twillctl lab conformance --list-skips).
var ConformanceSkips = []Skip{
	{Pattern: `\[Feature:IPv6DualStack\]|IPv6`, Families: []string{"ipv4"},
		Reason: "on an IPv4 lab only: they need IPv6 pods and Services; make conformance IP_FAMILY=dual runs the dual-stack ones on a dual-stack lab"},
	{Pattern: `\[Disruptive\]|\[Serial\]`, Reason: "none of the Conformance or Netpol specs is either; the rest of [sig-network]'s need what the lab's nodes lack: SSH (to delete a node's iptables rules), kube-proxy and the apiserver as pods to delete, or SCTP (below)"},
	{Pattern: `\[Feature:Networking-IPv6\]|\[Feature:Networking-DNS\]|\[Provider:`, Reason: "need the internet or a cloud provider"},
	{Pattern: `\[Feature:SCTPConnectivity\]`, Reason: "SCTP traffic needs the kernel's sctp module, and loading it would change the machine; policies naming SCTP are still checked (the Netpol specs that expect SCTP not to be taken for TCP run)"},
}

// SigNetworkSkips are what the sig-network suite leaves out besides
// ConformanceSkips: the specs the other suites run, and those outside the
// default set Kubernetes' own CI runs against a network plugin.
var SigNetworkSkips = []Skip{
	{Pattern: `\[Conformance\]`, Reason: "make conformance runs them (--suite conformance)"},
	{Pattern: `\[sig-network\] Netpol `, Reason: "make netpol runs them (--suite netpol)"},
	{Pattern: `\[Feature:`, Reason: "each needs a cluster feature set up beyond a plain cluster (a cloud load balancer, an ingress controller, a feature gate, SCTP, ...); Kubernetes' CI runs them in their own jobs"},
	{Pattern: `\[sig-network\] Services should implement NodePort and HealthCheckNodePort correctly when ExternalTrafficPolicy changes`, Backends: []string{"vxlan"},
		Reason: "on vxlan only: it expects a node's own connection to its NodePort (ExternalTrafficPolicy Local, endpoint on another node) to reach the pod from the node's address, but kube-proxy masquerades that connection and the kernel's MASQUERADE takes the address of the device it leaves by, the vxlan device's pod-network address (10.244.N.0, as on flannel's flannel.1); host-gw leaves by the node's own interface and passes it"},
	{Pattern: `\[Slow\]|\[Flaky\]`, Reason: "outside the default set Kubernetes' own CI runs against a network plugin: [Slow] specs wait out timeouts of many minutes, [Flaky] ones are known to fail at times"},
}

// SuiteSkips are every spec a suite leaves out (conformance, netpol or
// sig-network), and why.
func SuiteSkips(suite string) []Skip {
	if suite == "sig-network" {
		return slices.Concat(ConformanceSkips, SigNetworkSkips)
	}
	return ConformanceSkips
}

// SkipRegexp joins skips into one --ginkgo.skip expression.
func SkipRegexp(skips []Skip) string {
	parts := make([]string, len(skips))
	for i, s := range skips {
		parts[i] = s.Pattern
	}
	return strings.Join(parts, "|")
}

// SpecResult is one spec of a run, from its JUnit report.
type SpecResult struct {
	Name   string
	Status string // passed, failed, skipped, pending, ...
}

// Outcome sums a run up.
type Outcome struct {
	Specs                   []SpecResult // those that ran, by name
	Passed, Failed, Skipped int
}

// suiteNode names Ginkgo's suite-level nodes ([BeforeSuite],
// [SynchronizedAfterSuite], [ReportBeforeSuite], ...).
var suiteNode = regexp.MustCompile(`^\[[A-Za-z]*Suite\]`)

// ReadJUnit reads the outcome of a run from the JUnit XML report e2e.test
// wrote (--report-dir): every spec that ran, and how many were skipped.
func ReadJUnit(r io.Reader) (Outcome, error) {
	var doc struct {
		Suites []struct {
			Cases []struct {
				Name    string    `xml:"name,attr"`
				Status  string    `xml:"status,attr"`
				Failure *struct{} `xml:"failure"`
				Error   *struct{} `xml:"error"`
				Skipped *struct{} `xml:"skipped"`
			} `xml:"testcase"`
		} `xml:"testsuite"`
	}
	if err := xml.NewDecoder(r).Decode(&doc); err != nil {
		return Outcome{}, fmt.Errorf("reading the JUnit report: %w", err)
	}
	var o Outcome
	for _, s := range doc.Suites {
		for _, c := range s.Cases {
			status := c.Status
			switch {
			case c.Failure != nil || c.Error != nil:
				status = "failed"
			case status == "" && c.Skipped != nil:
				status = "skipped"
			case status == "":
				status = "passed"
			}
			name := strings.TrimSpace(strings.TrimPrefix(c.Name, "[It]"))
			// Ginkgo's own setup and teardown nodes are not specs, but
			// one that failed failed the run.
			if suiteNode.MatchString(name) && status != "failed" {
				continue
			}
			switch status {
			case "skipped", "pending":
				o.Skipped++
				continue
			case "passed":
				o.Passed++
			default:
				o.Failed++
			}
			o.Specs = append(o.Specs, SpecResult{Name: name, Status: status})
		}
	}
	sort.Slice(o.Specs, func(i, j int) bool { return o.Specs[i].Name < o.Specs[j].Name })
	return o, nil
}

// ReadJUnitDir reads the JUnit report in a run's report directory.
func ReadJUnitDir(dir string) (Outcome, error) {
	f, err := os.Open(filepath.Join(dir, "junit_01.xml"))
	if err != nil {
		return Outcome{}, fmt.Errorf("the run's JUnit report: %w", err)
	}
	defer f.Close()
	return ReadJUnit(f)
}

// Markdown renders the specs that ran as a Markdown table, for
// Documentation/conformance.md.
func (o Outcome) Markdown(backend string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "| spec (%s) | result |\n|---|---|\n", backend)
	for _, s := range o.Specs {
		fmt.Fprintf(&b, "| %s | %s |\n", strings.ReplaceAll(s.Name, "|", `\|`), s.Status)
	}
	fmt.Fprintf(&b, "\n%d passed, %d failed, %d skipped\n", o.Passed, o.Failed, o.Skipped)
	return b.String()
}
