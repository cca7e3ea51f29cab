package app

import (
	"strings"
	"testing"
	"time"

	"github.com/twill-net/twill/backend"
)

func TestFlagsFromEnvironment(t *testing.T) {
	t.Setenv("TWILLD_ETCD_ENDPOINTS", "http://10.0.0.1:2379,http://10.0.0.2:2379")
	t.Setenv("TWILLD_IP_MASQ", "true")
	t.Setenv("TWILLD_IPTABLES_RESYNC", "7s")
	t.Setenv("TWILLD_IFACE", "eth9") // the command line wins over the environment
	cmd := newRootCommand(&backend.Registry{}, nil)
	if err := cmd.ParseFlags([]string{"--iface", "eth1"}); err != nil {
		t.Fatal(err)
	}
	if err := applyEnv(cmd.Flags()); err != nil {
		t.Fatal(err)
	}
	f := cmd.Flags()
	if v, _ := f.GetStringSlice("etcd-endpoints"); strings.Join(v, " ") != "http://10.0.0.1:2379 http://10.0.0.2:2379" {
		t.Errorf("etcd-endpoints %v", v)
	}
	if v, _ := f.GetBool("ip-masq"); !v {
		t.Error("ip-masq not set from TWILLD_IP_MASQ")
	}
	if v, _ := f.GetDuration("iptables-resync"); v != 7*time.Second {
		t.Errorf("iptables-resync %v", v)
	}
	if v, _ := f.GetStringSlice("iface"); strings.Join(v, "") != "eth1" {
		t.Errorf("iface %v: the flag must win over TWILLD_IFACE", v)
	}
}

func TestFlagFromEnvironmentRejectsBadValue(t *testing.T) {
	t.Setenv("TWILLD_HEALTHZ_PORT", "eighty")
	cmd := newRootCommand(&backend.Registry{}, nil)
	if err := cmd.ParseFlags(nil); err != nil {
		t.Fatal(err)
	}
	err := applyEnv(cmd.Flags())
	if err == nil || !strings.Contains(err.Error(), `TWILLD_HEALTHZ_PORT="eighty"`) {
		t.Fatalf("error %v: want the variable and value named", err)
	}
}
