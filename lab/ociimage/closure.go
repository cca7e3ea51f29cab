package ociimage

import (
	"bufio"
	"fmt"
	"os/exec"
	"sort"
	"strings"
)

// MaintainerOnly are packages a Debian package depends on only for its
// maintainer scripts (which an image built from unpacked packages never
// runs): DebClosure leaves them out, and what only they need.
var MaintainerOnly = []string{"debconf", "cdebconf", "dpkg", "perl-base", "init-system-helpers", "install-info",
	"usrmerge", "usr-is-merged"}

// DebClosure returns pkgs and every package they need, Depends and
// Pre-Depends followed to the end as apt-cache reports them, taking the
// first choice of each alternative and the first provider of a virtual
// package, and leaving out skip. The result is sorted.
func DebClosure(pkgs, skip []string) ([]string, error) {
	return debClosure(pkgs, skip, aptDepends)
}

func debClosure(pkgs, skip []string, depends func([]string) (string, error)) ([]string, error) {
	seen := map[string]bool{}
	for _, s := range skip {
		seen[s] = true
	}
	var out, frontier []string
	add := func(p string) {
		if !seen[p] {
			seen[p] = true
			out = append(out, p)
			frontier = append(frontier, p)
		}
	}
	for _, p := range pkgs {
		add(p)
	}
	// Each round asks about the packages the last one found; a closure
	// of Debian packages is a few hundred at most.
	for round := 0; len(frontier) > 0; round++ {
		if round > 1000 {
			return nil, fmt.Errorf("dependencies of %v: no end after %d rounds", pkgs, round)
		}
		text, err := depends(frontier)
		if err != nil {
			return nil, err
		}
		frontier = nil
		deps, err := ParseDepends(text)
		if err != nil {
			return nil, err
		}
		for _, p := range sortedKeys(deps) {
			for _, d := range deps[p] {
				add(d)
			}
		}
	}
	sort.Strings(out)
	return out, nil
}

// ParseDepends reads `apt-cache depends` output (recommends, suggests and
// the negative relations turned off) into each package's needs: one name
// per Depends or Pre-Depends line, the first of each alternative group
// (lines starting " |"), the first provider listed under a virtual package
// (written <name>).
func ParseDepends(text string) (map[string][]string, error) {
	deps := map[string][]string{}
	var pkg string
	inAlt := false    // the last relation line started an alternative group
	wantProv := false // the last relation named a virtual package
	sc := bufio.NewScanner(strings.NewReader(text))
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		switch {
		case strings.TrimSpace(line) == "":
		case !strings.HasPrefix(line, " "):
			pkg, inAlt, wantProv = strings.TrimSpace(line), false, false
			if _, ok := deps[pkg]; !ok {
				deps[pkg] = nil
			}
		case strings.HasPrefix(line, "    "):
			// A provider of the virtual package named on the line above.
			if wantProv {
				deps[pkg] = append(deps[pkg], strings.TrimSpace(line))
				wantProv = false
			}
		default:
			kind, name, ok := strings.Cut(strings.TrimSpace(line), ":")
			kind = strings.TrimPrefix(kind, "|")
			if !ok || pkg == "" {
				return nil, fmt.Errorf("apt-cache depends, line %d: %q is neither a package nor a relation", n, line)
			}
			alt := strings.HasPrefix(strings.TrimLeft(line, " "), "|")
			chosen := inAlt // an earlier choice of this group was taken
			inAlt = alt
			wantProv = false
			if chosen || (kind != "Depends" && kind != "PreDepends") {
				continue
			}
			name = strings.TrimSpace(name)
			if strings.HasPrefix(name, "<") {
				wantProv = true
				continue
			}
			deps[pkg] = append(deps[pkg], name)
		}
	}
	return deps, sc.Err()
}

func aptDepends(pkgs []string) (string, error) {
	args := append([]string{"depends", "--no-recommends", "--no-suggests", "--no-conflicts", "--no-breaks",
		"--no-replaces", "--no-enhances"}, pkgs...)
	out, err := exec.Command("apt-cache", args...).Output()
	if err != nil {
		return "", fmt.Errorf("apt-cache depends %s: %w", strings.Join(pkgs, " "), err)
	}
	return string(out), nil
}

func sortedKeys(m map[string][]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
