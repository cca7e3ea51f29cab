package verdictlog

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/twill-net/twill/policy"
)

// Record is one logged verdict.
type Record struct {
	Seq       uint64    `json:"seq"`
	Time      time.Time `json:"time"`
	Node      string    `json:"node"`
	Verdict   string    `json:"verdict"`   // "denied" or "allowed"
	Direction string    `json:"direction"` // "ingress" or "egress", of the pod the rule is for
	Src       string    `json:"src"`
	Dst       string    `json:"dst"`
	SrcPod    string    `json:"srcPod,omitempty"` // namespace/name, when a pod holds the address
	DstPod    string    `json:"dstPod,omitempty"`
	Proto     string    `json:"proto"`
	Port      uint16    `json:"port,omitempty"` // destination port (TCP, UDP, SCTP)
	// Policy is what decided: the rule that allowed ("ns/name
	// spec.ingress[0]"), or the isolated pod's default deny and the
	// policies that select it.
	Policy string `json:"policy"`
}

// header is what a log record's packet says.
type header struct {
	src, dst netip.Addr
	proto    uint8
	port     uint16
}

var errShort = errors.New("packet too short")

// parseHeader reads the network and transport headers of a logged packet.
func parseHeader(b []byte) (header, error) {
	var h header
	if len(b) < 1 {
		return h, errShort
	}
	var l4 []byte
	switch b[0] >> 4 {
	case 4:
		if len(b) < 20 {
			return h, errShort
		}
		ihl := int(b[0]&0x0f) * 4
		if ihl < 20 || len(b) < ihl {
			return h, fmt.Errorf("IPv4 header length %d: %w", ihl, errShort)
		}
		h.src, h.dst, h.proto = netip.AddrFrom4([4]byte(b[12:16])), netip.AddrFrom4([4]byte(b[16:20])), b[9]
		if off := binary.BigEndian.Uint16(b[6:8]) & 0x1fff; off == 0 {
			l4 = b[ihl:]
		}
	case 6:
		if len(b) < 40 {
			return h, errShort
		}
		h.src, h.dst, h.proto = netip.AddrFrom16([16]byte(b[8:24])), netip.AddrFrom16([16]byte(b[24:40])), b[6]
		l4 = b[40:]
	default:
		return h, fmt.Errorf("IP version %d", b[0]>>4)
	}
	switch h.proto {
	case unix.IPPROTO_TCP, unix.IPPROTO_UDP, unix.IPPROTO_SCTP:
		if len(l4) >= 4 {
			h.port = binary.BigEndian.Uint16(l4[2:4])
		}
	}
	return h, nil
}

// Namer names what a record's addresses and rule are: twilld's Enforcer.
type Namer interface {
	Ruleset() policy.Ruleset
	PodByIP(netip.Addr) string
	Selected(pod string) policy.Selection
}

// record builds the record of a logged packet from its prefix (the log
// rule's: "twill deny ingress ns/pod", "twill allow egress") and headers.
func record(n Namer, node, prefix string, h header, at time.Time) (Record, error) {
	words := strings.Fields(strings.TrimPrefix(prefix, "twill "))
	if len(words) < 2 || words[0] != "deny" && words[0] != "allow" || words[1] != "ingress" && words[1] != "egress" {
		return Record{}, fmt.Errorf("log prefix %q is not one of twill's policy table", prefix)
	}
	r := Record{Time: at, Node: node, Verdict: "denied", Direction: words[1], Src: h.src.String(), Dst: h.dst.String(),
		SrcPod: n.PodByIP(h.src), DstPod: n.PodByIP(h.dst), Proto: policy.ProtoName(h.proto), Port: h.port}
	pod, dir := r.DstPod, "in"
	if r.Direction == "egress" {
		pod, dir = r.SrcPod, "eg"
	}
	if words[0] == "deny" {
		if len(words) > 2 && len(prefix) < 127 {
			pod = words[2] // the chain's own pod, unless the kernel's limit cut it
		}
		sel := n.Selected(pod)
		by := sel.Ingress
		if dir == "eg" {
			by = sel.Egress
		}
		r.Policy = fmt.Sprintf("deny %s %s: no rule of %s allows it", r.Direction, pod, strings.Join(by, ", "))
		return r, nil
	}
	r.Verdict = "allowed"
	who := pod
	if who == "" {
		who = r.Dst
		if dir == "eg" {
			who = r.Src
		}
	}
	r.Policy = "no policy selects " + who + " for " + r.Direction
	t := policy.Evaluate(n.Ruleset(), policy.Packet{Src: h.src, Dst: h.dst, Proto: h.proto, Port: h.port})
	for _, s := range t.Steps {
		if s.Entry == policy.ChainName(dir, pod) && s.Verdict == policy.Return {
			r.Policy = s.Why
		}
	}
	return r, nil
}
