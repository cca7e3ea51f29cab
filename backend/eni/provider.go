package eni

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"

	"github.com/twill-net/twill/backend"
)

// ENI is an elastic network interface as the cloud describes it.
type ENI struct {
	ID  string
	MAC string // lower-case, colon-separated: how the node finds its interface
	// PrimaryIP is the ENI's own address, with the VPC subnet's length.
	PrimaryIP netip.Prefix
	Gateway   netip.Addr // the VPC router on that subnet
	// SecondaryIPs and Prefixes are what is assigned to the ENI now.
	SecondaryIPs []netip.Addr
	Prefixes     []netip.Prefix
	// MaxIPs is how many secondary IPs the ENI may hold (0: no limit known).
	MaxIPs int
}

// Subnet is the VPC subnet the ENI sits in.
func (e ENI) Subnet() netip.Prefix { return e.PrimaryIP.Masked() }

// Provider is the cloud API the eni backend needs. Every call takes a
// context and is idempotent: assigning what is assigned, or unassigning what
// is not, succeeds. Errors wrap ErrSubnetFull, ErrLimitExceeded,
// ErrThrottled or ErrNotSupported where those apply.
type Provider interface {
	// DescribeENI returns the ENI whose MAC address is mac.
	DescribeENI(ctx context.Context, mac string) (ENI, error)
	// AssignIPs assigns n more secondary IPs to the ENI and returns the
	// ENI as it is afterwards.
	AssignIPs(ctx context.Context, eniID string, n int) (ENI, error)
	// UnassignIPs releases secondary IPs of the ENI.
	UnassignIPs(ctx context.Context, eniID string, ips []netip.Addr) error
	// AssignPrefix delegates a prefix to the ENI.
	AssignPrefix(ctx context.Context, eniID string, p netip.Prefix) error
	// UnassignPrefix takes a delegated prefix back.
	UnassignPrefix(ctx context.Context, eniID string, p netip.Prefix) error
}

// Typed provider errors.
var (
	// ErrSubnetFull: the VPC subnet has no free address or prefix left.
	ErrSubnetFull = errors.New("subnet full")
	// ErrLimitExceeded: the ENI (or instance) holds as many addresses or
	// prefixes as its type allows.
	ErrLimitExceeded = errors.New("limit exceeded")
	// ErrThrottled: the API asks the caller to slow down; retry later.
	ErrThrottled = errors.New("throttled")
	// ErrNotSupported: the provider cannot do this.
	ErrNotSupported = errors.New("not supported")
)

// ProviderFactory builds a provider from the ProviderConfig JSON object.
type ProviderFactory func(config json.RawMessage) (Provider, error)

var providers = backend.Named[ProviderFactory]{Kind: "eni provider"}

// RegisterProvider makes a provider available under name, for
// net-conf.json's Backend.Provider. Call it from init(); a duplicate name
// panics, as two providers cannot share one.
func RegisterProvider(name string, f ProviderFactory) {
	providers.Add(name, f)
}

// Providers lists the registered provider names.
func Providers() []string { return providers.Names() }

func newProvider(name string, config json.RawMessage) (Provider, error) {
	f, ok := providers.Get(name)
	if !ok {
		return nil, fmt.Errorf("eni: Backend.Provider %q: unknown; this twilld has %v", name, Providers())
	}
	p, err := f(config)
	if err != nil {
		return nil, fmt.Errorf("eni: Backend.ProviderConfig for %q: %w", name, err)
	}
	return p, nil
}
