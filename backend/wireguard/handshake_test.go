package wireguard

import (
	"context"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/twill-net/twill/subnet"
)

// A peer just added is nudged at once; while it has no handshake it is put
// back in the device and nudged again every retryGreeting, for greetFor at
// the most; once its handshake is done it is left alone.
func TestFollowsFirstHandshakes(t *testing.T) {
	ctx := context.Background()
	n := newNode(t, `{"Type":"wireguard","Mode":"auto"}`, t.TempDir(), lease("10.244.1.0/24", "", "192.168.1.1", "", wgtypes.Key{}))
	k2, k3 := key(t), key(t)
	if err := n.nw.Reconcile(ctx, []subnet.Lease{lease("10.244.2.0/24", "", "192.168.1.2", "", k2), lease("10.244.3.0/24", "", "192.168.1.3", "", k3)}); err != nil {
		t.Fatal(err)
	}
	if len(n.nudged) != 2 {
		t.Fatalf("nudged %v, want both new peers", n.nudged)
	}
	dev := n.devs.dev(DeviceName)
	t0 := time.Now()
	n.nw.followOnce(ctx, tunnelOf(n, DeviceName), t0.Add(retryGreeting/2))
	if len(n.nudged) != 2 {
		t.Fatalf("nudged again before retryGreeting: %v", n.nudged)
	}
	// node3 completes its handshake; node2 does not.
	dev.mu.Lock()
	p := dev.peers[k3]
	p.LastHandshakeTime = time.Now()
	dev.peers[k3] = p
	p2 := dev.peers[k2]
	p2.ReceiveBytes = 42 // a mark: a peer put back is a new one
	dev.peers[k2] = p2
	dev.mu.Unlock()
	n.nw.followOnce(ctx, tunnelOf(n, DeviceName), t0.Add(retryGreeting+time.Millisecond))
	if len(n.nudged) != 3 || n.nudged[2].String() != "10.244.2.0" {
		t.Fatalf("nudged %v, want node2's device address again", n.nudged)
	}
	dev.mu.Lock()
	putBack := dev.peers[k2].ReceiveBytes == 0
	_, kept3 := dev.peers[k3]
	dev.mu.Unlock()
	if !putBack || !kept3 {
		t.Fatalf("node2's peer put back: %v; node3's kept: %v", putBack, kept3)
	}
	if n.nw.drifted(ctx) {
		t.Fatal("the device differs from the record after a peer was put back")
	}
	n.nw.followOnce(ctx, tunnelOf(n, DeviceName), t0.Add(greetFor+time.Second))
	n.nw.followOnce(ctx, tunnelOf(n, DeviceName), t0.Add(greetFor+3*time.Second))
	if len(n.nudged) != 3 {
		t.Fatalf("still following after greetFor: %v", n.nudged)
	}
}

func tunnelOf(n *node, name string) tunnel {
	for _, t := range n.b.tunnels {
		if t.name == name {
			return t
		}
	}
	panic(name)
}
