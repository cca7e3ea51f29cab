package network

import (
	"fmt"
	"os"
	"strings"
)

// EnableForwarding turns on IP forwarding in the caller's network namespace
// for the families in use. The daemon needs it to route pod traffic.
func EnableForwarding(v4, v6 bool) error {
	if v4 {
		if err := writeSysctl("net/ipv4/ip_forward", "1"); err != nil {
			return err
		}
	}
	if v6 {
		if err := writeSysctl("net/ipv6/conf/all/forwarding", "1"); err != nil {
			return err
		}
	}
	return nil
}

// SetSysctl sets /proc/sys/<name> (slash-separated, such as
// "net/ipv4/conf/eth1/rp_filter") in the calling process's network
// namespace, writing only when the value differs.
func SetSysctl(name, value string) error { return writeSysctl(name, value) }

func writeSysctl(name, value string) error {
	path := "/proc/sys/" + name
	cur, err := os.ReadFile(path)
	if err == nil && strings.TrimSpace(string(cur)) == value {
		return nil
	}
	if err := os.WriteFile(path, []byte(value), 0o644); err != nil {
		return fmt.Errorf("setting %s=%s: %w", strings.ReplaceAll(name, "/", "."), value, err)
	}
	return nil
}
