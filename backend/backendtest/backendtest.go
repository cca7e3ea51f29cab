// Package backendtest starts a backend in a test the way twilld does: the
// factory with the options, Prepare, then Attach to the node's lease.
package backendtest

import (
	"context"
	"net/netip"
	"slices"
	"testing"

	"github.com/twill-net/twill/nl"

	"github.com/twill-net/twill/backend"
	"github.com/twill-net/twill/subnet"
)

// Options are the options twilld would give a backend for the
// net-conf.json conf, on kernel k with external interface ext: a logger
// (quiet unless TWILL_TEST_DEBUG is set) and a fresh state directory.
func Options(t testing.TB, conf string, k backend.Kernel, ext backend.ExternalInterface) backend.Options {
	t.Helper()
	cfg, err := subnet.ParseConfig([]byte(conf))
	if err != nil {
		t.Fatal(err)
	}
	return backend.Options{Logger: testLogger(t), Netlink: k, Config: cfg, StateDir: t.TempDir(), ExtIface: ext}
}

// Attach builds the backend with f and opts, prepares it, and attaches it
// to lease; it fails the test on any error.
func Attach(t testing.TB, f backend.Factory, opts backend.Options, lease string) (backend.Backend, subnet.LeaseAttrs, backend.Attached) {
	t.Helper()
	b, err := f(opts)
	if err != nil {
		t.Fatal(err)
	}
	attrs, err := b.Prepare(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	nw, err := b.Attach(context.Background(), subnet.Lease{Subnet: netip.MustParsePrefix(lease), Attrs: attrs})
	if err != nil {
		t.Fatal(err)
	}
	return b, attrs, nw
}

// Routes lists the routes of table (0: main) in k as `ip route` would
// print them (nl.Route.String), sorted; it fails the test if k cannot.
func Routes(t testing.TB, k backend.RouteTable, table int) []string {
	t.Helper()
	rs, err := k.Routes(nl.FamilyAll, nl.RouteFilter{Table: table})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, r := range rs {
		out = append(out, r.String())
	}
	slices.Sort(out)
	return out
}
