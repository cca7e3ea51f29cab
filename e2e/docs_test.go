package e2e

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twill-net/twill/testsupport/kubetest"
	"github.com/twill-net/twill/testsupport/netnstest"
)

// The docs' shell commands are run as written, so that the docs cannot
// drift from the product. Every ```sh block in README.md and Documentation/
// carries a marker on the line before it:
//
//	<!-- doctest: <scenario> [on=node1,node2] [bg] [transcript] [fails] -->
//	<!-- doctest: skip -- <why it cannot run on one machine> -->
//
// A scenario is an environment the test builds (see docScenarios); its
// blocks run in the order of docFiles. In a block, each command (a line, or
// lines joined by a trailing backslash) runs with bash, from the
// repository's root; one ending in & (every one, with bg: a daemon the docs
// run in the foreground) runs in the background until the scenario ends. on= runs the block in those machines of the scenario. A
// transcript block holds "$ command" lines followed by the output they
// should print: the command is retried until every shown line appears
// (numbers may differ, "…" stands for anything). fails expects every command
// to fail.

// docFiles are the pages, in the order their blocks run.
var docFiles = []string{
	"README.md",
	"Documentation/backends/eni.md",
	"Documentation/getting-started.md",
	"Documentation/writing-a-backend.md",
	"Documentation/troubleshooting.md",
	"Documentation/kubernetes.md",
	"Documentation/network-policy.md",
	"Documentation/conformance.md",
	"Documentation/cni-plugin.md",
	"Documentation/configuration.md",
	"Documentation/etcd.md",
	"Documentation/backends/vxlan.md",
	"Documentation/backends/host-gw.md",
	"Documentation/backends/wireguard.md",
	"Documentation/benchmarks.md",
	"Documentation/migrating-from-flannel.md",
	"Documentation/kernels.md",
}

type docBlock struct {
	file       string
	line       int
	scenario   string
	on         []string
	transcript bool
	fails      bool
	bg         bool
	body       []string
}

var markerRE = regexp.MustCompile(`^<!--\s*doctest:\s*(.*?)\s*-->$`)

// docBlocks reads every marked block, and fails the test for a ```sh block
// without a marker.
func docBlocks(t *testing.T, root string) []docBlock {
	t.Helper()
	var blocks []docBlock
	for _, f := range docFiles {
		fh, err := os.Open(filepath.Join(root, f))
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(fh)
		var (
			n      int
			prev   string
			cur    *docBlock
			inside bool
		)
		for sc.Scan() {
			n++
			line := sc.Text()
			switch {
			case inside && strings.HasPrefix(line, "```"):
				inside = false
				if cur != nil {
					blocks = append(blocks, *cur)
					cur = nil
				}
			case inside:
				if cur != nil {
					cur.body = append(cur.body, line)
				}
			case strings.HasPrefix(line, "```"):
				inside = true
				m := markerRE.FindStringSubmatch(strings.TrimSpace(prev))
				if m == nil {
					if strings.TrimSpace(line) == "```sh" {
						t.Errorf("%s:%d: a ```sh block without a <!-- doctest: ... --> marker (run it, or say why it cannot run)", f, n)
					}
					break
				}
				b := docBlock{file: f, line: n}
				fields := strings.Fields(m[1])
				if fields[0] == "skip" {
					if !strings.Contains(m[1], "--") || strings.TrimSpace(m[1][strings.Index(m[1], "--")+2:]) == "" {
						t.Errorf("%s:%d: a skipped block must say why (doctest: skip -- <reason>)", f, n)
					}
					break
				}
				b.scenario = fields[0]
				for _, fl := range fields[1:] {
					switch {
					case strings.HasPrefix(fl, "on="):
						b.on = strings.Split(strings.TrimPrefix(fl, "on="), ",")
					case fl == "transcript":
						b.transcript = true
					case fl == "fails":
						b.fails = true
					case fl == "bg":
						b.bg = true
					default:
						t.Errorf("%s:%d: unknown doctest option %q", f, n, fl)
					}
				}
				cur = &b
			}
			prev = line
		}
		fh.Close()
	}
	return blocks
}

// commands splits a block into commands: continuation lines joined,
// comments and blank lines dropped.
func commands(body []string) []string {
	var out []string
	cur := ""
	for _, l := range body {
		if strings.HasSuffix(l, "\\") {
			cur += strings.TrimSuffix(l, "\\") + " "
			continue
		}
		cur += l
		if s := strings.TrimSpace(cur); s != "" && !strings.HasPrefix(s, "#") {
			out = append(out, s)
		}
		cur = ""
	}
	return out
}

// docEnv is where a scenario's commands run.
type docEnv struct {
	t    *testing.T
	root string
	env  []string
	// machine wraps a command to run it on a machine (nil: the host).
	machine func(name string, argv []string) []string
	bg      []*exec.Cmd
	logDir  string
}

func (e *docEnv) cmd(ctx context.Context, on, command string) *exec.Cmd {
	argv := []string{"bash", "-o", "pipefail", "-c", command}
	if on != "" {
		argv = e.machine(on, argv)
	}
	c := exec.CommandContext(ctx, argv[0], argv[1:]...)
	c.Dir = e.root
	c.Env = append(os.Environ(), e.env...)
	return c
}

