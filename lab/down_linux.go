package lab

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// namespaces lists the namespaces whose name starts with prefix + "-".
func namespaces(prefix string) ([]string, error) {
	out, err := exec.Command("ip", "netns", "list").CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("ip netns list: %w: %s", err, out)
	}
	var names []string
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) > 0 && strings.HasPrefix(f[0], prefix+"-") {
			names = append(names, f[0])
		}
	}
	return names, nil
}

// alive reports whether a process runs: it exists and is not a zombie (a
// process that exited but that nobody reaped, which is every orphan of
// the lab's where PID 1 does not reap).
func alive(pid int) bool {
	if syscall.Kill(pid, 0) != nil {
		return false
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// pid (comm) state ...: comm may hold spaces and parentheses.
	i := bytes.LastIndexByte(stat, ')')
	return i < 0 || i+2 >= len(stat) || stat[i+2] != 'Z'
}

// pidsIn lists the processes whose network namespace is the named one:
// processes living in a lab's namespace are the lab's.
func pidsIn(ns string) []int {
	var want unix.Stat_t
	if err := unix.Stat("/var/run/netns/"+ns, &want); err != nil {
		return nil
	}
	return processes(func(pid int) bool {
		var st unix.Stat_t
		return unix.Stat(fmt.Sprintf("/proc/%d/ns/net", pid), &st) == nil && st.Ino == want.Ino && st.Dev == want.Dev
	})
}

// processes lists the PIDs in /proc, other than this process, that match
// keeps.
func processes(keep func(pid int) bool) []int {
	ents, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range ents {
		var pid int
		if _, err := fmt.Sscan(e.Name(), &pid); err != nil || pid == os.Getpid() {
			continue
		}
		if keep(pid) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// Down removes a lab: it stops the processes in the lab's namespaces (by
// PID: SIGTERM, then SIGKILL after 5s), deletes the namespaces and the
// state directory. It works from what exists, not only from the recorded
// state, so a lab whose `up` was killed half-way is removed as well.
func Down(stateRoot, name, netnsPrefix string) error {
	if !nameRE.MatchString(name) {
		return fmt.Errorf("--name %q: use 1 to 8 lowercase letters or digits", name)
	}
	nss, err := namespaces(NetnsPrefix(netnsPrefix, name))
	if err != nil {
		return err
	}
	cgroups := cgroupRoots(NetnsPrefix(netnsPrefix, name))
	dir := Dir(stateRoot, name)
	// A process started just before lab up was killed may be on its way
	// into a namespace when the first scan runs: scan again after each
	// round of stopping, until a scan finds nothing new (bounded).
	stopped := map[int]bool{}
	for round := 0; round < 4; round++ {
		var pids []int
		for _, pid := range labPIDs(stateRoot, name, dir, nss, cgroups) {
			if !stopped[pid] {
				pids = append(pids, pid)
				stopped[pid] = true
			}
		}
		if len(pids) == 0 {
			break
		}
		stop(pids)
	}
	var errs []error
	if err := removeCgroups(cgroups); err != nil {
		errs = append(errs, err)
	}
	// Pods first, then nodes, then the underlay (reverse of creation).
	for i := len(nss) - 1; i >= 0; i-- {
		if out, err := exec.Command("ip", "netns", "del", nss[i]).CombinedOutput(); err != nil && !strings.Contains(string(out), "No such file") {
			errs = append(errs, fmt.Errorf("ip netns del %s: %w: %s", nss[i], err, out))
		}
	}
	if err := os.RemoveAll(Dir(stateRoot, name)); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// labPIDs lists the lab's processes: those in its namespaces, in its
// cgroups, and those it started that carry its mark.
func labPIDs(stateRoot, name, dir string, nss, cgroups []string) []int {
	var pids []int
	add := func(pid int) {
		if !contains(pids, pid) {
			pids = append(pids, pid)
		}
	}
	for _, ns := range nss {
		for _, pid := range pidsIn(ns) {
			add(pid)
		}
	}
	// A Kubernetes lab's containers live in pod namespaces that have no
	// name; they are found through the cgroups the lab made for them.
	for _, pid := range cgroupPIDs(cgroups) {
		add(pid)
	}
	// A recorded process whose namespace mount is already gone (a node
	// deleted by hand, an interrupted down) lives on in an unnamed
	// namespace the scans above cannot see; so does one started just
	// before lab up was killed, not yet recorded. Every process the lab
	// starts carries the lab's mark in its environment, which tells it
	// from an unrelated process (one that reused a recorded PID, or a
	// user's tail of a lab log).
	for _, pid := range markedPIDs(dir) {
		add(pid)
	}
	if s, err := Load(stateRoot, name); err == nil {
		for _, p := range s.Processes {
			if cmdlineMentions(p.PID, s.Dir) {
				add(p.PID)
			}
		}
	}
	return pids
}

// stop stops processes by PID: SIGTERM, then SIGKILL after 5s.
func stop(pids []int) {
	for _, pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGTERM)
	}
	deadline := time.Now().Add(5 * time.Second)
	for _, pid := range pids {
		for alive(pid) && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
		if alive(pid) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// labMark is the environment variable every process a lab starts carries:
// the lab's state directory.
const labMark = "TWILL_LAB_DIR"

// markedPIDs lists the live processes marked as started by the lab whose
// state directory is dir.
func markedPIDs(dir string) []int {
	mark := []byte(labMark + "=" + dir + "\x00")
	return processes(func(pid int) bool {
		env, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
		return err == nil && bytes.Contains(env, mark) && alive(pid)
	})
}

// cmdlineMentions reports whether a live process's command line contains s.
func cmdlineMentions(pid int, s string) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	return err == nil && strings.Contains(string(b), s)
}

func contains(xs []int, x int) bool {
	for _, y := range xs {
		if x == y {
			return true
		}
	}
	return false
}
