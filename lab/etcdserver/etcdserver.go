// Package etcdserver runs a single-member etcd inside the process, for the
// lab, the tests and the benchmarks. It is real etcd
// (go.etcd.io/etcd/server/v3/embed), not a fake.
package etcdserver

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
)

// Config says where the member keeps data and listens.
type Config struct {
	Dir string
	// ClientURLs are listened on and advertised, e.g. http://10.0.0.1:2379
	// and unix:///run/lab/etcd.sock.
	ClientURLs []string
	PeerURL    string // default: 127.0.0.1 on a free port
	// LogLevel is etcd's own (debug, info, warn, error, panic, fatal);
	// default error.
	LogLevel string
	// SnapshotCount and the quota are left at etcd's defaults.

	// CertFile and KeyFile are the serving certificate for https client
	// URLs; with ClientCertAuth, clients must present a certificate
	// TrustedCAFile signed, and (once auth is enabled) its common name is
	// their etcd user name.
	CertFile, KeyFile, TrustedCAFile string
	ClientCertAuth                   bool
}

// Server is a running member.
type Server struct {
	e *embed.Etcd
}

// Start launches the member and waits until it serves, or until ctx ends.
func Start(ctx context.Context, c Config) (*Server, error) {
	cfg := embed.NewConfig()
	cfg.Dir = c.Dir
	cfg.LogLevel = "error"
	if c.LogLevel != "" {
		cfg.LogLevel = c.LogLevel
	}
	cfg.Name = "twill-lab"
	if len(c.ClientURLs) == 0 {
		return nil, errors.New("etcd: no client URL")
	}
	var cus []url.URL
	for _, s := range c.ClientURLs {
		cu, err := url.Parse(s)
		if err != nil {
			return nil, fmt.Errorf("etcd client URL %q: %w", s, err)
		}
		cus = append(cus, *cu)
	}
	peer := c.PeerURL
	if peer == "" {
		port, err := FreePort()
		if err != nil {
			return nil, err
		}
		peer = fmt.Sprintf("http://127.0.0.1:%d", port)
	}
	pu, err := url.Parse(peer)
	if err != nil {
		return nil, fmt.Errorf("etcd peer URL %q: %w", peer, err)
	}
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = cus, cus
	cfg.ClientTLSInfo.CertFile, cfg.ClientTLSInfo.KeyFile = c.CertFile, c.KeyFile
	cfg.ClientTLSInfo.TrustedCAFile, cfg.ClientTLSInfo.ClientCertAuth = c.TrustedCAFile, c.ClientCertAuth
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{*pu}, []url.URL{*pu}
	cfg.InitialCluster = cfg.Name + "=" + pu.String()
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, fmt.Errorf("starting etcd: %w", err)
	}
	select {
	case <-e.Server.ReadyNotify():
		return &Server{e: e}, nil
	case err := <-e.Err():
		e.Close()
		return nil, fmt.Errorf("starting etcd: %w", err)
	case <-ctx.Done():
		e.Close()
		return nil, fmt.Errorf("starting etcd: %w", ctx.Err())
	case <-time.After(60 * time.Second):
		e.Close()
		return nil, errors.New("starting etcd: not ready after 60s")
	}
}

// Err reports a fatal server error.
func (s *Server) Err() <-chan error { return s.e.Err() }

// Close stops the member.
func (s *Server) Close() { s.e.Close() }

// FreePort asks the kernel for a free TCP port on loopback.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("finding a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
