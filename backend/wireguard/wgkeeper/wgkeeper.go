// Package wgkeeper is the protocol between twilld and a WireGuard device
// keeper (twill-wg keeper), and its client side: what twilld links to
// ask for a userspace device, without linking the device itself
// (package userspace, in twill-wg alone).
//
// A keeper runs userspace devices on request, in a process that lives
// apart from twilld: on Kubernetes, the kube-twill-wireguard DaemonSet,
// whose pods are not replaced when twilld's are (upgrades included), so
// the devices and pod traffic carry on while twilld restarts. twilld asks
// it for a device over a unix socket, one JSON line each way; a device
// lives until the keeper stops or the device's TUN link is deleted.
package wgkeeper

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"time"
)

// Request asks a keeper for a device; the keeper answers with a Reply.
type Request struct {
	Name   string
	Socket string
	MTU    int
}

// Reply is a keeper's answer: Error is empty when the device runs.
type Reply struct {
	Error string `json:",omitempty"`
}

// Ask asks the keeper at socket for a device.
func Ask(ctx context.Context, socket string, req Request) error {
	var d net.Dialer
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	c, err := d.DialContext(ctx, "unix", socket)
	if err != nil {
		return fmt.Errorf("asking the keeper at %s: %w", socket, err)
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	}
	b, _ := json.Marshal(req)
	if _, err := c.Write(append(b, '\n')); err != nil {
		return fmt.Errorf("asking the keeper at %s: %w", socket, err)
	}
	line, err := bufio.NewReader(c).ReadBytes('\n')
	if err != nil {
		return fmt.Errorf("asking the keeper at %s: %w", socket, err)
	}
	var rep Reply
	if err := json.Unmarshal(line, &rep); err != nil {
		return fmt.Errorf("the keeper at %s answered %q: %w", socket, line, err)
	}
	if rep.Error != "" {
		return fmt.Errorf("the keeper at %s: %s", socket, rep.Error)
	}
	return nil
}

// Answers reports whether a keeper serves socket.
func Answers(socket string) bool {
	c, err := net.DialTimeout("unix", socket, time.Second)
	if err != nil {
		return false
	}
	c.Close()
	return true
}
