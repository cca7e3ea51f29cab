package lab

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// A Kubernetes lab node is a network namespace plus a mount namespace of
// its own, held open by a "node root" process (twillctl lab node-root). In
// it, the directories a kubelet, containerd and twill's DaemonSet write to
// are the node's, not the machine's:
//
//	/run, /var/lib, /var/log, /opt   bind mounts of <node dir>/rootfs/...
//	/etc                             an overlay: the machine's /etc below,
//	                                 <node dir>/rootfs/etc.upper on top
//	/sys                             a sysfs of the node's network namespace,
//	                                 with the machine's cgroup mounts
//	/proc/sys/{vm,kernel}/...        read-only files holding the values
//	                                 kubelet's protectKernelDefaults checks
//
// so /etc/cni/net.d, /opt/cni/bin, /var/lib/kubelet, /var/lib/cni,
// /run/containerd, /run/twill and /run/xtables.lock exist per node, and the
// machine's stay untouched. Paths the node's processes need from the machine
// (the lab's state, the binaries, the images) that fall under one of those
// trees are cloned before and attached again after (open_tree/move_mount).
// Mounts are private: nothing propagates back to the machine, and they all
// vanish when the last process in the namespace exits.

// maskedTrees are replaced by the node's own directories.
var maskedTrees = []string{"/run", "/var/lib", "/var/log", "/opt"}

// kernelDefaults are the host sysctls kubelet insists on; with
// protectKernelDefaults it only checks them, against these files.
var kernelDefaults = map[string]string{
	"vm/overcommit_memory":      "1",
	"vm/panic_on_oom":           "0",
	"kernel/panic":              "10",
	"kernel/panic_on_oops":      "1",
	"kernel/keys/root_maxkeys":  "1000000",
	"kernel/keys/root_maxbytes": "25000000",
}

// NodeRootOptions say how to build a node's root.
type NodeRootOptions struct {
	// Dir is the node's directory; rootfs/ below it is created here.
	Dir string
	// Keep are paths of the machine the node's processes must still see
	// at the same place.
	Keep []string
	// ReadyFile is created once the mounts are in place.
	ReadyFile string
	// Hostname is the node's host name, set in the UTS namespace the
	// process was started in (node-root is started with CLONE_NEWUTS):
	// the Node's name, as on a real cluster. Empty: left alone.
	Hostname string
}

// RunNodeRoot builds the node's mounts in the calling process's mount
// namespace, which must be a private one made for it (twillctl lab
// node-root is started with CLONE_NEWNS), then blocks until ctx is done.
func RunNodeRoot(ctx context.Context, o NodeRootOptions) error {
	if err := setHostname(o.Hostname); err != nil {
		return err
	}
	if err := buildNodeRoot(o); err != nil {
		return err
	}
	if err := os.WriteFile(o.ReadyFile, nil, 0o644); err != nil {
		return err
	}
	<-ctx.Done()
	return nil
}

// setHostname names the node in its own UTS namespace, and refuses to in
// the machine's.
func setHostname(name string) error {
	if name == "" {
		return nil
	}
	self, err := os.Readlink("/proc/self/ns/uts")
	if err != nil {
		return fmt.Errorf("node-root: %w", err)
	}
	// The machine's: init's, or (where init's is not ours to read, in a
	// container) that of lab up, which started this process.
	machine, err := os.Readlink("/proc/1/ns/uts")
	if err != nil {
		machine, err = os.Readlink(fmt.Sprintf("/proc/%d/ns/uts", os.Getppid()))
	}
	if err != nil || self == machine {
		return errors.New("node-root: refusing to set the host name in the machine's own UTS namespace")
	}
	if err := unix.Sethostname([]byte(name)); err != nil {
		return fmt.Errorf("node-root: setting the host name %q: %w", name, err)
	}
	return nil
}

