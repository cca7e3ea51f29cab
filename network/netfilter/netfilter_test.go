package netfilter

import (
	"strings"
	"testing"
)

func TestParseMode(t *testing.T) {
	for _, s := range []string{"auto", "iptables", "NFTables "} {
		if _, err := ParseMode(s); err != nil {
			t.Errorf("ParseMode(%q): %v", s, err)
		}
	}
	if _, err := ParseMode("ebtables"); err == nil || !strings.Contains(err.Error(), `--netfilter "ebtables"`) {
		t.Errorf("ParseMode(ebtables): %v, want an error naming the flag and the value", err)
	}
}

func TestChoose(t *testing.T) {
	yes, no := true, false
	host := func(present, nft, chains bool, drops ...string) Host {
		return Host{
			IPTables:    func(bool) (bool, bool) { return present, nft },
			TwillChains: func() (bool, error) { return chains, nil },
			ForwardDrop: func() ([]string, error) { return drops, nil },
		}
	}
	for _, tc := range []struct {
		name   string
		flag   Mode
		conf   *bool
		host   Host
		want   Mode
		whyHas string
	}{
		{"flag wins over net-conf", IPTables, &yes, host(true, true, false), IPTables, "overrides net-conf.json EnableNFTables: true"},
		{"flag nftables", NFTables, nil, host(true, false, true), NFTables, "--netfilter=nftables"},
		{"flannel's EnableNFTables true", Auto, &yes, host(true, false, true), NFTables, "EnableNFTables: true"},
		{"flannel's EnableNFTables false", Auto, &no, host(false, false, false), IPTables, "EnableNFTables: false"},
		{"no iptables", Auto, nil, host(false, false, false), NFTables, "no iptables binary"},
		{"iptables-legacy", Auto, nil, host(true, false, false), IPTables, "iptables-legacy"},
		{"twill chains from before", Auto, nil, host(true, true, true), IPTables, "chains exist from an earlier run"},
		{"a forward chain drops", Auto, nil, host(true, true, false, "ip filter FORWARD"), IPTables, "ip filter FORWARD"},
		{"iptables-nft, clean", Auto, nil, host(true, true, false), NFTables, "iptables-nft"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Choose(tc.flag, tc.conf, true, true, tc.host)
			if err != nil {
				t.Fatal(err)
			}
			if c.Mode != tc.want || !strings.Contains(c.Why, tc.whyHas) {
				t.Errorf("chose %s because %q; want %s, because …%q…", c.Mode, c.Why, tc.want, tc.whyHas)
			}
		})
	}
}
