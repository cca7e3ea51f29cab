package lab

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// ServeEcho answers on port, TCP and UDP: it echoes each line a TCP
// connection sends, for as long as the connection lives (one line for a
// probe, a heartbeat every 100 ms for lab hold), and each UDP datagram. It
// runs inside a pod namespace until ctx is done. Once it listens it
// creates readyFile (when given), so `lab up` knows the pod can be probed.
func ServeEcho(ctx context.Context, port int, readyFile string) error {
	l, err := net.Listen("tcp", fmt.Sprintf(":%d", port))
	if err != nil {
		return fmt.Errorf("listening on :%d: %w", port, err)
	}
	pc, err := net.ListenPacket("udp", fmt.Sprintf(":%d", port))
	if err != nil {
		l.Close()
		return fmt.Errorf("listening on udp :%d: %w", port, err)
	}
	if readyFile != "" {
		if err := os.WriteFile(readyFile, nil, 0o644); err != nil {
			l.Close()
			pc.Close()
			return fmt.Errorf("writing %s: %w", readyFile, err)
		}
	}
	return Echo(ctx, l, pc)
}

// echoIdle is how long an echo connection may stay silent.
const echoIdle = 30 * time.Second

// Echo serves l and pc (either may be nil) as ServeEcho does, until ctx is
// done; it closes both.
func Echo(ctx context.Context, l net.Listener, pc net.PacketConn) error {
	go func() {
		<-ctx.Done()
		if l != nil {
			l.Close()
		}
		if pc != nil {
			pc.Close()
		}
	}()
	if pc != nil {
		go func() {
			buf := make([]byte, 2048)
			for {
				n, from, err := pc.ReadFrom(buf)
				if err != nil {
					return
				}
				_, _ = pc.WriteTo(buf[:n], from)
			}
		}()
	}
	if l == nil {
		<-ctx.Done()
		return nil
	}
	for {
		c, err := l.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		go func() {
			defer c.Close()
			r := bufio.NewReader(c)
			for {
				_ = c.SetDeadline(time.Now().Add(echoIdle))
				line, err := r.ReadString('\n')
				if err != nil {
					return
				}
				if _, err := io.WriteString(c, line); err != nil {
					return
				}
			}
		}()
	}
}

// Probe connects to each target's echo server and reports, per target, ""
// for a correct echo or what went wrong. A target is an address, reached on
// port, or an address:port.
func Probe(targets []string, port int, timeout time.Duration) map[string]string {
	out := make(map[string]string, len(targets))
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, t := range targets {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res := probeOne(t, port, timeout)
			mu.Lock()
			out[t] = res
			mu.Unlock()
		}()
	}
	wg.Wait()
	return out
}

// ProbeTarget parses a probe target: an IP address (the port given
// elsewhere) or address:port.
func ProbeTarget(t string, port int) (netip.AddrPort, error) {
	if ap, err := netip.ParseAddrPort(t); err == nil {
		return ap, nil
	}
	ip, err := netip.ParseAddr(t)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("target %q: want an IP address or address:port", t)
	}
	return netip.AddrPortFrom(ip, uint16(port)), nil
}

func probeOne(t string, port int, timeout time.Duration) string {
	ap, err := ProbeTarget(t, port)
	if err != nil {
		return err.Error()
	}
	c, err := net.DialTimeout("tcp", ap.String(), timeout)
	if err != nil {
		return err.Error()
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(timeout))
	token := fmt.Sprintf("twill-lab-%d\n", time.Now().UnixNano())
	if _, err := io.WriteString(c, token); err != nil {
		return err.Error()
	}
	got, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err.Error()
	}
	if got != token {
		return fmt.Sprintf("echo mismatch: %q", got)
	}
	return ""
}

// Vantage is where probes start: a network namespace, by path.
type Vantage struct {
	Name  string
	NetNS string
}

// Target is an echo server to reach.
type Target struct {
	Name string
	Addr netip.AddrPort
}