func buildNodeRoot(o NodeRootOptions) error {
	if self, err := os.Readlink("/proc/self/ns/mnt"); err == nil {
		if init, err := os.Readlink("/proc/1/ns/mnt"); err == nil && self == init {
			return errors.New("node-root: refusing to mount in the machine's own mount namespace")
		}
	}
	rootfs := filepath.Join(o.Dir, "rootfs")
	for _, d := range append(slices.Clone(maskedTrees), "/etc.upper", "/etc.work", "/sysctl") {
		if err := os.MkdirAll(filepath.Join(rootfs, d), 0o755); err != nil {
			return err
		}
	}
	c, err := cloneTrees(o, rootfs)
	if err != nil {
		return err
	}
	defer unix.Close(c.cgroups)
	// /etc: the machine's, with the node's changes on top.
	opts := fmt.Sprintf("lowerdir=/etc,upperdir=%s,workdir=%s", filepath.Join(rootfs, "etc.upper"), filepath.Join(rootfs, "etc.work"))
	if err := unix.Mount("overlay", "/etc", "overlay", 0, opts); err != nil {
		return fmt.Errorf("node-root: overlay on /etc: %w", err)
	}
	// The sysctl files, written before /run (which may hold the node's
	// directory) is replaced.
	for name, v := range kernelDefaults {
		f := filepath.Join(rootfs, "sysctl", strings.ReplaceAll(name, "/", "."))
		if err := os.WriteFile(f, []byte(v+"\n"), 0o444); err != nil {
			return err
		}
		if err := bindReadOnly(f, "/proc/sys/"+name); err != nil {
			return err
		}
	}
	return c.attach()
}

// clonedTree is a detached copy of a mount tree, to attach at path.
type clonedTree struct {
	path string
	fd   int
}

// clones are the trees a node root is made of, cloned before anything is
// hidden: the paths of the machine it must still see (keep), the node's
// own trees (once /run is replaced, the node's directory, often below
// /run, no longer resolves), and the cgroup hierarchies.
type clones struct {
	keep, trees []clonedTree
	cgroups     int
}

func cloneTrees(o NodeRootOptions, rootfs string) (*clones, error) {
	c := &clones{}
	for _, p := range o.Keep {
		if !underAny(p, maskedTrees) {
			continue
		}
		fd, err := unix.OpenTree(unix.AT_FDCWD, p, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_RECURSIVE)
		if err != nil {
			return nil, fmt.Errorf("node-root: cloning %s: %w", p, err)
		}
		c.keep = append(c.keep, clonedTree{p, fd})
	}
	for _, t := range maskedTrees {
		fd, err := unix.OpenTree(unix.AT_FDCWD, filepath.Join(rootfs, t), unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
		if err != nil {
			return nil, fmt.Errorf("node-root: cloning %s: %w", filepath.Join(rootfs, t), err)
		}
		c.trees = append(c.trees, clonedTree{t, fd})
	}
	fd, err := unix.OpenTree(unix.AT_FDCWD, "/sys/fs/cgroup", unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_RECURSIVE)
	if err != nil {
		return nil, fmt.Errorf("node-root: cloning /sys/fs/cgroup: %w", err)
	}
	c.cgroups = fd
	return c, nil
}

// attach mounts the node's trees over the machine's, the kept paths again
// on top, and a sysfs of this network namespace (the machine's lists the
// machine's interfaces) with the cgroup hierarchies runc and kubelet need.
func (c *clones) attach() error {
	for _, t := range c.trees {
		if err := unix.MoveMount(t.fd, "", unix.AT_FDCWD, t.path, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
			return fmt.Errorf("node-root: mounting the node's %s: %w", t.path, err)
		}
		unix.Close(t.fd)
	}
	for _, k := range c.keep {
		if err := os.MkdirAll(k.path, 0o755); err != nil {
			return fmt.Errorf("node-root: %w", err)
		}
		if err := unix.MoveMount(k.fd, "", unix.AT_FDCWD, k.path, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
			return fmt.Errorf("node-root: attaching %s again: %w", k.path, err)
		}
		unix.Close(k.fd)
	}
	if err := unix.Mount("sysfs", "/sys", "sysfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("node-root: sysfs: %w", err)
	}
	if err := unix.MoveMount(c.cgroups, "", unix.AT_FDCWD, "/sys/fs/cgroup", unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("node-root: attaching /sys/fs/cgroup: %w", err)
	}
	return nil
}

func bindReadOnly(src, dst string) error {
	if err := unix.Mount(src, dst, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("node-root: bind %s: %w", dst, err)
	}
	if err := unix.Mount("", dst, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
		return fmt.Errorf("node-root: read-only %s: %w", dst, err)
	}
	return nil
}

// underAny reports whether p is one of trees or below one.
func underAny(p string, trees []string) bool {
	p = filepath.Clean(p)
	for _, t := range trees {
		if p == t || strings.HasPrefix(p, t+"/") {
			return true
		}
	}
	return false
}
