package wireguard

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/twill-net/twill/backend"
	"github.com/twill-net/twill/subnet"
)

func TestUpdate(t *testing.T) {
	ctx := context.Background()
	n := newNode(t, `{"Type":"wireguard","Mode":"auto"}`, t.TempDir(), lease("10.244.1.0/24", "", "192.168.1.1", "", wgtypes.Key{}))
	if err := n.nw.Update(ctx, nil, nil); !errors.Is(err, backend.ErrFullReconcile) {
		t.Fatalf("Update before any Reconcile: %v, want ErrFullReconcile", err)
	}
	// Keys above the node's: it leads, and nudges them at once.
	k2, k3, k4 := keyAbove(t, n.pub, true), keyAbove(t, n.pub, true), keyAbove(t, n.pub, true)
	p2 := lease("10.244.2.0/24", "", "192.168.1.2", "", k2)
	p3 := lease("10.244.3.0/24", "", "192.168.1.3", "", k3)
	p4 := lease("10.244.4.0/24", "", "192.168.1.4", "", k4)
	if err := n.nw.Reconcile(ctx, []subnet.Lease{p2, p3}); err != nil {
		t.Fatal(err)
	}
	if err := n.nw.Update(ctx, []subnet.Lease{p4}, []subnet.Lease{p3}); err != nil {
		t.Fatal(err)
	}
	got := strings.Join(n.devs.dev(DeviceName).describe(), ";")
	if !strings.Contains(got, "192.168.1.2:51820") || !strings.Contains(got, "192.168.1.4:51820") || strings.Contains(got, "192.168.1.3") {
		t.Fatalf("peers after the update: %s", got)
	}
	if r := routeDsts(t, n.k, DeviceName); !slices.Equal(r, []string{"10.244.2.0/24", "10.244.4.0/24"}) {
		t.Fatalf("routes %v", r)
	}
	if fmt.Sprint(n.nudged) != "[10.244.2.0 10.244.3.0 10.244.4.0]" && fmt.Sprint(n.nudged) != "[10.244.3.0 10.244.2.0 10.244.4.0]" {
		t.Fatalf("nudged %v: every peer added, once", n.nudged)
	}
	// A rotation: the old key goes, the new one comes, the peer is nudged.
	n.nudged = nil
	k2b := keyAbove(t, n.pub, true)
	p2b := lease("10.244.2.0/24", "", "192.168.1.2", "", k2b)
	if err := n.nw.Update(ctx, []subnet.Lease{p2b}, nil); err != nil {
		t.Fatal(err)
	}
	got = strings.Join(n.devs.dev(DeviceName).describe(), ";")
	if strings.Contains(got, k2.String()[:6]) || !strings.Contains(got, k2b.String()[:6]) || fmt.Sprint(n.nudged) != "[10.244.2.0]" {
		t.Fatalf("after the rotation: peers %s, nudged %v", got, n.nudged)
	}
	// A key another lease holds, and this node's own key: the record
	// cannot settle them; the full Reconcile refuses them.
	if err := n.nw.Update(ctx, []subnet.Lease{lease("10.244.5.0/24", "", "192.168.1.5", "", k4)}, nil); !errors.Is(err, backend.ErrFullReconcile) {
		t.Fatalf("a shared key: %v", err)
	}
	if err := n.nw.Update(ctx, []subnet.Lease{lease("10.244.6.0/24", "", "192.168.1.6", "", n.pub)}, nil); !errors.Is(err, backend.ErrFullReconcile) {
		t.Fatalf("this node's key: %v", err)
	}
}

// FuzzIncrementalIsFull: any sequence of lease events applied by Update
// (falling back to Reconcile when it asks, as the daemon does) leaves the
// device and routes as one Reconcile of the final leases on a fresh node.
func FuzzIncrementalIsFull(f *testing.F) {
	f.Add([]byte{1, 2, 3, 0x81, 4, 0x42, 5})
	f.Add([]byte{0x10, 0x11, 0x90, 0x21, 0x31})
	keys := make([]wgtypes.Key, 8)
	for i := range keys {
		keys[i] = key(f)
	}
	f.Fuzz(func(t *testing.T, ops []byte) {
		ctx := context.Background()
		self := lease("10.244.100.0/24", "", "192.168.1.100", "", wgtypes.Key{})
		inc := newNode(t, `{"Type":"wireguard","Mode":"auto"}`, t.TempDir(), self)
		leases := map[int]subnet.Lease{}
		all := func() []subnet.Lease {
			var out []subnet.Lease
			for i := range 8 {
				if l, ok := leases[i]; ok {
					out = append(out, l)
				}
			}
			return out
		}
		if err := inc.nw.Reconcile(ctx, nil); err != nil {
			t.Fatal(err)
		}
		for _, op := range ops[:min(len(ops), 64)] {
			i, k := int(op&7), keys[int(op>>3)&7]
			var up, rm []subnet.Lease
			if op&0x80 != 0 {
				if l, ok := leases[i]; ok {
					rm = append(rm, l)
					delete(leases, i)
				}
			} else {
				l := lease(fmt.Sprintf("10.244.%d.0/24", i), "", fmt.Sprintf("192.168.1.%d", 10+int(op>>6)), "", k)
				leases[i] = l
				up = append(up, l)
			}
			if err := inc.nw.Update(ctx, up, rm); err != nil {
				if !errors.Is(err, backend.ErrFullReconcile) {
					t.Fatal(err)
				}
				if err := inc.nw.Reconcile(ctx, all()); err != nil {
					t.Fatal(err)
				}
			}
		}
		full := newNode(t, `{"Type":"wireguard","Mode":"auto"}`, t.TempDir(), self)
		if err := full.nw.Reconcile(ctx, all()); err != nil {
			t.Fatal(err)
		}
		a, b := inc.devs.dev(DeviceName).describe(), full.devs.dev(DeviceName).describe()
		if !slices.Equal(a, b) {
			t.Fatalf("incremental peers %v, full %v", a, b)
		}
		if ra, rb := routeDsts(t, inc.k, DeviceName), routeDsts(t, full.k, DeviceName); !slices.Equal(ra, rb) {
			t.Fatalf("incremental routes %v, full %v", ra, rb)
		}
	})
}

// A node adding more than maxNudges peers at once (its start in a large
// cluster) nudges none: its traffic starts the handshakes.
func TestNudgesBounded(t *testing.T) {
	n := newNode(t, `{"Type":"wireguard","Mode":"auto"}`, t.TempDir(), lease("10.244.255.0/24", "", "192.168.1.1", "", wgtypes.Key{}))
	var leases []subnet.Lease
	for i := range maxNudges + 1 {
		leases = append(leases, lease(fmt.Sprintf("10.244.%d.0/24", i), "", fmt.Sprintf("192.168.2.%d", i+1), "", keyAbove(t, n.pub, true)))
	}
	if err := n.nw.Reconcile(context.Background(), leases); err != nil {
		t.Fatal(err)
	}
	if len(n.devs.dev(DeviceName).describe()) != maxNudges+1 || len(n.nudged) != 0 {
		t.Fatalf("%d peers, %d nudged", len(n.devs.dev(DeviceName).describe()), len(n.nudged))
	}
	if err := n.nw.Reconcile(context.Background(), leases[:maxNudges]); err != nil {
		t.Fatal(err)
	}
	if err := n.nw.Reconcile(context.Background(), leases); err != nil || len(n.nudged) != 1 {
		t.Fatalf("one peer added back: %d nudged (%v)", len(n.nudged), err)
	}
}
