// Command modalign keeps the Go modules that make test compiles on the
// same versions of their shared dependencies: twill's own module and the
// tools modules that build kube-apiserver and the other Kubernetes
// binaries, flanneld, etcdctl, crictl, CoreDNS and helm from the Go module proxy.
//
// A package compiles once per machine only when every module that builds
// it asks for the same version of it and of all it imports: the Go build
// cache then holds one compile for all of them. Left to their own go.mod
// files, the six modules picked different versions of client-go, grpc,
// protobuf or golang.org/x/net, and a fresh machine compiled about 130 MB
// of Go source (client-go, k8s.io/api, ...) once more for each (see
// Documentation/benchmarks.md, "One compile of each dependency").
//
// With no flag it checks (make lint runs it) and names each module whose
// versions differ; with -w it raises every lower one to the highest
// version any module uses (go get, or the replace directive's version
// where a module replaces it), until all agree.
package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"sort"
	"strings"

	"golang.org/x/mod/semver"
)

// builds are the modules make test builds in, and what it builds there.
var builds = []struct {
	dir     string
	targets []string
}{
	{".", []string{"./..."}},
	{"tools/kube", []string{
		"k8s.io/kubernetes/cmd/kube-apiserver", "k8s.io/kubernetes/cmd/kube-controller-manager",
		"k8s.io/kubernetes/cmd/kube-scheduler", "k8s.io/kubernetes/cmd/kubelet",
		"k8s.io/kubernetes/cmd/kube-proxy", "k8s.io/kubernetes/cmd/kubectl",
		"k8s.io/kubernetes/test/e2e", "k8s.io/kubernetes/test/images/agnhost",
		"k8s.io/kubernetes/test/images/regression-issue-74839",
	}},
	{"tools/flannel", []string{"github.com/flannel-io/flannel"}},
	{"tools/etcd", []string{"go.etcd.io/etcd/etcdctl/v3"}},
	{"tools/cri", []string{"sigs.k8s.io/cri-tools/cmd/crictl"}},
	{"tools/coredns", []string{"."}},
	{"tools/helm", []string{"helm.sh/helm/v3/cmd/helm"}},
}

// used is a module a build compiles packages of, at the version it
// compiles (its replacement's, when its go.mod replaces it).
type used struct {
	version  string
	replaced bool
}

func main() {
	write := flag.Bool("w", false, "raise every lower version to the highest one in use, in each module's go.mod")
	flag.Parse()
	for round := 0; ; round++ {
		uses, err := collect()
		if err != nil {
			fmt.Fprintln(os.Stderr, "modalign:", err)
			os.Exit(1)
		}
		lower := misaligned(uses)
		if len(lower) == 0 {
			return
		}
		if !*write || round == 5 {
			report(lower)
			os.Exit(1)
		}
		for dir, raise := range lower {
			if err := apply(dir, uses[dir], raise); err != nil {
				fmt.Fprintf(os.Stderr, "modalign: %s: %v\n", dir, err)
				os.Exit(1)
			}
		}
	}
}

// collect lists, for each build, the modules of the packages it compiles.
func collect() (map[string]map[string]used, error) {
	uses := map[string]map[string]used{}
	for _, b := range builds {
		args := append([]string{"list", "-deps", "-f",
			"{{with .Module}}{{.Path}} {{if .Replace}}{{.Replace.Version}} r{{else}}{{.Version}} -{{end}}{{end}}"}, b.targets...)
		out, err := goCmd(b.dir, args...)
		if err != nil {
			return nil, err
		}
		m := map[string]used{}
		for _, line := range strings.Split(out, "\n") {
			f := strings.Fields(line)
			if len(f) != 3 { // the main module, or one replaced by a directory: no version
				continue
			}
			m[f[0]] = used{version: f[1], replaced: f[2] == "r"}
		}
		uses[b.dir] = m
	}
	return uses, nil
}

// misaligned is, per build, each module it compiles at a lower version
// than another build does, with that highest version.
func misaligned(uses map[string]map[string]used) map[string]map[string]string {
	highest := map[string]string{}
	for _, m := range uses {
		for path, u := range m {
			if h, ok := highest[path]; !ok || semver.Compare(u.version, h) > 0 {
				highest[path] = u.version
			}
		}
	}
	lower := map[string]map[string]string{}
	for dir, m := range uses {
		for path, u := range m {
			if h := highest[path]; u.version != h {
				if lower[dir] == nil {
					lower[dir] = map[string]string{}
				}
				lower[dir][path] = h
			}
		}
	}
	return lower
}

func report(lower map[string]map[string]string) {
	var lines []string
	for dir, raise := range lower {
		for path, v := range raise {
			lines = append(lines, fmt.Sprintf("  %s: %s below %s", dir, path, v))
		}
	}
	sort.Strings(lines)
	fmt.Fprintf(os.Stderr, "modalign: these modules compile a lower version of a dependency than another does, so a fresh machine compiles it twice:\n%s\nfix: go run ./tools/modalign -w\n", strings.Join(lines, "\n"))
}

// requiresRE is go get's complaint when one raise needs another module
// higher than asked.
var requiresRE = regexp.MustCompile(`requires (\S+)@(\S+), not (\S+)@(\S+)`)

// apply raises the modules of one build: replace directives are edited,
// the rest go get, asking higher where go get says a raise needs it.
func apply(dir string, uses map[string]used, raise map[string]string) error {
	get := map[string]string{}
	for path, v := range raise {
		if uses[path].replaced {
			if _, err := goCmd(dir, "mod", "edit", "-replace", path+"="+path+"@"+v); err != nil {
				return err
			}
			continue
		}
		get[path] = v
	}
	for try := 0; len(get) > 0; try++ {
		args := []string{"get"}
		for path, v := range get {
			args = append(args, path+"@"+v)
		}
		_, err := goCmd(dir, args...)
		if err == nil {
			return nil
		}
		bumped := false
		for _, m := range requiresRE.FindAllStringSubmatch(err.Error(), -1) {
			if v, ok := get[m[1]]; ok && semver.Compare(m[2], v) > 0 {
				get[m[1]], bumped = m[2], true
			}
		}
		if !bumped || try == 10 {
			return err
		}
	}
	return nil
}

// goCmd runs go in dir as the builds do (no cgo, go.mod updated as
// needed), returning stdout; its error holds stderr.
func goCmd(dir string, args ...string) (string, error) {
	cmd := exec.Command("go", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=-mod=mod")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("go %s: %w\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return stdout.String(), nil
}
