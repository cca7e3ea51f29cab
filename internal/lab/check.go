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

// ServeEcho answers every TCP connection on port by echoing one line. It
// runs inside a pod namespace until ctx is done. Once it listens it creates
// readyFile (when given), so `lab up` knows the pod can be probed.
func ServeEcho(ctx context.Context, port int, readyFile string) error {
	l, err := net.Listen("tcp", fmt.Sprintf(":%d", port))
	if err != nil {
		return fmt.Errorf("listening on :%d: %w", port, err)
	}
	if readyFile != "" {
		if err := os.WriteFile(readyFile, nil, 0o644); err != nil {
			l.Close()
			return fmt.Errorf("writing %s: %w", readyFile, err)
		}
	}
	go func() { <-ctx.Done(); l.Close() }()
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
			_ = c.SetDeadline(time.Now().Add(5 * time.Second))
			line, err := bufio.NewReader(c).ReadString('\n')
			if err == nil {
				_, _ = io.WriteString(c, line)
			}
		}()
	}
}

// Probe connects to each target's echo server and reports, per target, ""
// for a correct echo or what went wrong.
func Probe(targets []netip.Addr, port int, timeout time.Duration) map[netip.Addr]string {
	out := make(map[netip.Addr]string, len(targets))
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

func probeOne(t netip.Addr, port int, timeout time.Duration) string {
	c, err := net.DialTimeout("tcp", netip.AddrPortFrom(t, uint16(port)).String(), timeout)
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

// Result is the connectivity matrix: Errors[src][dst] is "" when src
// reached dst over TCP.
type Result struct {
	Pods   []Pod
	Errors map[string]map[string]string
	Failed int
}

// Check probes every pod from every pod, each source from inside its own
// namespace.
func Check(ctx context.Context, s *State, binDir string) (Result, error) {
	res := Result{Pods: s.Pods, Errors: map[string]map[string]string{}}
	var targets []string
	for _, p := range s.Pods {
		targets = append(targets, p.IP.String())
	}
	type row struct {
		src  string
		errs map[netip.Addr]string
		err  error
	}
	rows := make(chan row, len(s.Pods))
	sem := make(chan struct{}, 8)
	for _, p := range s.Pods {
		go func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			args := append([]string{"netns", "exec", p.NS, filepath.Join(binDir, "twillctl"), "lab", "probe", "--port", fmt.Sprint(EchoPort)}, targets...)
			out, err := exec.CommandContext(ctx, "ip", args...).Output()
			r := row{src: p.Name}
			if err == nil {
				err = json.Unmarshal(out, &r.errs)
			}
			r.err = err
			rows <- r
		}()
	}
	for range s.Pods {
		r := <-rows
		m := map[string]string{}
		for _, dst := range s.Pods {
			switch {
			case r.err != nil:
				m[dst.Name] = "probe failed: " + r.err.Error()
			default:
				m[dst.Name] = r.errs[dst.IP]
			}
			if m[dst.Name] != "" {
				res.Failed++
			}
		}
		res.Errors[r.src] = m
	}
	return res, nil
}

// Print writes the matrix as a table.
func (r Result) Print(w io.Writer) {
	fmt.Fprintf(w, "%-14s", "from \\ to")
	for _, p := range r.Pods {
		fmt.Fprintf(w, " %-11s", short(p.Name))
	}
	fmt.Fprintln(w)
	for _, src := range r.Pods {
		fmt.Fprintf(w, "%-14s", short(src.Name))
		for _, dst := range r.Pods {
			cell := "ok"
			if r.Errors[src.Name][dst.Name] != "" {
				cell = "FAIL"
			}
			fmt.Fprintf(w, " %-11s", cell)
		}
		fmt.Fprintln(w)
	}
	for _, src := range r.Pods {
		for _, dst := range r.Pods {
			if e := r.Errors[src.Name][dst.Name]; e != "" {
				fmt.Fprintf(w, "%s -> %s (%s): %s\n", src.Name, dst.Name, dst.IP, e)
			}
		}
	}
	fmt.Fprintf(w, "%d of %d pairs OK\n", len(r.Pods)*len(r.Pods)-r.Failed, len(r.Pods)*len(r.Pods))
}

func short(name string) string { return strings.Replace(name, "-pod", "/p", 1) }
