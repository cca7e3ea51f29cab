package wireguard

import (
	"context"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/twill-net/twill/subnet"
)

// A peer just added whose key is above the node's (the node leads) is
// nudged at once; while it has no handshake it is put back in the device
// and nudged again every retryGreeting, for greetFor at the most; once its
// handshake is done it is left alone.
func TestFollowsFirstHandshakes(t *testing.T) {
	ctx := context.Background()
	n := newNode(t, `{"Type":"wireguard","Mode":"auto"}`, t.TempDir(), lease("10.244.1.0/24", "", "192.168.1.1", "", wgtypes.Key{}))
	k2, k3, k4 := keyAbove(t, n.pub, true), keyAbove(t, n.pub, true), keyAbove(t, n.pub, true)
	if err := n.nw.Reconcile(ctx, []subnet.Lease{lease("10.244.2.0/24", "", "192.168.1.2", "", k2), lease("10.244.3.0/24", "", "192.168.1.3", "", k3),
		lease("10.244.4.0/24", "", "192.168.1.4", "", k4)}); err != nil {
		t.Fatal(err)
	}
	if len(n.nudged) != 3 {
		t.Fatalf("nudged %v, want every new peer", n.nudged)
	}
	dev := n.devs.dev(DeviceName)
	t0 := time.Now()
	n.nw.followOnce(ctx, tunnelOf(n, DeviceName), t0.Add(retryGreeting/2))
	if len(n.nudged) != 3 {
		t.Fatalf("nudged again before retryGreeting: %v", n.nudged)
	}
	// node3 completes its handshake; node4 has sent one, and this side
	// answered (both sent one at once: each waits for the other's data,
	// and the lead starts again); node2 has sent nothing.
	dev.mu.Lock()
	p := dev.peers[k3]
	p.LastHandshakeTime = time.Now()
	dev.peers[k3] = p
	p4 := dev.peers[k4]
	p4.ReceiveBytes = 148
	p4.TransmitBytes = 92
	dev.peers[k4] = p4
	p2 := dev.peers[k2]
	p2.TransmitBytes = 148 // a mark: a peer put back is a new one
	dev.peers[k2] = p2
	dev.mu.Unlock()
	n.nw.followOnce(ctx, tunnelOf(n, DeviceName), t0.Add(retryGreeting+time.Millisecond))
	if got := addrs(n.nudged[3:]); got != "10.244.2.0 10.244.4.0" {
		t.Fatalf("nudged %v, want node2's and node4's device addresses again", n.nudged)
	}
	dev.mu.Lock()
	putBack := dev.peers[k2].TransmitBytes == 0 && dev.peers[k4].TransmitBytes == 0
	_, kept3 := dev.peers[k3]
	dev.mu.Unlock()
	if !putBack || !kept3 {
		t.Fatalf("node2's and node4's peers put back: %v; node3's kept: %v", putBack, kept3)
	}
	if n.nw.drifted(ctx) {
		t.Fatal("the device differs from the record after a peer was put back")
	}
	n.nw.followOnce(ctx, tunnelOf(n, DeviceName), t0.Add(greetFor+time.Second))
	n.nw.followOnce(ctx, tunnelOf(n, DeviceName), t0.Add(greetFor+3*time.Second))
	if len(n.nudged) != 5 {
		t.Fatalf("still following after greetFor: %v", n.nudged)
	}
}

