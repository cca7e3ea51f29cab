package eni

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/twill-net/twill/backend"
)

func init() { RegisterProvider("static", newStatic) }

// StaticConfig is the static provider's ProviderConfig: ENIs provisioned
// ahead of time (by Terraform, a launch template, …) with their addresses.
type StaticConfig struct {
	ENIs []StaticENI
}

// StaticENI is one pre-provisioned ENI.
type StaticENI struct {
	ID           string
	MAC          string
	PrimaryIP    string // address/subnet length, e.g. "10.10.1.5/24"
	Gateway      string
	SecondaryIPs []string
	Prefixes     []string
}

// static serves the declared ENIs. Nothing can be attached, assigned beyond
// the declaration, or released: the addresses belong to the ENI for good.
type static struct{ enis []ENI }

func newStatic(raw json.RawMessage) (Provider, error) {
	var c StaticConfig
	if err := backend.DecodeConfig(raw, &c); err != nil {
		return nil, err
	}
	if len(c.ENIs) == 0 {
		return nil, fmt.Errorf("ENIs: declare at least one ENI")
	}
	s := &static{}
	for i, e := range c.ENIs {
		field := fmt.Sprintf("ENIs[%d]", i)
		out := ENI{ID: e.ID, MAC: strings.ToLower(e.MAC)}
		if out.ID == "" {
			return nil, fmt.Errorf("%s.ID: must not be empty", field)
		}
		var err error
		if out.PrimaryIP, err = netip.ParsePrefix(e.PrimaryIP); err != nil || !out.PrimaryIP.Addr().Is4() {
			return nil, fmt.Errorf("%s.PrimaryIP %q: want an IPv4 address with its subnet length, such as 10.10.1.5/24", field, e.PrimaryIP)
		}
		if out.Gateway, err = netip.ParseAddr(e.Gateway); err != nil || !out.PrimaryIP.Masked().Contains(out.Gateway) {
			return nil, fmt.Errorf("%s.Gateway %q: want an address in %s", field, e.Gateway, out.PrimaryIP.Masked())
		}
		for j, ip := range e.SecondaryIPs {
			a, err := netip.ParseAddr(ip)
			if err != nil || !out.PrimaryIP.Masked().Contains(a) {
				return nil, fmt.Errorf("%s.SecondaryIPs[%d] %q: want an address in %s", field, j, ip, out.PrimaryIP.Masked())
			}
			out.SecondaryIPs = append(out.SecondaryIPs, a)
		}
		for j, p := range e.Prefixes {
			pp, err := netip.ParsePrefix(p)
			if err != nil || pp.Masked() != pp {
				return nil, fmt.Errorf("%s.Prefixes[%d] %q: want a CIDR without host bits", field, j, p)
			}
			out.Prefixes = append(out.Prefixes, pp)
		}
		out.MaxIPs = len(out.SecondaryIPs)
		s.enis = append(s.enis, out)
	}
	return s, nil
}

func (s *static) find(pred func(ENI) bool, what string) (ENI, error) {
	for _, e := range s.enis {
		if pred(e) {
			return e, nil
		}
	}
	return ENI{}, fmt.Errorf("static provider: no declared ENI with %s", what)
}

func (s *static) DescribeENI(_ context.Context, mac string) (ENI, error) {
	return s.find(func(e ENI) bool { return e.MAC == strings.ToLower(mac) }, "MAC "+mac)
}

func (s *static) AssignIPs(_ context.Context, id string, _ int) (ENI, error) {
	e, err := s.find(func(e ENI) bool { return e.ID == id }, "ID "+id)
	if err != nil {
		return ENI{}, err
	}
	return e, fmt.Errorf("static provider: ENI %s has only its %d declared secondary IPs: %w", id, len(e.SecondaryIPs), ErrLimitExceeded)
}

func (s *static) UnassignIPs(context.Context, string, []netip.Addr) error {
	return fmt.Errorf("static provider: declared secondary IPs stay assigned: %w", ErrNotSupported)
}

func (s *static) AssignPrefix(_ context.Context, id string, p netip.Prefix) error {
	e, err := s.find(func(e ENI) bool { return e.ID == id }, "ID "+id)
	if err != nil {
		return err
	}
	if !slices.Contains(e.Prefixes, p) {
		return fmt.Errorf("static provider: prefix %s is not among ENI %s's declared Prefixes %v (reserve a declared prefix for this node in the subnet manager): %w",
			p, id, e.Prefixes, ErrNotSupported)
	}
	return nil
}

func (s *static) UnassignPrefix(context.Context, string, netip.Prefix) error { return nil }
