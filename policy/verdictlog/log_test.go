package verdictlog

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"io"
	"log/slog"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/twill-net/twill/policy"
)

// namer is a node's Enforcer as the log sees it.
type namer struct {
	rs   policy.Ruleset
	pods map[netip.Addr]string
	sel  map[string]policy.Selection
}

func (n namer) Ruleset() policy.Ruleset              { return n.rs }
func (n namer) PodByIP(a netip.Addr) string          { return n.pods[a] }
func (n namer) Selected(pod string) policy.Selection { return n.sel[pod] }

// ipv4 is an IPv4 packet's headers: src → dst, proto, destination port.
func ipv4(src, dst string, proto uint8, port uint16) []byte {
	b := make([]byte, 40)
	b[0], b[9] = 0x45, proto
	copy(b[12:], netip.MustParseAddr(src).AsSlice())
	copy(b[16:], netip.MustParseAddr(dst).AsSlice())
	binary.BigEndian.PutUint16(b[20:], 40000)
	binary.BigEndian.PutUint16(b[22:], port)
	return b
}

func ipv6(src, dst string, proto uint8, port uint16) []byte {
	b := make([]byte, 60)
	b[0], b[6] = 0x60, proto
	copy(b[8:], netip.MustParseAddr(src).AsSlice())
	copy(b[24:], netip.MustParseAddr(dst).AsSlice())
	binary.BigEndian.PutUint16(b[42:], port)
	return b
}

func testLog(size int) *Log {
	web := []policy.Rule{{Src: policy.Addr{Prefix: netip.MustParsePrefix("10.244.2.0/24")}, Proto: unix.IPPROTO_TCP, PortLo: 80, PortHi: 80,
		Verdict: policy.Return, Comment: "allow lab/web", Why: "lab/web spec.ingress[0]"}, {Verdict: policy.Drop, Comment: "deny ingress lab/b0"}}
	rs := policy.Ruleset{
		Sets: []policy.Set{{Name: policy.JumpMap("in", false), VMap: true, Elems: []netip.Addr{netip.MustParseAddr("10.244.1.7")},
			Jumps: []string{policy.ChainName("in", "lab/b0")}}},
		Chains: []policy.Chain{{Name: policy.ChainForward, Rules: []policy.Rule{{Dst: policy.Addr{VMap: policy.JumpMap("in", false)}, Verdict: policy.Continue}}},
			{Name: policy.ChainName("in", "lab/b0"), Rules: web}},
	}
	n := namer{rs: rs, pods: map[netip.Addr]string{netip.MustParseAddr("10.244.1.7"): "lab/b0", netip.MustParseAddr("10.244.2.5"): "lab/a0"},
		sel: map[string]policy.Selection{"lab/b0": {Ingress: []string{"lab/web"}}}}
	return &Log{Logger: slog.New(slog.NewJSONHandler(io.Discard, nil)), Node: "node1", Namer: n, Size: size}
}

// TestRecords: a logged packet becomes a record naming both pods, the
// port, and what decided: the rule that allowed, or the default deny and
// the policies of the isolated pod.
func TestRecords(t *testing.T) {
	l := testLog(0)
	l.Add("twill deny ingress lab/b0", ipv4("10.244.2.5", "10.244.1.7", unix.IPPROTO_TCP, 81), time.Now())
	l.Add("twill allow ingress", ipv4("10.244.2.5", "10.244.1.7", unix.IPPROTO_TCP, 80), time.Now())
	l.Add("twill deny egress lab/x", ipv6("fd00::1", "fd00::2", unix.IPPROTO_UDP, 53), time.Now())
	l.Add("something else", ipv4("10.244.2.5", "10.244.1.7", unix.IPPROTO_TCP, 80), time.Now())
	l.Add("twill deny ingress lab/b0", []byte{0x45, 0}, time.Now())
	recs, next := l.Since(0, "")
	if len(recs) != 3 || next != 3 {
		t.Fatalf("got %d records (next %d), want 3 (next 3): %+v", len(recs), next, recs)
	}
	d, a, v6 := recs[0], recs[1], recs[2]
	if d.Verdict != "denied" || d.SrcPod != "lab/a0" || d.DstPod != "lab/b0" || d.Port != 81 || d.Proto != "tcp" ||
		d.Policy != "deny ingress lab/b0: no rule of lab/web allows it" {
		t.Errorf("denied record %+v", d)
	}
	if a.Verdict != "allowed" || a.Policy != "lab/web spec.ingress[0]" || a.Port != 80 {
		t.Errorf("allowed record %+v, want lab/web spec.ingress[0]", a)
	}
	if v6.Src != "fd00::1" || v6.Proto != "udp" || v6.Port != 53 || v6.Direction != "egress" {
		t.Errorf("IPv6 record %+v", v6)
	}
	if n := l.lost.Load(); n != 2 {
		t.Errorf("lost %d, want 2 (a foreign prefix, a cut packet)", n)
	}
	if recs, _ := l.Since(1, "lab/a0"); len(recs) != 1 || recs[0].Seq != 2 {
		t.Errorf("since 1, pod lab/a0: %+v, want record 2", recs)
	}
}