// A twill-wg from before the peers query (a keeper not yet updated) is
// followed by reading every peer: the peer without a handshake is put back
// and nudged again all the same.
func TestFollowsFirstHandshakesOnAnOlderTwillWG(t *testing.T) {
	ctx := context.Background()
	n := newNode(t, `{"Type":"wireguard","Mode":"auto"}`, t.TempDir(), lease("10.244.1.0/24", "", "192.168.1.1", "", wgtypes.Key{}))
	dev := n.devs.dev(DeviceName)
	dev.old = true
	k2 := keyAbove(t, n.pub, true)
	if err := n.nw.Reconcile(ctx, []subnet.Lease{lease("10.244.2.0/24", "", "192.168.1.2", "", k2)}); err != nil {
		t.Fatal(err)
	}
	dev.mu.Lock()
	p2 := dev.peers[k2]
	p2.TransmitBytes = 148 // a mark: a peer put back is a new one
	dev.peers[k2] = p2
	dev.mu.Unlock()
	n.nw.followOnce(ctx, tunnelOf(n, DeviceName), time.Now().Add(retryGreeting+time.Millisecond))
	dev.mu.Lock()
	putBack := dev.peers[k2].TransmitBytes == 0
	dev.mu.Unlock()
	if addrs(n.nudged) != "10.244.2.0 10.244.2.0" || !putBack {
		t.Fatalf("nudged %v, want node2's device address twice; put back: %v", n.nudged, putBack)
	}
	// The keeper is updated: its device serves the extensions' version,
	// and is asked by key from the next follow on, not at twilld's next
	// restart.
	dev.mu.Lock()
	dev.old = false
	dev.mu.Unlock()
	whole := func() int {
		dev.mu.Lock()
		defer dev.mu.Unlock()
		return dev.whole
	}
	before := whole()
	n.nw.followOnce(ctx, tunnelOf(n, DeviceName), time.Now().Add(3*retryGreeting)) // the peer is due again
	if got := whole(); got != before {
		t.Fatalf("the device, updated, was read whole %d more times: it serves the peers query now", got-before)
	}
}

// A peer whose key is below the node's leads: the node waits yieldFor
// before it nudges, and only if nothing came from the peer (the lead's
// handshake was dropped); a peer that sent a handshake is left to the
// lead; one that sent nothing is put back every retryGreeting.
func TestYieldsFirstHandshakeToTheLead(t *testing.T) {
	ctx := context.Background()
	n := newNode(t, `{"Type":"wireguard","Mode":"auto"}`, t.TempDir(), lease("10.244.1.0/24", "", "192.168.1.1", "", wgtypes.Key{}))
	k2, k3 := keyAbove(t, n.pub, false), keyAbove(t, n.pub, false)
	if err := n.nw.Reconcile(ctx, []subnet.Lease{lease("10.244.2.0/24", "", "192.168.1.2", "", k2), lease("10.244.3.0/24", "", "192.168.1.3", "", k3)}); err != nil {
		t.Fatal(err)
	}
	if len(n.nudged) != 0 {
		t.Fatalf("nudged %v at once, want none: the peers lead", n.nudged)
	}
	dev := n.devs.dev(DeviceName)
	t0 := time.Now()
	n.nw.followOnce(ctx, tunnelOf(n, DeviceName), t0.Add(yieldFor/2))
	if len(n.nudged) != 0 {
		t.Fatalf("nudged %v before yieldFor", n.nudged)
	}
	// node3's handshake got here (and was answered); node2's did not.
	dev.mu.Lock()
	p3 := dev.peers[k3]
	p3.ReceiveBytes, p3.TransmitBytes = 148, 92
	dev.peers[k3] = p3
	p2 := dev.peers[k2]
	p2.TransmitBytes = 148
	dev.peers[k2] = p2
	dev.mu.Unlock()
	n.nw.followOnce(ctx, tunnelOf(n, DeviceName), t0.Add(yieldFor+time.Millisecond))
	dev.mu.Lock()
	kept := dev.peers[k2].TransmitBytes == 148 && dev.peers[k3].TransmitBytes == 92
	dev.mu.Unlock()
	if addrs(n.nudged) != "10.244.2.0" || !kept {
		t.Fatalf("after yieldFor: nudged %v, want node2's device address alone; both peers kept as they were: %v", n.nudged, kept)
	}
	n.nw.followOnce(ctx, tunnelOf(n, DeviceName), t0.Add(yieldFor+retryGreeting+2*time.Millisecond))
	dev.mu.Lock()
	putBack2, kept3 := dev.peers[k2].TransmitBytes == 0, dev.peers[k3].TransmitBytes == 92
	dev.mu.Unlock()
	if addrs(n.nudged) != "10.244.2.0 10.244.2.0" || !putBack2 || !kept3 {
		t.Fatalf("after retryGreeting: nudged %v; node2's put back: %v; node3's (mid-handshake) kept: %v", n.nudged, putBack2, kept3)
	}
}

