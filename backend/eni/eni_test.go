package eni

import (
	"encoding/json"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twill-net/twill/nl"
	"github.com/twill-net/twill/subnet"
)

func TestParseConfigDefaults(t *testing.T) {
	s, err := ParseConfig(json.RawMessage(`{"Type":"eni","Interface":"eth1"}`))
	if err != nil {
		t.Fatal(err)
	}
	if s.Mode != ModePrefix || s.Table != nl.ENIRouteTable || s.RuleToPod != nl.RulePriorityToPod || s.RuleFromPod != nl.RulePriorityFromPod ||
		s.Provider != "static" || s.LowWater != 2 || s.HighWater != 5 || s.Cooldown != 30*time.Second {
		t.Errorf("defaults: %+v", s)
	}
}

func TestParseConfigErrorsNameFieldAndValue(t *testing.T) {
	for _, tc := range []struct{ conf, want string }{
		{`{"Interface":""}`, `Backend.Interface ""`},
		{`{"Interface":"eth1","Mode":"bridge"}`, `Backend.Mode "bridge"`},
		{`{"Interface":"eth1","RouteTable":254}`, `Backend.RouteTable "254"`},
		{`{"Interface":"eth1","RulePriorityToPod":40000}`, `Backend.RulePriorityToPod "40000"`},
		{`{"Interface":"eth1","RulePriorityToPod":600,"RulePriorityFromPod":500}`, `Backend.RulePriorityFromPod "500"`},
		{`{"Interface":"eth1","PoolLowWater":-1}`, `Backend.PoolLowWater "-1"`},
		{`{"Interface":"eth1","PoolLowWater":4,"PoolHighWater":3}`, `Backend.PoolHighWater "3"`},
		{`{"Interface":"eth1","PoolReleaseCooldown":"soon"}`, `Backend.PoolReleaseCooldown "soon"`},
		{`{"Interface":"eth1","Tabel":100}`, `unknown key "Tabel"`},
		{`{"Interface":"eth1","RouteTable":"100"}`, `Backend.RouteTable`},
	} {
		_, err := ParseConfig(json.RawMessage(tc.conf))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err %v, want one containing %s", tc.conf, err, tc.want)
		}
	}
}

func TestStaticProviderConfig(t *testing.T) {
	good := `{"ENIs":[{"ID":"eni-1","MAC":"0A:00:00:00:00:01","PrimaryIP":"10.10.1.5/24","Gateway":"10.10.1.1","SecondaryIPs":["10.10.1.20"],"Prefixes":["10.10.128.0/24"]}]}`
	p, err := newProvider("static", json.RawMessage(good))
	if err != nil {
		t.Fatal(err)
	}
	e, err := p.DescribeENI(t.Context(), "0a:00:00:00:00:01")
	if err != nil || e.ID != "eni-1" || len(e.SecondaryIPs) != 1 || e.Gateway.String() != "10.10.1.1" {
		t.Fatalf("describe: %+v %v", e, err)
	}
	if _, err := p.AssignIPs(t.Context(), "eni-1", 1); err == nil || !strings.Contains(err.Error(), ErrLimitExceeded.Error()) {
		t.Errorf("static AssignIPs: %v, want limit exceeded", err)
	}
	for _, tc := range []struct{ conf, want string }{
		{`{"ENIs":[]}`, "ENIs"},
		{`{"ENIs":[{"ID":"x","PrimaryIP":"10.10.1.5","Gateway":"10.10.1.1"}]}`, `ENIs[0].PrimaryIP "10.10.1.5"`},
		{`{"ENIs":[{"ID":"x","PrimaryIP":"10.10.1.5/24","Gateway":"10.9.1.1"}]}`, `ENIs[0].Gateway "10.9.1.1"`},
		{`{"ENIs":[{"ID":"x","PrimaryIP":"10.10.1.5/24","Gateway":"10.10.1.1","SecondaryIPs":["10.11.0.1"]}]}`, `ENIs[0].SecondaryIPs[0] "10.11.0.1"`},
	} {
		_, err := newProvider("static", json.RawMessage(tc.conf))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err %v, want one containing %s", tc.conf, err, tc.want)
		}
	}
	if _, err := newProvider("aws", nil); err == nil || !strings.Contains(err.Error(), `Backend.Provider "aws"`) {
		t.Errorf("unknown provider: %v", err)
	}
}

func FuzzParseConfig(f *testing.F) {
	f.Add(`{"Interface":"eth1","Mode":"secondary-ip","PoolLowWater":1}`)
	f.Add(`{"Interface":"eth1","RouteTable":4294967295}`)
	f.Fuzz(func(t *testing.T, conf string) {
		s, err := ParseConfig(json.RawMessage(conf))
		if err != nil {
			return
		}
		if s.Interface == "" || s.RuleFromPod <= s.RuleToPod || s.HighWater < s.LowWater || s.LowWater < 1 || s.Table == nl.MainTable {
			t.Fatalf("accepted an unusable config %s: %+v", conf, s)
		}
	})
}

func TestDesiredRoutes(t *testing.T) {
	eni := ENI{ID: "eni-1", PrimaryIP: netip.MustParsePrefix("10.10.1.1/24"), Gateway: netip.MustParseAddr("10.10.1.254")}
	peer := func(sub, eniIP string) subnet.Lease {
		return subnet.Lease{Subnet: netip.MustParsePrefix(sub), Attrs: subnet.LeaseAttrs{BackendType: Type,
			BackendData: json.RawMessage(`{"ENI":"x","ENIIP":"` + eniIP + `"}`)}}
	}
	peers := []subnet.Lease{peer("10.10.200.0/24", "10.10.1.2"), peer("10.10.201.0/24", "10.99.0.9"), peer("10.10.202.0/24", "nope")}
	for _, tc := range []struct {
		mode    string
		want    []string
		badKeys []string
	}{
		{ModePrefix, []string{"10.10.1.0/24 dev#7 table 100", "0.0.0.0/0 via 10.10.1.254 dev#7 table 100", "10.10.200.0/24 via 10.10.1.2 dev#7 table 100"},
			[]string{"10.10.201.0/24", "10.10.202.0/24"}},
		{ModeSecondaryIP, []string{"10.10.1.0/24 dev#7 table 100", "0.0.0.0/0 via 10.10.1.254 dev#7 table 100"}, nil},
	} {
		t.Run(tc.mode, func(t *testing.T) {
			n := &Network{set: Settings{Mode: tc.mode, Table: 100}, link: nl.Link{Index: 7, Name: "eth1"}, eni: eni}
			var got []string
			bad := n.DesiredRoutes(peers, func(r nl.Route) { r.Table = 100; got = append(got, r.String()) })
			if strings.Join(got, "|") != strings.Join(tc.want, "|") {
				t.Errorf("routes\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(tc.want, "\n"))
			}
			var keys []string
			for k := range bad {
				keys = append(keys, k)
			}
			slices.Sort(keys)
			if !slices.Equal(keys, tc.badKeys) {
				t.Errorf("refused peers %v, want %v (%v)", keys, tc.badKeys, bad)
			}
		})
	}
}
