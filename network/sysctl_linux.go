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
