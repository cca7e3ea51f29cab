package eni

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"time"

	"github.com/twill-net/twill/backend"
	"github.com/twill-net/twill/nl"
)

// Config is the backend's net-conf.json Backend object.
type Config struct {
	Interface           string // the ENI's name on the node, e.g. "eth1"
	Mode                string // "prefix" (default) or "secondary-ip"
	RouteTable          int    // default nl.ENIRouteTable
	RulePriorityToPod   int    // default nl.RulePriorityToPod
	RulePriorityFromPod int    // default nl.RulePriorityFromPod
	Provider            string // default "static"
	ProviderConfig      json.RawMessage
	// Warm pool (secondary-ip mode): keep at least PoolLowWater free
	// secondary IPs, grow to PoolHighWater free when below, and release
	// free IPs above PoolHighWater once they have been surplus for
	// PoolReleaseCooldown.
	PoolLowWater        int
	PoolHighWater       int
	PoolReleaseCooldown string
}

// Settings is Config validated, with defaults applied.
type Settings struct {
	Interface              string
	Mode                   string
	Table                  int
	RuleToPod, RuleFromPod int
	Provider               string
	ProviderConfig         json.RawMessage
	LowWater, HighWater    int
	Cooldown               time.Duration
}

// ParseConfig decodes and checks the Backend object. Errors name the field
// and the value.
func ParseConfig(raw json.RawMessage) (Settings, error) {
	var c Config
	if err := backend.DecodeConfig(raw, &c); err != nil {
		return Settings{}, err
	}
	s := Settings{Interface: c.Interface, Mode: c.Mode, Table: c.RouteTable, RuleToPod: c.RulePriorityToPod, RuleFromPod: c.RulePriorityFromPod,
		Provider: c.Provider, ProviderConfig: c.ProviderConfig, LowWater: c.PoolLowWater, HighWater: c.PoolHighWater, Cooldown: 30 * time.Second}
	bad := func(field string, v any, why string) (Settings, error) {
		return Settings{}, fmt.Errorf("net-conf.json: Backend.%s %q: %s", field, fmt.Sprint(v), why)
	}
	if s.Interface == "" || len(s.Interface) > 15 {
		return bad("Interface", s.Interface, "name the ENI's interface on the node, such as eth1")
	}
	switch s.Mode {
	case "":
		s.Mode = ModePrefix
	case ModePrefix, ModeSecondaryIP:
	default:
		return bad("Mode", s.Mode, `must be "prefix" or "secondary-ip"`)
	}
	if s.Table == 0 {
		s.Table = nl.ENIRouteTable
	}
	if s.Table < 1 || s.Table > 0xfffffff0 || s.Table == nl.MainTable || s.Table == 253 || s.Table == 255 {
		return bad("RouteTable", c.RouteTable, "must be a table number other than main (254), default (253) and local (255)")
	}
	if s.RuleToPod == 0 {
		s.RuleToPod = nl.RulePriorityToPod
	}
	if s.RuleFromPod == 0 {
		s.RuleFromPod = nl.RulePriorityFromPod
	}
	if s.RuleToPod < 1 || s.RuleToPod >= 32766 {
		return bad("RulePriorityToPod", c.RulePriorityToPod, "must be between 1 and 32765 (before the main table's rule)")
	}
	if s.RuleFromPod <= s.RuleToPod || s.RuleFromPod >= 32766 {
		return bad("RulePriorityFromPod", c.RulePriorityFromPod, fmt.Sprintf("must be above RulePriorityToPod (%d) and below 32766", s.RuleToPod))
	}
	if s.Provider == "" {
		s.Provider = "static"
	}
	if s.LowWater == 0 {
		s.LowWater = 2
	}
	if s.HighWater == 0 {
		s.HighWater = max(5, s.LowWater)
	}
	if s.LowWater < 1 {
		return bad("PoolLowWater", c.PoolLowWater, "must be at least 1, or ADD could wait for an IP nobody assigns")
	}
	if s.HighWater < s.LowWater {
		return bad("PoolHighWater", c.PoolHighWater, fmt.Sprintf("must not be below PoolLowWater (%d)", s.LowWater))
	}
	if c.PoolReleaseCooldown != "" {
		d, err := time.ParseDuration(c.PoolReleaseCooldown)
		if err != nil || d < 0 {
			return bad("PoolReleaseCooldown", c.PoolReleaseCooldown, "must be a duration such as 30s")
		}
		s.Cooldown = d
	}
	return s, nil
}

// Data is the eni backend's lease BackendData.
type Data struct {
	ENI   string     `json:"ENI"`
	ENIIP netip.Addr `json:"ENIIP"`
}

// ParseData decodes a peer's BackendData.
func ParseData(raw json.RawMessage) (Data, error) {
	var d Data
	if err := json.Unmarshal(raw, &d); err != nil {
		return Data{}, fmt.Errorf("eni BackendData %s: %w", raw, err)
	}
	if !d.ENIIP.Is4() {
		return Data{}, fmt.Errorf("eni BackendData %s: ENIIP must be an IPv4 address", raw)
	}
	return d, nil
}
