package etcd

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	grpcbackoff "google.golang.org/grpc/backoff"
	"google.golang.org/grpc/connectivity"
)

// reconnect bounds how long the client waits between attempts to reach an
// etcd that went away. gRPC's default backoff grows to two minutes: after a
// 30 s outage a node would hear of lease changes 9 to 15 s after etcd came
// back. Capped at a second, it is back within one.
var reconnect = grpc.WithConnectParams(grpc.ConnectParams{
	Backoff:           grpcbackoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
	MinConnectTimeout: 5 * time.Second,
})

// unreachableEvery is how often, while etcd cannot be reached, a line says
// so and why; firstWord is when the first such line comes at start-up.
const (
	unreachableEvery = 10 * time.Second
	firstWord        = 2 * time.Second
)

// connState is what Monitor last saw of the connection to etcd.
type connState struct {
	connected bool
	since     time.Time // when the current state began
	reason    string    // why etcd cannot be reached, when it cannot
	ever      bool      // connected at least once
}

// Monitor follows the client's connection to etcd until ctx is done. It
// logs once when etcd is lost and once when it is reached again, and while
// it cannot be reached, every 10 s, where and why. Connected reports it.
func (m *Manager) Monitor(ctx context.Context) error {
	conn := m.cli.ActiveConnection()
	endpoints := strings.Join(m.cli.Endpoints(), ",")
	state := conn.GetState()
	m.setConn(state == connectivity.Ready, "")
	// The first word comes soon: a node started with a wrong endpoint must
	// not sit silent.
	lastLog := time.Now().Add(firstWord - unreachableEvery)
	for {
		wait := unreachableEvery
		if !m.conn().ever {
			wait = firstWord
		}
		wctx, cancel := context.WithTimeout(ctx, wait)
		changed := conn.WaitForStateChange(wctx, state)
		cancel()
		if ctx.Err() != nil {
			return nil
		}
		if changed {
			state = conn.GetState()
		}
		if state == connectivity.Idle {
			conn.Connect() // an idle connection does not try by itself
		}
		ready := state == connectivity.Ready
		was := m.conn()
		switch {
		case ready && !was.connected:
			m.setConn(true, "")
			if was.ever {
				m.log.Info("reached etcd again", "endpoints", endpoints, "down_for", time.Since(was.since).Round(time.Millisecond))
			} else {
				m.log.Info("connected to etcd", "endpoints", endpoints)
			}
		case !ready && was.connected:
			reason := Unreachable(m.cli.Endpoints())
			m.setConn(false, reason)
			m.log.Warn("lost etcd; trying again every second", "endpoints", endpoints, "reason", reason)
			lastLog = time.Now()
		case !ready && time.Since(lastLog) >= unreachableEvery:
			reason := Unreachable(m.cli.Endpoints())
			m.setConn(false, reason)
			m.log.Warn("cannot reach etcd", "endpoints", endpoints, "reason", reason, "for", time.Since(was.since).Round(time.Second))
			lastLog = time.Now()
		}
	}
}

func (m *Manager) conn() connState {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.connState
}

func (m *Manager) setConn(connected bool, reason string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.connState.connected != connected || m.connState.since.IsZero() {
		m.connState.since = time.Now()
	}
	m.connState.connected = connected
	m.connState.ever = m.connState.ever || connected
	if reason != "" || connected {
		m.connState.reason = reason
	}
}

// Connected reports whether etcd can be reached and, if not, since when and
// why, in words for /readyz.
func (m *Manager) Connected() (bool, string) {
	c := m.conn()
	if c.connected {
		return true, ""
	}
	msg := fmt.Sprintf("etcd at %s unreachable for %s", strings.Join(m.cli.Endpoints(), ","), time.Since(c.since).Round(time.Second))
	if c.reason != "" {
		msg += ": " + c.reason
	}
	return false, msg
}

// Unreachable says why etcd cannot be reached, by dialling each endpoint
// directly: gRPC reports only that it is not connected.
func Unreachable(endpoints []string) string {
	var parts []string
	for _, ep := range endpoints {
		network, addr := "tcp", ep
		if u, err := url.Parse(ep); err == nil && u.Host != "" || err == nil && u.Path != "" {
			switch u.Scheme {
			case "unix", "unixs":
				network, addr = "unix", u.Host+u.Path
			default:
				addr = u.Host
			}
		}
		c, err := net.DialTimeout(network, addr, time.Second)
		if err != nil {
			parts = append(parts, err.Error())
			continue
		}
		c.Close()
		parts = append(parts, ep+": accepts connections, but no etcd answers there (TLS or auth settings?)")
	}
	return strings.Join(parts, "; ")
}

// clientDialOptions are the gRPC options twill's etcd clients use.
func clientDialOptions() []grpc.DialOption { return []grpc.DialOption{reconnect} }

// Reach waits up to timeout for the client to be connected to etcd, and
// otherwise returns an error naming the endpoints and why they cannot be
// reached (a bare "context deadline exceeded" names neither).
func Reach(ctx context.Context, cli *clientv3.Client, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	conn := cli.ActiveConnection()
	for {
		s := conn.GetState()
		if s == connectivity.Ready {
			return nil
		}
		if s == connectivity.Idle {
			conn.Connect()
		}
		if !conn.WaitForStateChange(ctx, s) {
			if ctx.Err() != nil && !errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return ctx.Err()
			}
			return fmt.Errorf("cannot reach etcd at %s: %s", strings.Join(cli.Endpoints(), ","), Unreachable(cli.Endpoints()))
		}
	}
}
