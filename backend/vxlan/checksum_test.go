package vxlan

import (
	"context"
	"strings"
	"testing"

	"github.com/twill-net/twill/subnet"
)

func TestTXChecksumWanted(t *testing.T) {
	for _, tt := range []struct {
		setting, release string
		on               bool
		why              string
	}{
		{"auto", "4.18.0-348.el8.x86_64", false, "kernel 4.18 is older than 5.7"},
		{"auto", "5.4.0-150-generic", false, "kernel 5.4 is older than 5.7"},
		{"auto", "5.6.19", false, "kernel 5.6"},
		{"auto", "5.7.0", true, "kernel 5.7 has the checksum fix"},
		{"auto", "5.10-rc1", true, "kernel 5.10"},
		{"auto", "6.1.0-18-amd64", true, "kernel 6.1"},
		{"auto", "6", true, `kernel release "6" not understood`},
		{"auto", "", true, `kernel release "" not understood`},
		{"on", "4.9.0", true, "TXChecksumOffload is on"},
		{"off", "6.1.0", false, "TXChecksumOffload is off"},
	} {
		on, why := txChecksumWanted(tt.setting, tt.release)
		if on != tt.on || !strings.Contains(why, tt.why) {
			t.Errorf("%s on %q: %v (%s), want %v (%s)", tt.setting, tt.release, on, why, tt.on, tt.why)
		}
	}
}

func TestNewTXChecksumOffload(t *testing.T) {
	for _, tt := range []struct{ in, want string }{
		{`{"Type":"vxlan","TXChecksumOffload":"maybe"}`, `Backend.TXChecksumOffload "maybe": must be "auto", "on" or "off"`},
		{`{"Type":"vxlan","TXChecksumOffload":""}`, `Backend.TXChecksumOffload "": must be`},
		{`{"Type":"vxlan","TXChecksumOffload":"OFF"}`, `Backend.TXChecksumOffload "OFF": must be`},
		{`{"Type":"vxlan","TXChecksumOffload":false}`, `Backend.TXChecksumOffload "false": must be a string`},
	} {
		if _, err := New(options(t, tt.in)); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: error %v, want %q", tt.in, err, tt.want)
		}
	}
	for _, s := range []string{"auto", "on", "off"} {
		if _, err := New(options(t, `{"Type":"vxlan","TXChecksumOffload":"`+s+`"}`)); err != nil {
			t.Errorf("%s: %v", s, err)
		}
	}
}

// With "off", the VTEP is created with the offload off, a change by hand
// shows as drift and the next reconcile sets it back; with "on" the same
// holds the other way.
func TestFakeTXChecksumOffload(t *testing.T) {
	ctx := context.Background()
	for _, tt := range []struct {
		setting string
		want    bool
	}{{"off", false}, {"on", true}} {
		t.Run(tt.setting, func(t *testing.T) {
			f := newFNode(t, `{"Type":"vxlan","TXChecksumOffload":"`+tt.setting+`"}`)
			peers := []subnet.Lease{lease("10.244.2.0/24", "192.168.1.2", "0a:00:00:00:00:02")}
			if err := f.nw.Reconcile(ctx, peers); err != nil {
				t.Fatal(err)
			}
			offload := func() bool {
				on, err := f.k.TXChecksum("twill.1")
				if err != nil {
					t.Fatal(err)
				}
				return on
			}
			if got := offload(); got != tt.want {
				t.Fatalf("twill.1 tx-checksum-ip-generic %v after start, want %v", got, tt.want)
			}
			if err := f.k.SetTXChecksum("twill.1", !tt.want); err != nil {
				t.Fatal(err)
			}
			if f.nw.deviceAsLeft() {
				t.Error("the link watch's check takes the changed offload for the device as left")
			}
			d, err := f.nw.Drift(ctx, peers)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(strings.Join(d.Wrong, "\n"), "tx-checksum-ip-generic") {
				t.Errorf("drift does not report the changed offload: %+v", d)
			}
			if err := f.nw.Reconcile(ctx, peers); err != nil {
				t.Fatal(err)
			}
			if got := offload(); got != tt.want {
				t.Fatalf("twill.1 tx-checksum-ip-generic %v after a reconcile, want %v", got, tt.want)
			}
			if !strings.Contains(f.log.String(), "set it back") {
				t.Errorf("no warning that the offload was set back:\n%s", f.log.String())
			}
		})
	}
}
