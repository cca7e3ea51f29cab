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
// handshake is seen it is nudged once more, and left alone when bytes come
// from it after that.
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
	p.LastHandshakeTime, p.ReceiveBytes = time.Now(), 92
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
	if got := addrs(n.nudged[3:]); got != "10.244.2.0 10.244.3.0 10.244.4.0" {
		t.Fatalf("nudged %v, want node2's and node4's device addresses again, and node3's (its handshake seen)", n.nudged)
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
	// node3 answers: its session is confirmed, and it is followed no more.
	dev.mu.Lock()
	p = dev.peers[k3]
	p.ReceiveBytes += 32
	dev.peers[k3] = p
	dev.mu.Unlock()
	n.nw.followOnce(ctx, tunnelOf(n, DeviceName), t0.Add(retryGreeting+greetEvery))
	n.nw.followOnce(ctx, tunnelOf(n, DeviceName), t0.Add(greetFor+time.Second))
	n.nw.followOnce(ctx, tunnelOf(n, DeviceName), t0.Add(greetFor+3*time.Second))
	if len(n.nudged) != 6 {
		t.Fatalf("still following a confirmed peer, or after greetFor: %v", n.nudged)
	}
}

// A handshake is not a session both sides hold until bytes come from the
// peer after it: a peer whose handshake this side saw, and from which
// nothing came within confirmFor (its side lost the session, or never had
// it: this side would send into nothing until WireGuard's own timer, 15 s
// later), is put back and nudged, whichever side leads.
func TestOneSidedHandshakeIsPutBack(t *testing.T) {
	for _, lead := range []bool{true, false} {
		ctx := context.Background()
		n := newNode(t, `{"Type":"wireguard","Mode":"auto"}`, t.TempDir(), lease("10.244.1.0/24", "", "192.168.1.1", "", wgtypes.Key{}))
		k2 := keyAbove(t, n.pub, lead)
		if err := n.nw.Reconcile(ctx, []subnet.Lease{lease("10.244.2.0/24", "", "192.168.1.2", "", k2)}); err != nil {
			t.Fatal(err)
		}
		n.nudged = nil
		dev := n.devs.dev(DeviceName)
		dev.mu.Lock()
		p := dev.peers[k2]
		p.LastHandshakeTime, p.ReceiveBytes, p.TransmitBytes = time.Now(), 92, 148
		dev.peers[k2] = p
		dev.mu.Unlock()
		t0 := time.Now()
		tn := tunnelOf(n, DeviceName)
		n.nw.followOnce(ctx, tn, t0.Add(retryGreeting+time.Millisecond)) // due: the handshake is seen
		if addrs(n.nudged) != "10.244.2.0" {
			t.Fatalf("lead %v: nudged %v once the handshake was seen, want node2's device address", lead, n.nudged)
		}
		n.nw.followOnce(ctx, tn, t0.Add(retryGreeting+confirmFor/2))
		dev.mu.Lock()
		kept := dev.peers[k2].TransmitBytes == 148
		dev.mu.Unlock()
		if len(n.nudged) != 1 || !kept {
			t.Fatalf("lead %v: before confirmFor: nudged %v, peer kept %v", lead, n.nudged, kept)
		}
		n.nw.followOnce(ctx, tn, t0.Add(retryGreeting+confirmFor+2*time.Millisecond))
		dev.mu.Lock()
		putBack := dev.peers[k2].TransmitBytes == 0
		dev.mu.Unlock()
		if addrs(n.nudged) != "10.244.2.0 10.244.2.0" || !putBack {
			t.Fatalf("lead %v: nothing came within confirmFor: nudged %v, put back %v; want it put back and nudged", lead, n.nudged, putBack)
		}
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
// after rekeyRetry, one that leads it after 5 rekeyRetry: the bytes the peer
// sent tell nothing (it goes on sending on the old session until it
// learns the key), so they do not hold the node back.
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
	mark := func(k wgtypes.Key, handshake time.Time, rx, tx int64) {
		dev.mu.Lock()
		defer dev.mu.Unlock()
		p := dev.peers[k]
		p.LastHandshakeTime, p.ReceiveBytes, p.TransmitBytes = handshake, rx, tx
		dev.peers[k] = p
	}
	mark(led, time.Now().Add(-time.Minute), 4096, 148)
	mark(leading, time.Now().Add(-time.Minute), 4096, 148)
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
	// Neither has a handshake since, both still send on the old session:
	// the one the node leads is put back and nudged, the other is left to
	// its peer for longer.
	mark(led, time.Now().Add(-time.Minute), 8192, 148)
	mark(leading, time.Now().Add(-time.Minute), 8192, 148)
	n.nw.followOnce(ctx, tunnelOf(n, DeviceName), t0.Add(rekeyRetry+time.Millisecond))
	dev.mu.Lock()
	putBack, kept := dev.peers[led].TransmitBytes == 0, dev.peers[leading].TransmitBytes == 148
	dev.mu.Unlock()
	if addrs(n.nudged) != "10.244.2.0" || !putBack || !kept {
		t.Fatalf("after rekeyRetry: nudged %v, want the led peer's device address; led peer put back: %v; leading peer kept: %v", n.nudged, putBack, kept)
	}
	n.nw.followOnce(ctx, tunnelOf(n, DeviceName), t0.Add(5*rekeyRetry+2*time.Millisecond))
	dev.mu.Lock()
	putBack = dev.peers[leading].TransmitBytes == 0
	dev.mu.Unlock()
	if !slices.Contains(n.nudged, netip.MustParseAddr("10.244.3.0")) || !putBack {
		t.Fatalf("after 5 rekeyRetry: nudged %v, want the leading peer's device address too; it put back: %v", n.nudged, putBack)
	}
	// Both handshake: each is nudged once seen, and followed no more once
	// bytes come from it.
	shook := time.Now()
	mark(led, shook, 92, 92)
	mark(leading, shook, 92, 92)
	n.nw.followOnce(ctx, tunnelOf(n, DeviceName), t0.Add(5*rekeyRetry+greetEvery))
	before := len(n.nudged)
	if got := addrs(n.nudged[before-2:]); got != "10.244.2.0 10.244.3.0" {
		t.Fatalf("nudged %v once both handshakes were seen, want each once more", n.nudged)
	}
	mark(led, shook, 192, 92)
	mark(leading, shook, 192, 92)
	n.nw.followOnce(ctx, tunnelOf(n, DeviceName), t0.Add(5*rekeyRetry+2*greetEvery))
	n.nw.mu.Lock()
	left := len(n.nw.greeting[DeviceName])
	n.nw.mu.Unlock()
	if left != 0 || len(n.nudged) != before {
		t.Fatalf("%d peers still followed after their sessions were confirmed (nudged %v)", left, n.nudged)
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
