// Package etcdflags defines the etcd connection flags that twilld and every
// twillctl command talking to etcd share (endpoints, prefix, TLS, auth), so
// that an operator who can run twilld against an etcd can run twillctl
// against it with the same flags.
package etcdflags

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/spf13/pflag"
	clientv3 "go.etcd.io/etcd/client/v3"

	etcdsm "github.com/twill-net/twill/subnet/etcd"
)

// Options are the connection flags' values.
type Options struct {
	etcdsm.ClientOptions
	Prefix string
	// PasswordFile holds the password: a file only its owner reads, where
	// --etcd-password shows in /proc/<pid>/cmdline to every local user.
	PasswordFile string
}

// Add defines the flags on fs.
func Add(fs *pflag.FlagSet, o *Options) {
	fs.StringSliceVar(&o.Endpoints, "etcd-endpoints", []string{"http://127.0.0.1:2379"}, "etcd endpoints, comma-separated")
	fs.StringVar(&o.Prefix, "etcd-prefix", etcdsm.DefaultPrefix, "etcd key prefix holding config and subnets")
	fs.StringVar(&o.CAFile, "etcd-cafile", "", "CA bundle to verify etcd's certificate")
	fs.StringVar(&o.CertFile, "etcd-certfile", "", "client certificate for etcd")
	fs.StringVar(&o.KeyFile, "etcd-keyfile", "", "client key for etcd")
	fs.StringVar(&o.Username, "etcd-username", "", "etcd user name (auth)")
	fs.StringVar(&o.Password, "etcd-password", "", "etcd password (auth); every local user reads a command line: prefer --etcd-password-file, or the environment")
	fs.StringVar(&o.PasswordFile, "etcd-password-file", "", "file holding the etcd password (auth), its first line")
}

// Client connects to etcd.
func (o Options) Client() (*clientv3.Client, error) {
	co, err := o.clientOptions()
	if err != nil {
		return nil, err
	}
	return etcdsm.NewClient(co)
}

// clientOptions are the options with the password read from
// PasswordFile, if set.
func (o Options) clientOptions() (etcdsm.ClientOptions, error) {
	co := o.ClientOptions
	if o.PasswordFile == "" {
		return co, nil
	}
	if co.Password != "" {
		return co, fmt.Errorf("--etcd-password and --etcd-password-file %q are both set: give one", o.PasswordFile)
	}
	b, err := os.ReadFile(o.PasswordFile)
	if err != nil {
		return co, fmt.Errorf("--etcd-password-file: %w", err)
	}
	co.Password, _, _ = strings.Cut(string(b), "\n")
	co.Password = strings.TrimSuffix(co.Password, "\r")
	if co.Password == "" {
		return co, fmt.Errorf("--etcd-password-file %q: no password on its first line", o.PasswordFile)
	}
	return co, nil
}

// Do connects, waits up to 5 s for etcd to answer (failing with the
// endpoints and the reason otherwise), and runs f with a 30 s deadline.
func (o Options) Do(ctx context.Context, f func(context.Context, *clientv3.Client) error) error {
	cli, err := o.Client()
	if err != nil {
		return err
	}
	defer cli.Close()
	if err := etcdsm.Reach(ctx, cli, 5*time.Second); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	return f(ctx, cli)
}