// TestRing: the ring keeps the latest Size records; a reader behind it
// gets what is left, in order.
func TestRing(t *testing.T) {
	l := testLog(4)
	for i := range 10 {
		l.Add("twill deny ingress lab/b0", ipv4("10.244.2.5", "10.244.1.7", unix.IPPROTO_TCP, uint16(1000+i)), time.Now())
	}
	recs, next := l.Since(0, "")
	if len(recs) != 4 || recs[0].Seq != 7 || recs[3].Seq != 10 || next != 10 {
		t.Errorf("got %+v next %d, want records 7 to 10", recs, next)
	}
	if recs, next := l.Since(10, ""); len(recs) != 0 || next != 10 {
		t.Errorf("since the last: %+v next %d, want none", recs, next)
	}
	// A reader that read up to 500 from a twilld since restarted gets
	// the new one's records, not nothing for ever.
	if recs, next := l.Since(500, ""); len(recs) != 4 || next != 10 {
		t.Errorf("since 500 (a restarted twilld at 10): %d records, next %d; want the 4 kept, next 10", len(recs), next)
	}
}

// TestServe: GET /verdicts waits for a record when asked to, and ends with
// the seq to ask from next.
func TestServe(t *testing.T) {
	l := testLog(0)
	srv := httptest.NewServer(l)
	defer srv.Close()
	go func() {
		time.Sleep(100 * time.Millisecond)
		l.Add("twill deny ingress lab/b0", ipv4("10.244.2.5", "10.244.1.7", unix.IPPROTO_TCP, 81), time.Now())
	}()
	resp, err := srv.Client().Get(srv.URL + "/verdicts?since=0&wait=20s")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var lines []string
	for sc := bufio.NewScanner(resp.Body); sc.Scan(); {
		lines = append(lines, sc.Text())
	}
	if len(lines) != 2 || !strings.Contains(lines[0], `"dstPod":"lab/b0"`) || lines[1] != `{"next":1}` {
		t.Errorf("got %q, want one record then {\"next\":1}", lines)
	}
	var r Record
	if err := json.Unmarshal([]byte(lines[0]), &r); err != nil || r.Port != 81 {
		t.Errorf("record %q: %v", lines[0], err)
	}
	for _, q := range []string{"since=x", "wait=-1s", "wait=soon"} {
		rr := httptest.NewRecorder()
		l.ServeHTTP(rr, httptest.NewRequest("GET", "/verdicts?"+q, nil))
		if rr.Code != 400 || !strings.Contains(rr.Body.String(), strings.SplitN(q, "=", 2)[1]) {
			t.Errorf("%s: %d %q, want 400 naming the value", q, rr.Code, rr.Body.String())
		}
	}
}

func FuzzParseHeader(f *testing.F) {
	f.Add(ipv4("10.0.0.1", "10.0.0.2", unix.IPPROTO_TCP, 80))
	f.Add(ipv6("fd00::1", "fd00::2", unix.IPPROTO_UDP, 53))
	f.Add([]byte{0x4f})
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := parseHeader(b)
		if err == nil && (!h.src.IsValid() || !h.dst.IsValid()) {
			t.Fatalf("no error, but addresses %v %v", h.src, h.dst)
		}
	})
}
