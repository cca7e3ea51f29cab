// Command hostguard runs a command (make test's tiers) and fails if the
// machine it runs on changed meanwhile: the paths twill, the lab, kubelet
// and containerd would write on a host, machine-wide sysctls, the host
// network namespace's links, rules, IPv4 routes and nftables tables, and
// whether the WireGuard module is loaded.
//
// A warm machine hides such a change (the directory "always" exists), so a
// fresh one shows it in whichever test happens to look. hostguard looks for
// the whole run: it polls the paths, sysctls and links twice a second and
// follows the command's `go test -v` output, so a change is reported with
// the make step and the tests that were running when it first appeared.
// What differs at the end from the start fails the run; a change that came
// and went again is reported without failing it.
//
//	hostguard -- make test-tiers
package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"os/signal"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"
)

// hostPaths are the machine's own paths that twilld, twillctl, the plugin,
// flanneld, kubelet and containerd write by default. No test may: each
// gives them paths of its own.
var hostPaths = []string{
	"/var/lib/twill", "/run/twill", "/etc/kube-twill", "/run/flannel", "/etc/kube-flannel",
	"/etc/cni", "/opt/cni", "/var/lib/cni", "/var/lib/kubelet", "/run/containerd", "/var/lib/containerd",
	"/var/log/pods", "/var/log/containers", "/etc/kubernetes", "/usr/libexec/kubernetes", "/run/twill-lab",
}

// hostSysctls are machine-wide settings (or the host namespace's) that
// twilld, kubelet or kube-proxy would change if let.
var hostSysctls = []string{
	"vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops",
	"kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes",
	"net/ipv4/ip_forward", "net/ipv6/conf/all/forwarding", "net/ipv4/conf/all/rp_filter", "net/ipv4/conf/default/rp_filter",
	"net/ipv4/conf/all/proxy_arp", "net/ipv4/conf/all/send_redirects",
	"net/netfilter/nf_conntrack_max", "net/netfilter/nf_conntrack_tcp_timeout_close_wait",
	"net/netfilter/nf_conntrack_tcp_timeout_established", "net/bridge/bridge-nf-call-iptables",
}

const pollEvery = 500 * time.Millisecond

func main() {
	args := os.Args[1:]
	if len(args) > 0 && args[0] == "--" {
		args = args[1:]
	}
	if len(args) == 0 {
		fmt.Fprintln(os.Stderr, "usage: hostguard -- COMMAND [ARG...]")
		os.Exit(2)
	}
	os.Exit(run(args))
}

func run(args []string) int {
	g := &guard{start: snapshot(true), running: map[string]bool{}, first: map[string]sighting{}}
	cmd := exec.Command(args[0], args[1:]...)
	pr, pw, err := os.Pipe()
	if err != nil {
		fmt.Fprintln(os.Stderr, "hostguard:", err)
		return 2
	}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, pw, pw
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "hostguard:", err)
		return 2
	}
	pw.Close()
	// An interrupt reaches the command's process group through the
	// terminal; hostguard stays to report.
	signal.Ignore(syscall.SIGINT)
	read := make(chan struct{})
	go func() { g.follow(pr, os.Stdout); close(read) }()
	stop := make(chan struct{})
	polled := make(chan struct{})
	go func() { g.poll(stop); close(polled) }()
	werr := cmd.Wait()
	<-read
	close(stop)
	<-polled
	rc := 0
	if werr != nil {
		rc = 1
		var ee *exec.ExitError
		if errors.As(werr, &ee) && ee.ExitCode() > 0 {
			rc = ee.ExitCode()
		}
	}
	if g.report(os.Stdout, snapshot(true)) && rc == 0 {
		rc = 1
	}
	return rc
}

// sighting is when a change was first seen, and what was running then.
type sighting struct {
	at    time.Duration
	step  string
	tests []string
	value string
}

type guard struct {
	start   map[string]string
	began   time.Time
	mu      sync.Mutex
	step    string          // the make step last echoed
	running map[string]bool // top-level tests running, from go test -v
	first   map[string]sighting
}

var testLine = regexp.MustCompile(`^\s*(=== RUN|=== CONT|=== PAUSE|--- PASS:|--- FAIL:|--- SKIP:)\s+(\S+)`)

