package network

import "github.com/twill-net/twill/internal/sysctl"

// EnableForwarding turns on IP forwarding in the caller's network namespace
// for the families in use. The daemon needs it to route pod traffic.
func EnableForwarding(v4, v6 bool) error {
	if v4 {
		if err := sysctl.Set("net/ipv4/ip_forward", "1"); err != nil {
			return err
		}
	}
	if v6 {
		if err := sysctl.Set("net/ipv6/conf/all/forwarding", "1"); err != nil {
			return err
		}
	}
	return nil
}