// Result is the connectivity matrix: Errors[from][to] is "" when from
// reached to over TCP.
type Result struct {
	From   []Vantage
	To     []Target
	Errors map[string]map[string]string
	Failed int
}

// Check probes every pod from every pod, each source from inside its own
// namespace; in a Kubernetes lab also from every node, and the ClusterIP
// Service and the hostPort pod from everywhere.
func Check(ctx context.Context, s *State, binDir string) (Result, error) {
	if s.Kubernetes {
		return checkKube(ctx, s, binDir)
	}
	var from []Vantage
	var to []Target
	for _, p := range s.Pods {
		from = append(from, Vantage{Name: p.Name, NetNS: "/var/run/netns/" + p.NS})
		for i, a := range p.Addrs() {
			name := p.Name
			if i > 0 {
				name += "-v6" // a dual-stack pod's second address
			}
			to = append(to, Target{Name: name, Addr: netip.AddrPortFrom(a, EchoPort)})
		}
	}
	return Matrix(ctx, binDir, from, to), nil
}

// Matrix probes every target from every vantage point, running twillctl
// lab probe inside each vantage point's network namespace.
func Matrix(ctx context.Context, binDir string, from []Vantage, to []Target) Result {
	res := Result{From: from, To: to, Errors: map[string]map[string]string{}}
	var targets []string
	for _, t := range to {
		targets = append(targets, t.Addr.String())
	}
	type row struct {
		src  string
		errs map[string]string
		err  error
	}
	rows := make(chan row, len(from))
	sem := make(chan struct{}, 8)
	for _, v := range from {
		go func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			args := append([]string{"--net=" + v.NetNS, filepath.Join(binDir, "twill-lab"), "lab", "probe"}, targets...)
			out, err := exec.CommandContext(ctx, "nsenter", args...).Output()
			r := row{src: v.Name}
			if err == nil {
				err = json.Unmarshal(out, &r.errs)
			}
			r.err = err
			rows <- r
		}()
	}
	for range from {
		r := <-rows
		m := map[string]string{}
		for _, t := range to {
			switch {
			case r.err != nil:
				m[t.Name] = "probe failed: " + r.err.Error()
			default:
				m[t.Name] = r.errs[t.Addr.String()]
			}
			if m[t.Name] != "" {
				res.Failed++
			}
		}
		res.Errors[r.src] = m
	}
	return res
}

// Print writes the matrix as a table.
func (r Result) Print(w io.Writer) {
	// Columns as wide as the longest target name, from 11 up to 17
	// characters ("node1/hostport-v6", a dual-stack pod's second address).
	width := 11
	for _, t := range r.To {
		width = max(width, min(len(short(t.Name, 17)), 17))
	}
	fmt.Fprintf(w, "%-14s", "from \\ to")
	for _, t := range r.To {
		fmt.Fprintf(w, " %-*s", width, short(t.Name, width))
	}
	fmt.Fprintln(w)
	for _, src := range r.From {
		fmt.Fprintf(w, "%-14s", short(src.Name, 14))
		for _, dst := range r.To {
			cell := "ok"
			if r.Errors[src.Name][dst.Name] != "" {
				cell = "FAIL"
			}
			fmt.Fprintf(w, " %-*s", width, cell)
		}
		fmt.Fprintln(w)
	}
	for _, src := range r.From {
		for _, dst := range r.To {
			if e := r.Errors[src.Name][dst.Name]; e != "" {
				fmt.Fprintf(w, "%s -> %s (%s): %s\n", src.Name, dst.Name, dst.Addr, e)
			}
		}
	}
	fmt.Fprintf(w, "%d of %d pairs OK\n", len(r.From)*len(r.To)-r.Failed, len(r.From)*len(r.To))
}

// short is name abbreviated to at most n characters.
func short(name string, n int) string {
	name = strings.Replace(name, "-pod", "/p", 1)
	if len(name) > n {
		name = name[:n]
	}
	return name
}
