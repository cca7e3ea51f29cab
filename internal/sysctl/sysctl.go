// Package sysctl sets kernel parameters, the one way twill does: under
// /proc/sys, which shows the parameters of the calling thread's network
// namespace for net/*, writing only a value that differs (so a read-only
// /proc/sys, as in an unprivileged container, is fine when the value is
// already right).
package sysctl

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"

	"github.com/containernetworking/plugins/pkg/ns"
)

// Get reads /proc/sys/<name> (slash-separated: "net/ipv4/ip_forward").
func Get(name string) (string, error) {
	b, err := os.ReadFile("/proc/sys/" + name)
	if err != nil {
		return "", fmt.Errorf("reading %s: %w", dotted(name), err)
	}
	return strings.TrimSpace(string(b)), nil
}

// Set sets /proc/sys/<name> to value unless it already has it.
func Set(name, value string) error {
	if cur, err := Get(name); err == nil && cur == value {
		return nil
	}
	if err := os.WriteFile("/proc/sys/"+name, []byte(value), 0o644); err != nil {
		if errors.Is(err, syscall.EROFS) {
			return fmt.Errorf("setting %s=%s: /proc/sys is read-only here (an unprivileged container): set it on the node: %w", dotted(name), value, err)
		}
		return fmt.Errorf("setting %s=%s: %w", dotted(name), value, err)
	}
	return nil
}

// SetIn is Set inside the network namespace at nsPath (for net/*).
func SetIn(nsPath, name, value string) error {
	return ns.WithNetNSPath(nsPath, func(ns.NetNS) error { return Set(name, value) })
}

func dotted(name string) string { return strings.ReplaceAll(name, "/", ".") }