// The follower reads the device (every peer, holding lease events back)
// only when a fresh peer is due: to be nudged, put back or given up on.
func TestGreetingDue(t *testing.T) {
	t0 := time.Now()
	lead := greeting{since: t0, last: t0, lead: true, nudged: true}
	led := greeting{since: t0, last: t0}
	ledNudged := greeting{since: t0, last: t0.Add(yieldFor), nudged: true}
	for _, tc := range []struct {
		name string
		g    greeting
		at   time.Duration
		want bool
	}{
		{"lead, before retryGreeting", lead, retryGreeting - time.Millisecond, false},
		{"lead, at retryGreeting", lead, retryGreeting, true},
		{"led, before yieldFor", led, yieldFor - time.Millisecond, false},
		{"led, at yieldFor", led, yieldFor, true},
		{"led and nudged, before retryGreeting", ledNudged, yieldFor + retryGreeting - time.Millisecond, false},
		{"led and nudged, at retryGreeting", ledNudged, yieldFor + retryGreeting, true},
		{"past greetFor", greeting{since: t0, last: t0.Add(greetFor), lead: true}, greetFor + time.Millisecond, true},
	} {
		n := &Network{greeting: map[string]map[wgtypes.Key]greeting{DeviceName: {{1}: tc.g}}}
		if got := n.greetingDue(DeviceName, t0.Add(tc.at)); got != tc.want {
			t.Errorf("%s: due %v, want %v", tc.name, got, tc.want)
		}
		if n.greetingDue(DeviceNameV6, t0.Add(tc.at)) {
			t.Errorf("%s: due on a device with no fresh peer", tc.name)
		}
	}
}

// A node that rotates its key follows every peer's next handshake:
// WireGuard ended their sessions, and the node's own handshake may cross
// the peer's (each then drops the answer to its own, and both wait 5s).
// It sends nothing at once, as its peers do not know the key yet; a peer
// it leads with no handshake since the rotation is put back and nudged
// after rekeyRetry; a peer that leads is left to do so.
func TestRotationFollowsEveryPeersHandshake(t *testing.T) {
	ctx := context.Background()
	n := newNode(t, `{"Type":"wireguard","Mode":"auto"}`, t.TempDir(), lease("10.244.1.0/24", "", "192.168.1.1", "", wgtypes.Key{}))
	var led, leading wgtypes.Key // the node leads led whatever its key; leading leads it
	for i := range led {
		led[i] = 0xff
	}
	leading[len(leading)-1] = 1
	peers := []subnet.Lease{lease("10.244.2.0/24", "", "192.168.1.2", "", led), lease("10.244.3.0/24", "", "192.168.1.3", "", leading)}
	if err := n.nw.Reconcile(ctx, peers); err != nil {
		t.Fatal(err)
	}
	// Both sessions up for a while: handshakes done, data received.
	dev := n.devs.dev(DeviceName)
	mark := func(k wgtypes.Key, handshake time.Time, tx int64) {
		dev.mu.Lock()
		defer dev.mu.Unlock()
		p := dev.peers[k]
		p.LastHandshakeTime, p.ReceiveBytes, p.TransmitBytes = handshake, 4096, tx
		dev.peers[k] = p
	}
	mark(led, time.Now().Add(-time.Minute), 148)
	mark(leading, time.Now().Add(-time.Minute), 148)
	n.nw.followOnce(ctx, tunnelOf(n, DeviceName), time.Now().Add(greetFor+time.Second)) // the start's greetings end
	n.nudged = nil

	if err := n.nw.Rotate(); err != nil {
		t.Fatal(err)
	}
	if err := n.nw.Reconcile(ctx, peers); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	if len(n.nudged) != 0 {
		t.Fatalf("nudged %v at the rotation, before any peer knows the key", n.nudged)
	}
	n.nw.followOnce(ctx, tunnelOf(n, DeviceName), t0.Add(rekeyRetry/2))
	if len(n.nudged) != 0 {
		t.Fatalf("nudged %v before rekeyRetry", n.nudged)
	}
	// Neither has a handshake since: the one the node leads is put back
	// and nudged, the other is left to its peer.
	n.nw.followOnce(ctx, tunnelOf(n, DeviceName), t0.Add(rekeyRetry+time.Millisecond))
	dev.mu.Lock()
	putBack, kept := dev.peers[led].TransmitBytes == 0, dev.peers[leading].TransmitBytes == 148
	dev.mu.Unlock()
	if addrs(n.nudged) != "10.244.2.0" || !putBack || !kept {
		t.Fatalf("after rekeyRetry: nudged %v, want the led peer's device address; led peer put back: %v; leading peer kept: %v", n.nudged, putBack, kept)
	}
	// Both handshake: followed no more.
	mark(led, time.Now(), 92)
	mark(leading, time.Now(), 92)
	n.nw.followOnce(ctx, tunnelOf(n, DeviceName), t0.Add(3*retryGreeting))
	if len(n.nudged) != 1 {
		t.Fatalf("nudged %v after both handshakes", n.nudged)
	}
	n.nw.mu.Lock()
	left := len(n.nw.greeting[DeviceName])
	n.nw.mu.Unlock()
	if left != 0 {
		t.Fatalf("%d peers still followed after their handshakes", left)
	}
}

