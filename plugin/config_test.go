package plugin

import (
	"strings"
	"testing"
)

func TestParseConf(t *testing.T) {
	c, err := ParseConf([]byte(`{"cniVersion":"1.1.0","name":"pods","type":"twill","mtu":1400}`))
	if err != nil {
		t.Fatal(err)
	}
	if c.SubnetFile != DefaultSubnetFile || c.DataDir != DefaultDataDir || c.MTU != 1400 {
		t.Fatalf("defaults not applied: %+v", c)
	}
	c, err = ParseConf([]byte(`{"cniVersion":"1.1.0","name":"pods","type":"twill","capabilities":{"portMappings":true},
		"runtimeConfig":{"portMappings":[{"hostPort":8080,"containerPort":80,"protocol":"tcp","hostIP":""}],"bandwidth":{}}}`))
	if err != nil || len(c.HostPorts) != 1 || c.HostPorts[0].HostPort != 8080 || c.HostPorts[0].ContainerPort != 80 {
		t.Fatalf("portMappings: %+v, %v", c, err)
	}
	for _, tt := range []struct{ in, want string }{
		{`{"cniVersion":"1.1.0","name":"pods","type":"twill","subnetfile":"/x"}`, `unknown key "subnetfile"`},
		{`{"cniVersion":"1.1.0","name":"pods","type":"twill","mtu":70000}`, "mtu 70000"},
		{`{"cniVersion":"1.1.0","name":"","type":"twill"}`, `name ""`},
		{`{"cniVersion":"1.1.0","name":"a/b","type":"twill"}`, `name "a/b"`},
		{`{"cniVersion":`, "decoding"},
		// Type errors name the key and the value given.
		{`{"cniVersion":"1.1.0","name":"pods","type":"twill","mtu":"abc"}`, `mtu "abc": must be a whole number`},
		{`{"cniVersion":"1.1.0","name":"pods","type":"twill","subnetFile":7}`, `subnetFile "7": must be a string`},
		{`{"cniVersion":"1.1.0","name":["x"],"type":"twill"}`, `name "[\"x\"]": must be a string`},
	} {
		if _, err := ParseConf([]byte(tt.in)); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("ParseConf(%s) error %v, want %q", tt.in, err, tt.want)
		}
	}
}

// Bad port mappings are ADD's and CHECK's error, naming the entry and the
// field; DEL, GC and STATUS still parse the configuration (they clean up
// after the ADD that failed).
func TestParseConfPortMappingsErrors(t *testing.T) {
	for in, want := range map[string]string{
		`{"cniVersion":"1.1.0","name":"pods","type":"twill","runtimeConfig":"x"}`:                                                  `runtimeConfig "x": must be a JSON object`,
		`{"cniVersion":"1.1.0","name":"pods","type":"twill","runtimeConfig":{"portMappings":[{"hostPort":80,"containerPort":0}]}}`: `runtimeConfig.portMappings[0].containerPort 0: must be a port`,
	} {
		c, err := ParseConf([]byte(in))
		if err != nil {
			t.Errorf("ParseConf(%s): %v; want the configuration, with the mappings' error kept for ADD", in, err)
			continue
		}
		if c.hostPortsErr == nil || !strings.Contains(c.hostPortsErr.Error(), want) || len(c.HostPorts) != 0 {
			t.Errorf("ParseConf(%s): mappings' error %v, ports %v; want %q and none", in, c.hostPortsErr, c.HostPorts, want)
		}
	}
}

func TestHostVethNameAndAlias(t *testing.T) {
	a, b := HostVethName("c1", "eth0"), HostVethName("c1", "eth1")
	if len(a) != 15 || !strings.HasPrefix(a, "tw") || a == b {
		t.Fatalf("names %q %q: want distinct 15-character tw names", a, b)
	}
	att, ok := ParseLinkAlias("pods", LinkAlias("pods", "c1/with/slashes", "eth0"))
	if !ok || att.ContainerID != "c1/with/slashes" || att.IfName != "eth0" {
		t.Fatalf("alias round trip: %+v %v", att, ok)
	}
	if _, ok := ParseLinkAlias("other", LinkAlias("pods", "c1", "eth0")); ok {
		t.Fatal("an alias of another network matched")
	}
}

func TestCheckIfName(t *testing.T) {
	for name, ok := range map[string]bool{"eth0": true, "": false, "..": false, "a/b": false, "sixteen-chars-xx": false} {
		if err := CheckIfName(name); (err == nil) != ok {
			t.Errorf("CheckIfName(%q) = %v", name, err)
		}
	}
}

func FuzzParseConf(f *testing.F) {
	f.Add([]byte(`{"cniVersion":"1.1.0","name":"pods","type":"twill","subnetFile":"/run/twill/subnet.env","mtu":1450}`))
	f.Add([]byte(`{"cniVersion":"0.3.1","name":"pods","type":"twill","ipam":{"type":"host-local"}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := ParseConf(data)
		if err != nil {
			return
		}
		if c.Name == "" || c.SubnetFile == "" || c.DataDir == "" || c.MTU < 0 {
			t.Fatalf("accepted an incomplete configuration: %+v", c)
		}
	})
}
