package subnet

import (
	"bytes"
	"fmt"
	"testing"
)

// The layouts nodes write take the fast path; others (escapes, other
// spellings, repeated keys) go to encoding/json.
func TestScanLeaseAttrsTakes(t *testing.T) {
	for _, c := range []struct {
		in   string
		fast bool
	}{
		{`{"PublicIP":"192.168.0.7","PublicIPv6":null,"BackendType":"host-gw","BackendData":null,"BackendV6Data":null}`, true},
		{`{"PublicIP":"192.168.0.7","BackendType":"vxlan","BackendData":{"VNI":1,"VtepMAC":"0a:b0:00:00:00:01"}}`, true},
		{" {\n \"PublicIPv6\" : \"fd00::1\" ,\"BackendType\":\"vxlan\", \"BackendV6Data\": {\"a\":[{\"}\":\"\\\"{\"}]}} \n", true},
		{`{}`, true},
		{`{"publicip":"192.168.0.7","BackendType":"host-gw"}`, false},
		{`{"PublicIP":"192.168.0.7","PublicIP":"192.168.0.8","BackendType":"host-gw"}`, false},
		{`{"PublicIP":"192.168.0.\u0037","BackendType":"host-gw"}`, false},
		{`{"PublicIP":"192.168.0.7","BackendType":"host-gw","Extra":1}`, false},
		{`{"PublicIP":"192.168.0.7","BackendType":"host-gw",}`, false},
		{`{"PublicIP":"192.168.0.7","BackendType":"host-gw"}x`, false},
		{`{"PublicIP":"192.168.0.7","BackendType":"host-gw","BackendData":{"VNI":01}}`, false},
	} {
		if _, ok := scanLeaseAttrs([]byte(c.in)); ok != c.fast {
			t.Errorf("%s: fast path %v, want %v", c.in, ok, c.fast)
		}
	}
}

// FuzzScanLeaseAttrs: wherever the fast path decodes, it decodes what
// encoding/json does, errors included.
func FuzzScanLeaseAttrs(f *testing.F) {
	f.Add([]byte(`{"PublicIP":"192.168.0.7","BackendType":"vxlan","BackendData":{"VNI":1,"VtepMAC":"0a:b0:00:00:00:01"}}`))
	f.Add([]byte(`{"PublicIP":"10.0.0.1","PublicIPv6":"fd00::1","BackendType":"host-gw","BackendData":null,"BackendV6Data":{"x":"}"}}`))
	f.Add([]byte(`{"PublicIP":"0.0.0.0","PublicIPv6":null,"BackendType":"","BackendData":[1]}`))
	f.Add([]byte(`{"PublicIP":"10.0.0.1","BackendType":"vxlan","NodeAgent":"twill"}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		fast, ferr := parseLeaseAttrs(data, true)
		slow, serr := parseLeaseAttrs(data, false)
		if fmt.Sprint(ferr) != fmt.Sprint(serr) {
			t.Fatalf("%q: fast path error %v, encoding/json %v", data, ferr, serr)
		}
		if !fast.Equal(slow) || !bytes.Equal(fast.BackendData, slow.BackendData) || !bytes.Equal(fast.BackendV6Data, slow.BackendV6Data) {
			t.Fatalf("%q: fast path %+v, encoding/json %+v", data, fast, slow)
		}
	})
}

func BenchmarkParseLeaseAttrs(b *testing.B) {
	for _, c := range []struct{ name, in string }{
		{"host-gw", `{"PublicIP":"192.168.0.7","PublicIPv6":null,"BackendType":"host-gw","BackendData":null,"BackendV6Data":null}`},
		{"vxlan", `{"PublicIP":"192.168.0.7","PublicIPv6":null,"BackendType":"vxlan","BackendData":{"VNI":1,"VtepMAC":"0a:b0:00:00:00:01"},"BackendV6Data":null}`},
	} {
		for _, fast := range []bool{true, false} {
			b.Run(fmt.Sprintf("%s/fast=%v", c.name, fast), func(b *testing.B) {
				b.ReportAllocs()
				for range b.N {
					if _, err := parseLeaseAttrs([]byte(c.in), fast); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
