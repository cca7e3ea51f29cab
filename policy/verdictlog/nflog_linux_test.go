package verdictlog

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/twill-net/twill/policy"
	"github.com/twill-net/twill/testsupport/netnstest"
)

// TestPrivilegedNFLOG: in a network namespace, a packet a log rule sends
// to group policy.LogGroup becomes a record; a second reader of the group
// is refused at Start, which is how twilld knows to write no log rule.
func TestPrivilegedNFLOG(t *testing.T) {
	netnstest.RequireRoot(t)
	name := netnstest.New(t, "vl")
	netnstest.IP(t, name, "link", "set", "lo", "up")
	for _, cmd := range [][]string{
		{"add", "table", "inet", "vltest"},
		{"add", "chain", "inet", "vltest", "out", "{ type filter hook output priority 0 ; }"},
		{"add", "rule", "inet", "vltest", "out", "udp", "dport", "9", "log", "prefix", `"twill deny egress x/a"`,
			"group", fmt.Sprint(policy.LogGroup), "snaplen", fmt.Sprint(policy.LogSnaplen)},
	} {
		if out, err := netnstest.Exec(name, "nft", cmd...); err != nil {
			t.Fatalf("nft %v: %v\n%s", cmd, err, out)
		}
	}
	h, err := ns.GetNS("/var/run/netns/" + name)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	l := testLog(0)
	l.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	l.NetNS = int(h.Fd())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	wait, err := l.Start(ctx)
	if err != nil {
		t.Fatal(err)
	}
	second := &Log{Logger: l.Logger, NetNS: int(h.Fd())}
	if w, err := second.Start(ctx); err == nil {
		t.Errorf("a second reader bound group %d: want it refused", policy.LogGroup)
		_ = w
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		_ = h.Do(func(ns.NetNS) error {
			c, err := net.Dial("udp", "127.0.0.1:9")
			if err == nil {
				_, _ = c.Write([]byte("x"))
				c.Close()
			}
			return nil
		})
		if recs, _ := l.Since(0, ""); len(recs) > 0 {
			r := recs[0]
			if r.Verdict != "denied" || r.Direction != "egress" || r.Dst != "127.0.0.1" || r.Port != 9 || r.Proto != "udp" ||
				!strings.Contains(r.Policy, "x/a") {
				t.Errorf("record %+v", r)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no record read from NFLOG in 30 s")
		}
		time.Sleep(100 * time.Millisecond)
	}
	cancel()
	if err := wait(); err != nil {
		t.Errorf("wait after cancel: %v", err)
	}
}
