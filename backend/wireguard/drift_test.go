package wireguard

import (
	"context"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/twill-net/twill/subnet"
)

// hookedDevice is a fakeDevice that runs hook once a Get has read it,
// before the Get returns.
type hookedDevice struct {
	*fakeDevice
	hook func()
}

func (h hookedDevice) Get(ctx context.Context) (*wgtypes.Device, error) {
	d, err := h.fakeDevice.Get(ctx)
	if h.hook != nil {
		h.hook()
	}
	return d, err
}

// TestNoDriftBesideALeaseEvent: a lease event applied while the drift
// poll reads the device back is not drift. Before the poll held the lock
// lease events take, the device read before the event was set against
// the record after it, and every poll during a burst of events asked for
// a full reconcile (450 ms at 5,000 peers).
func TestNoDriftBesideALeaseEvent(t *testing.T) {
	ctx := context.Background()
	n := newNode(t, `{"Type":"wireguard","Mode":"auto"}`, t.TempDir(), lease("10.244.1.0/24", "", "192.168.1.1", "", wgtypes.Key{}))
	p2 := lease("10.244.2.0/24", "", "192.168.1.2", "", key(t))
	if err := n.nw.Reconcile(ctx, []subnet.Lease{p2}); err != nil {
		t.Fatal(err)
	}
	if n.nw.drifted(ctx) {
		t.Fatal("drift right after a reconcile")
	}
	// The event: a lease added while the poll's read is under way.
	p3 := lease("10.244.3.0/24", "", "192.168.1.3", "", key(t))
	applied := make(chan error, 1)
	once := false
	n.b.devices.opener = func(name, impl string) (Device, error) {
		d, err := n.devs.open(name, impl)
		if err != nil || once {
			return d, err
		}
		return hookedDevice{fakeDevice: d.(*fakeDevice), hook: func() {
			once = true
			go func() { applied <- n.nw.Update(ctx, []subnet.Lease{p3}, nil) }()
			select { // the event waits for the poll, or is applied now
			case err := <-applied:
				applied <- err
			case <-time.After(300 * time.Millisecond):
			}
		}}, nil
	}
	if n.nw.drifted(ctx) {
		t.Error("a lease event applied beside the drift poll read as drift")
	}
	if err := <-applied; err != nil {
		t.Fatal(err)
	}
	if n.nw.drifted(ctx) {
		t.Error("drift after the lease event")
	}
	if got := len(n.devs.dev(DeviceName).describe()); got != 2 {
		t.Errorf("%d peers in the device, want 2", got)
	}
}