// docMake is held while a scenario runs a make target.
var docMake sync.Mutex

func (e *docEnv) run(b docBlock) {
	t := e.t
	on := b.on
	if len(on) == 0 {
		on = []string{""}
	}
	where := fmt.Sprintf("%s:%d", b.file, b.line)
	if b.transcript {
		for _, m := range on {
			e.transcript(where, m, b.body)
		}
		return
	}
	for _, m := range on {
		for _, c := range commands(b.body) {
			if b.bg || strings.HasSuffix(c, "&") {
				cmd := e.cmd(context.Background(), m, strings.TrimSuffix(c, "&"))
				log, err := os.Create(filepath.Join(e.logDir, fmt.Sprintf("bg-%d.log", len(e.bg))))
				if err != nil {
					t.Fatal(err)
				}
				cmd.Stdout, cmd.Stderr = log, log
				if err := cmd.Start(); err != nil {
					t.Fatalf("%s: %s: %v", where, c, err)
				}
				e.bg = append(e.bg, cmd)
				t.Logf("%s [%s] %s (in the background; log %s)", where, m, c, log.Name())
				continue
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
			start := time.Now()
			// Scenarios run side by side; their make targets write the
			// same files (bin/, build/images/), one at a time.
			if strings.HasPrefix(c, "make ") {
				docMake.Lock()
			}
			out, err := e.cmd(ctx, m, c).CombinedOutput()
			if strings.HasPrefix(c, "make ") {
				docMake.Unlock()
			}
			cancel()
			t.Logf("%s [%s] %s (%s)", where, m, c, time.Since(start).Round(100*time.Millisecond))
			switch {
			case b.fails && err == nil:
				t.Errorf("%s: %q succeeded; the docs say it fails:\n%s", where, c, out)
			case !b.fails && err != nil:
				t.Errorf("%s: %q failed as written: %v\n%s", where, c, err, out)
			}
		}
	}
}

// transcript runs each "$ command" until the lines shown after it appear
// in its output.
func (e *docEnv) transcript(where, on string, body []string) {
	t := e.t
	type step struct {
		cmd  string
		want []string
	}
	var steps []step
	for _, l := range body {
		if c, ok := strings.CutPrefix(l, "$ "); ok {
			steps = append(steps, step{cmd: c})
		} else if len(steps) > 0 && strings.TrimSpace(l) != "" {
			steps[len(steps)-1].want = append(steps[len(steps)-1].want, l)
		}
	}
	for _, s := range steps {
		var out []byte
		deadline := time.Now().Add(60 * time.Second)
		for {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			out, _ = e.cmd(ctx, on, s.cmd).CombinedOutput()
			cancel()
			missing := missingLines(s.want, string(out))
			if len(missing) == 0 {
				t.Logf("%s [%s] $ %s: as shown", where, on, s.cmd)
				break
			}
			if time.Now().After(deadline) {
				t.Errorf("%s [%s] $ %s: the output lacks the lines shown\n%s\ngot:\n%s", where, on, s.cmd, strings.Join(missing, "\n"), out)
				break
			}
			time.Sleep(500 * time.Millisecond)
		}
	}
}

var digits = regexp.MustCompile(`[0-9]+`)

// missingLines lists the shown lines that no output line matches: spaces
// may differ, so may numbers, and "…" matches anything.
func missingLines(want []string, out string) []string {
	lines := strings.Split(out, "\n")
	var missing []string
	for _, w := range want {
		pat := regexp.QuoteMeta(strings.Join(strings.Fields(w), " "))
		pat = digits.ReplaceAllString(pat, `[0-9]+`)
		pat = strings.ReplaceAll(pat, "…", ".*")
		pat = strings.ReplaceAll(pat, " ", `\s+`)
		re := regexp.MustCompile("^" + pat + "$")
		if !slices.ContainsFunc(lines, func(l string) bool { return re.MatchString(strings.TrimSpace(l)) }) {
			missing = append(missing, w)
		}
	}
	return missing
}

// TestDocs runs every runnable command of the docs, by scenario, each
// scenario in its lane: those with Kubernetes labs in the Kubernetes labs'
// lane, the others beside them.
func TestDocs(t *testing.T) {
	t.Parallel()
	netnstest.RequireRoot(t)
	root := kubetest.Root(t)
	blocks := docBlocks(t, root)
	if t.Failed() {
		t.FailNow()
	}
	byScenario := map[string][]docBlock{}
	for _, b := range blocks {
		byScenario[b.scenario] = append(byScenario[b.scenario], b)
	}
	for name := range byScenario {
		if _, ok := docScenarios[name]; !ok {
			t.Errorf("doctest scenario %q is not one of %v", name, sortedKeys(docScenarios))
		}
	}
	for _, name := range sortedKeys(docScenarios) {
		t.Run(name, func(t *testing.T) {
			if kubeScenarios[name] {
				kubeLab(t)
			} else {
				beside(t)
			}
			if len(byScenario[name]) == 0 {
				t.Skipf("no docs block uses scenario %s", name)
			}
			e := &docEnv{t: t, root: root, logDir: t.TempDir()}
			docScenarios[name](t, e)
			t.Cleanup(func() {
				for _, c := range e.bg {
					if c.Process != nil {
						_ = c.Process.Kill()
						_ = c.Wait()
					}
				}
			})
			for _, b := range byScenario[name] {
				e.run(b)
			}
		})
	}
}

func sortedKeys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// kubeScenarios are the scenarios that start Kubernetes labs.
var kubeScenarios = map[string]bool{"kube": true, "kubeflannel": true}

// docScenarios prepare the environments. Every lab they make, the docs'
// own included, has namespaces named after this run and its state in the
// test's directory.
var docScenarios = map[string]func(t *testing.T, e *docEnv){
	// The lab pages: run on this machine, from the repository's root.
	"lab": func(t *testing.T, e *docEnv) {
		labEnv(t, e)
		// writing-a-backend.md builds into /tmp/directgw.
		if _, err := os.Stat("/tmp/directgw"); os.IsNotExist(err) {
			t.Cleanup(func() { os.RemoveAll("/tmp/directgw") })
		}
	},
	// The Kubernetes lab pages.
	"kube": func(t *testing.T, e *docEnv) { labEnv(t, e) },
	// The Kubernetes migration from flannel, on a lab up --flannel: the
	// page's kubectl is the lab's (twillctl lab kubectl), flanneld and
	// etcdctl are built.
	"kubeflannel": func(t *testing.T, e *docEnv) {
		labEnv(t, e)
		flanneldBinary(t)
		dir := t.TempDir()
		wrapper := "#!/bin/sh\nexec " + filepath.Join(e.root, "bin", "twillctl") + " lab kubectl \"$@\"\n"
		if err := os.WriteFile(filepath.Join(dir, "kubectl"), []byte(wrapper), 0o755); err != nil {
			t.Fatal(err)
		}
		e.env = append(e.env, "PATH="+dir+":"+os.Getenv("PATH"))
	},
	// The etcd quickstart.
	"etcd": func(t *testing.T, e *docEnv) { bareLab(t, e, "qs") },
	// The flannel migration: the same three machines, with flanneld (built
	// from the Go module proxy: tools/flannel) on the PATH.
	"flannel": func(t *testing.T, e *docEnv) {
		bareLab(t, e, "fl")
		e.onPath(filepath.Dir(flanneldBinary(t)))
	},
	// etcd with TLS and RBAC: the quickstart's machines, with etcdctl
	// (built from the Go module proxy: tools/etcd) on the PATH.
	"etcdauth": func(t *testing.T, e *docEnv) {
		bareLab(t, e, "ea")
		e.onPath(filepath.Dir(builtTool(t, "etcd", "etcdctl")))
		t.Cleanup(func() { os.RemoveAll("/tmp/twill-etcd-pki") })
	},
}

// onPath puts dir first on the scenario's PATH.
func (e *docEnv) onPath(dir string) {
	for i, v := range e.env {
		if p, ok := strings.CutPrefix(v, "PATH="); ok {
			e.env[i] = "PATH=" + dir + ":" + p
		}
	}
}

// bareLab makes three bare machines on 10.0.0.0/24 (node1 is the etcd
// host), each with a root of its own, so the commands' paths
// (/var/lib/twill-etcd, /run/twill) are the machines'.
func bareLab(t *testing.T, e *docEnv, name string) {
	labEnv(t, e)
	bin := binaries(t)
	up := exec.Command(bin+"/twillctl", "lab", "up", "--bare", "--nodes", "3", "--underlay-cidr", "10.0.0.0/24", "--name", name)
	up.Dir, up.Env = e.root, append(os.Environ(), e.env...)
	if out, err := up.CombinedOutput(); err != nil {
		t.Fatalf("lab up --bare: %v\n%s", err, out)
	}
	e.env = append(e.env, "PATH="+filepath.Join(e.root, "bin")+":"+os.Getenv("PATH"))
	e.machine = func(node string, argv []string) []string {
		return append([]string{bin + "/twillctl", "lab", "exec", "--name", name, node, "--"}, argv...)
	}
}

// labEnv gives the scenario's labs namespaces of this run and scenario
// (scenarios run side by side, and their pages use the same lab names) and
// a state root of the test's, and removes them when it ends.
func labEnv(t *testing.T, e *docEnv) string {
	state := t.TempDir()
	prefix := "tw" + netnstest.RunID() + "d" + filepath.Base(t.Name())
	e.env = append(e.env, "TWILL_LAB_STATE_ROOT="+state, "TWILL_LAB_NETNS_PREFIX="+prefix)
	bin := binaries(t)
	t.Cleanup(func() {
		ents, _ := os.ReadDir(state)
		for _, d := range ents {
			down := exec.Command(bin+"/twillctl", "lab", "down", "--name", d.Name(), "--state-root", state, "--netns-prefix", prefix)
			if out, err := down.CombinedOutput(); err != nil {
				t.Errorf("lab down %s: %v\n%s", d.Name(), err, out)
			}
		}
	})
	return state
}