// A peer that rotated its key, seen by a lease event or a full pass, is
// greeted at once where the node leads, and put back after rekeyRetry
// already, as the rotating side may have crossed the greeting.
func TestPeerRotationPutsBackSooner(t *testing.T) {
	for _, full := range []bool{false, true} {
		ctx := context.Background()
		n := newNode(t, `{"Type":"wireguard","Mode":"auto"}`, t.TempDir(), lease("10.244.1.0/24", "", "192.168.1.1", "", wgtypes.Key{}))
		var old, rotated wgtypes.Key // the node leads rotated whatever its key
		old[len(old)-1] = 1
		for i := range rotated {
			rotated[i] = 0xff
		}
		if err := n.nw.Reconcile(ctx, []subnet.Lease{lease("10.244.2.0/24", "", "192.168.1.2", "", old)}); err != nil {
			t.Fatal(err)
		}
		n.nw.followOnce(ctx, tunnelOf(n, DeviceName), time.Now().Add(greetFor+time.Second))
		n.nudged = nil
		l := lease("10.244.2.0/24", "", "192.168.1.2", "", rotated)
		var err error
		if full {
			err = n.nw.Reconcile(ctx, []subnet.Lease{l})
		} else {
			err = n.nw.Update(ctx, []subnet.Lease{l}, nil)
		}
		if err != nil {
			t.Fatal(err)
		}
		t0 := time.Now()
		if addrs(n.nudged) != "10.244.2.0" {
			t.Fatalf("full pass %v: nudged %v, want the rotated peer at once", full, n.nudged)
		}
		n.nw.followOnce(ctx, tunnelOf(n, DeviceName), t0.Add(rekeyRetry+time.Millisecond))
		if addrs(n.nudged) != "10.244.2.0 10.244.2.0" {
			t.Fatalf("full pass %v: nudged %v after rekeyRetry, want the rotated peer put back and nudged again", full, n.nudged)
		}
	}
}

func addrs(as []netip.Addr) string {
	s := make([]string, len(as))
	for i, a := range as {
		s[i] = a.String()
	}
	slices.Sort(s)
	return strings.Join(s, " ")
}

func tunnelOf(n *node, name string) tunnel {
	for _, t := range n.b.tunnels {
		if t.name == name {
			return t
		}
	}
	panic(name)
}