// follow copies the command's output and keeps track of the make step and
// the tests running.
func (g *guard) follow(r io.Reader, w io.Writer) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 4*1024*1024)
	for sc.Scan() {
		line := sc.Text()
		fmt.Fprintln(w, line)
		g.mu.Lock()
		if m := testLine.FindStringSubmatch(line); m != nil {
			name, _, _ := strings.Cut(m[2], "/")
			switch m[1] {
			case "=== RUN", "=== CONT":
				g.running[name] = true
			default:
				if m[2] == name {
					delete(g.running, name)
				}
			}
		} else if isStep(line) {
			g.step = line
			if len(g.step) > 160 {
				g.step = g.step[:160] + "…"
			}
		}
		g.mu.Unlock()
	}
	io.Copy(w, r) // a line too long for the scanner: pass the rest on
}

// isStep tells a command make echoes from the output of what it runs.
func isStep(line string) bool {
	for _, p := range []string{"go ", "CGO_ENABLED=", "bash ", "$(", "make", "awk "} {
		if strings.HasPrefix(line, p) {
			return true
		}
	}
	return false
}

func (g *guard) poll(stop <-chan struct{}) {
	g.began = time.Now()
	t := time.NewTicker(pollEvery)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		now := snapshot(false)
		g.mu.Lock()
		for k, v := range now {
			if g.start[k] != v {
				if _, seen := g.first[k]; !seen {
					g.first[k] = sighting{at: time.Since(g.began), step: g.step, tests: slices.Sorted(maps.Keys(g.running)), value: v}
				}
			}
		}
		g.mu.Unlock()
	}
}

// report prints every change and says whether one is still there.
func (g *guard) report(w io.Writer, end map[string]string) (changed bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	keys := slices.Sorted(maps.Keys(end))
	for _, k := range slices.Sorted(maps.Keys(g.start)) {
		if _, ok := end[k]; !ok {
			keys = append(keys, k)
		}
	}
	for _, k := range keys {
		before, after := g.start[k], end[k]
		s, seen := g.first[k]
		if before == after && !seen {
			continue
		}
		where := "(seen only at the end)"
		if seen {
			where = fmt.Sprintf("first seen %s into the run, during %q, tests running: %s",
				s.at.Round(time.Second), s.step, orNone(s.tests))
		}
		if before == after {
			fmt.Fprintf(w, "hostguard: %s changed and came back (was %q, then %q); %s\n", k, before, s.value, where)
			continue
		}
		changed = true
		fmt.Fprintf(w, "hostguard: the machine changed: %s was %q, is %q; %s\n", k, before, after, where)
	}
	if changed {
		fmt.Fprintln(w, "hostguard: FAIL: a test or a lab step wrote the machine's own state; give it paths and namespaces of its own")
	}
	return changed
}

func orNone(tests []string) string {
	if len(tests) == 0 {
		return "none"
	}
	return strings.Join(tests, ", ")
}

// snapshot reads the machine's state: paths, sysctls and links always
// (cheap enough to poll), rules, routes and nftables tables when full.
func snapshot(full bool) map[string]string {
	s := map[string]string{}
	for _, p := range hostPaths {
		_, err := os.Lstat(p)
		s[p] = map[bool]string{true: "present", false: "absent"}[err == nil]
	}
	for _, k := range hostSysctls {
		b, err := os.ReadFile("/proc/sys/" + k)
		if err != nil {
			s["sysctl "+k] = "(none)"
			continue
		}
		s["sysctl "+k] = strings.TrimSpace(string(b))
	}
	// make test-kernels loads WireGuard in its emulated machines, never
	// on the machine itself.
	if mods, err := os.ReadFile("/proc/modules"); err == nil {
		s["module wireguard"] = map[bool]string{true: "loaded", false: "not loaded"}[strings.Contains("\n"+string(mods), "\nwireguard ")]
	}
	if links, err := os.ReadDir("/sys/class/net"); err == nil {
		for _, l := range links {
			s["link "+l.Name()] = "present"
		}
	}
	if !full {
		return s
	}
	for _, c := range [][]string{{"ip", "-o", "-4", "rule"}, {"ip", "-o", "-6", "rule"}, {"ip", "-o", "-4", "route", "show", "table", "all"}, {"nft", "list", "tables"}} {
		out, err := exec.Command(c[0], c[1:]...).Output()
		if err != nil {
			continue // a tool the machine lacks: nothing to compare
		}
		for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			if line = strings.Join(strings.Fields(line), " "); line != "" {
				s[strings.Join(c[:len(c)-1], " ")+": "+line] = "present"
			}
		}
	}
	return s
}
