package desiredfile

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"unsafe"

	"golang.org/x/sys/unix"
)

// watch follows inotify events on the file's directory until ctx is done
// or the watch can no longer tell (the directory was removed or moved), and
// signals on every event that may concern the file.
func (k *Keeper) watch(ctx context.Context) error {
	dir := k.dirOf()
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		return fmt.Errorf("inotify: %w", err)
	}
	f := os.NewFile(uintptr(fd), "inotify") // non-blocking: reads use the poller
	defer f.Close()
	const mask = unix.IN_CREATE | unix.IN_DELETE | unix.IN_MOVED_FROM | unix.IN_MOVED_TO | unix.IN_CLOSE_WRITE |
		unix.IN_ATTRIB | unix.IN_MODIFY | unix.IN_DELETE_SELF | unix.IN_MOVE_SELF
	if _, err := unix.InotifyAddWatch(fd, dir, mask); err != nil {
		return fmt.Errorf("watching %s: %w", dir, err)
	}
	if dir != filepath.Dir(k.Path) {
		// The file's own directory is missing: the check re-creates it;
		// watch again once it exists.
		return fmt.Errorf("%s does not exist", filepath.Dir(k.Path))
	}
	stop := context.AfterFunc(ctx, func() { f.Close() })
	defer stop()
	base := filepath.Base(k.Path)
	buf := make([]byte, 64*(unix.SizeofInotifyEvent+unix.NAME_MAX+1))
	for {
		n, err := f.Read(buf)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("reading inotify events for %s: %w", dir, err)
		}
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
			name := ""
			if ev.Len > 0 {
				raw := buf[off+unix.SizeofInotifyEvent : off+unix.SizeofInotifyEvent+int(ev.Len)]
				for i, c := range raw {
					if c == 0 {
						raw = raw[:i]
						break
					}
				}
				name = string(raw)
			}
			off += unix.SizeofInotifyEvent + int(ev.Len)
			if ev.Mask&(unix.IN_DELETE_SELF|unix.IN_MOVE_SELF|unix.IN_IGNORED|unix.IN_Q_OVERFLOW) != 0 {
				return fmt.Errorf("%s was removed or moved", dir)
			}
			if name == base {
				k.signal()
			}
		}
	}
}
