package lab

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// A Kubernetes lab node's pods live in cgroups under /<lab prefix>-n<i>
// (kubelet's cgroupRoot) in every hierarchy, so that `lab down` finds and
// stops every container process, even those in pod network namespaces that
// have no name, and then removes the cgroups. Nothing else of the
// machine's cgroup trees is touched.

// cgroupMounts lists the mount points of the cgroup hierarchies.
func cgroupMounts() ([]string, error) {
	f, err := os.Open("/proc/self/mounts")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) >= 3 && (fs[2] == "cgroup" || fs[2] == "cgroup2") && !slices.Contains(out, fs[1]) {
			out = append(out, fs[1])
		}
	}
	return out, sc.Err()
}

// makeCgroupRoot creates name in every hierarchy, ready for kubelet.
func makeCgroupRoot(name string) error {
	mounts, err := cgroupMounts()
	if err != nil {
		return err
	}
	for _, m := range mounts {
		dir := filepath.Join(m, name)
		if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("creating cgroup %s: %w", dir, err)
		}
		// A v1 cpuset cgroup takes no task until it has CPUs and memory
		// nodes; give it its parent's.
		for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
			if v, err := os.ReadFile(filepath.Join(m, f)); err == nil {
				if err := os.WriteFile(filepath.Join(dir, f), v, 0o644); err != nil {
					return fmt.Errorf("setting %s of %s: %w", f, dir, err)
				}
			}
		}
	}
	return nil
}

// cgroupRoots lists the lab's cgroup directories: every top-level cgroup
// named prefix-… in every hierarchy.
func cgroupRoots(prefix string) []string {
	mounts, _ := cgroupMounts()
	var out []string
	for _, m := range mounts {
		ents, _ := os.ReadDir(m)
		for _, e := range ents {
			if e.IsDir() && strings.HasPrefix(e.Name(), prefix+"-") {
				out = append(out, filepath.Join(m, e.Name()))
			}
		}
	}
	return out
}

// cgroupPIDs lists the processes in the cgroups below roots.
func cgroupPIDs(roots []string) []int {
	var pids []int
	for _, r := range roots {
		_ = filepath.WalkDir(r, func(p string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || d.Name() != "cgroup.procs" {
				return nil
			}
			b, _ := os.ReadFile(p)
			for _, f := range strings.Fields(string(b)) {
				if pid, err := strconv.Atoi(f); err == nil && !slices.Contains(pids, pid) {
					pids = append(pids, pid)
				}
			}
			return nil
		})
	}
	return pids
}

// removeCgroups kills what is left in roots and removes them, deepest
// first. A cgroup goes only once its last task has exited, which takes
// the kernel a moment after SIGKILL: it retries for a few seconds.
func removeCgroups(roots []string) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		for _, pid := range cgroupPIDs(roots) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		var left []string
		for _, r := range roots {
			var dirs []string
			_ = filepath.WalkDir(r, func(p string, d fs.DirEntry, err error) error {
				if err == nil && d.IsDir() {
					dirs = append(dirs, p)
				}
				return nil
			})
			for i := len(dirs) - 1; i >= 0; i-- {
				if err := syscall.Rmdir(dirs[i]); err != nil && !errors.Is(err, syscall.ENOENT) {
					left = append(left, dirs[i])
				}
			}
		}
		if len(left) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("cgroups still busy after 10s: %s", strings.Join(left, ", "))
		}
		time.Sleep(100 * time.Millisecond)
	}
}
