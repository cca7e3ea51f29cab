// Command layers is part of make lint: it fails when twill's production
// imports, drawn between top-level folders (backend, nl, subnet, daemon…),
// form a cycle, so that the folders stay layered with no import running
// back up; and when a package under internal/ imports twill code outside
// internal/, so that internal/ holds only ground-floor leaves any layer
// may use. Test files are not counted: a test may use helpers from above.
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strings"
)

const module = "github.com/twill-net/twill"

type pkg struct {
	ImportPath string
	Imports    []string
}

func main() {
	pkgs, err := list()
	if err != nil {
		fmt.Fprintln(os.Stderr, "layers:", err)
		os.Exit(2)
	}
	problems := check(pkgs)
	for _, p := range problems {
		fmt.Fprintln(os.Stderr, p)
	}
	if len(problems) > 0 {
		os.Exit(1)
	}
}

// list reads every package of the module with its non-test imports.
func list() ([]pkg, error) {
	var out bytes.Buffer
	cmd := exec.Command("go", "list", "-json=ImportPath,Imports", "./...")
	cmd.Stdout, cmd.Stderr = &out, os.Stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("go list: %w", err)
	}
	var pkgs []pkg
	dec := json.NewDecoder(&out)
	for {
		var p pkg
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			return pkgs, nil
		} else if err != nil {
			return nil, fmt.Errorf("go list's output: %w", err)
		}
		pkgs = append(pkgs, p)
	}
}

// folder is the top-level folder of one of the module's packages ("" for
// another module's).
func folder(path string) string {
	rest, ok := strings.CutPrefix(path, module+"/")
	if !ok {
		return ""
	}
	top, _, _ := strings.Cut(rest, "/")
	return top
}

func check(pkgs []pkg) []string {
	var problems []string
	edges := map[string]map[string][]string{} // from folder -> to folder -> "pkg imports pkg"
	for _, p := range pkgs {
		from := folder(p.ImportPath)
		for _, imp := range p.Imports {
			to := folder(imp)
			if to == "" || to == from {
				continue
			}
			if from == "internal" {
				problems = append(problems, fmt.Sprintf("%s imports %s: internal/ holds leaves that import nothing of twill's outside internal/", p.ImportPath, imp))
			}
			if edges[from] == nil {
				edges[from] = map[string][]string{}
			}
			edges[from][to] = append(edges[from][to], p.ImportPath+" imports "+imp)
		}
	}
	if cyc := cycle(edges); cyc != nil {
		msg := "top-level folders import each other in a cycle, " + strings.Join(cyc, " -> ") + ":"
		for i := range len(cyc) - 1 {
			msg += "\n  " + edges[cyc[i]][cyc[i+1]][0]
		}
		problems = append(problems, msg)
	}
	return problems
}

// cycle returns a cycle of the folder graph (its first folder repeated at
// the end), or nil; folders are visited in name order, so the answer is
// stable.
func cycle(edges map[string]map[string][]string) []string {
	const (
		unseen = iota
		open
		done
	)
	state := map[string]int{}
	var stack []string
	var visit func(n string) []string
	visit = func(n string) []string {
		state[n] = open
		stack = append(stack, n)
		for _, m := range sortedKeys(edges[n]) {
			switch state[m] {
			case open:
				i := slices.Index(stack, m)
				return append(slices.Clone(stack[i:]), m)
			case unseen:
				if c := visit(m); c != nil {
					return c
				}
			}
		}
		stack = stack[:len(stack)-1]
		state[n] = done
		return nil
	}
	for _, n := range sortedKeys(edges) {
		if state[n] == unseen {
			if c := visit(n); c != nil {
				return c
			}
		}
	}
	return nil
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
