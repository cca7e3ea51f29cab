package strictjson

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

type conf struct {
	Network   string
	SubnetLen int
	IPv6      bool `json:"EnableIPv6"`
	Backend   json.RawMessage
	Ratio     float64
	Tags      []string
}

func TestDecode(t *testing.T) {
	var c conf
	if err := Decode([]byte(`{"network":"10.0.0.0/8","SUBNETLEN":24,"enableipv6":true,"Backend":{"Type":"x"},"Type":"ignored"}`), &c, "", "type"); err != nil {
		t.Fatal(err)
	}
	if c.Network != "10.0.0.0/8" || c.SubnetLen != 24 || !c.IPv6 || string(c.Backend) != `{"Type":"x"}` {
		t.Fatalf("decoded %+v", c)
	}
	for _, tt := range []struct{ in, path, want string }{
		{`{"SubnetLen":"abc"}`, "", `SubnetLen "abc": must be a whole number`},
		{`{"SubnetLen":1.5}`, "", `SubnetLen "1.5": must be a whole number`},
		{`{"Network":10}`, "Backend.", `Backend.Network "10": must be a string`},
		{`{"EnableIPv6":"yes"}`, "", `EnableIPv6 "yes": must be true or false`},
		{`{"Ratio":"x"}`, "", `Ratio "x": must be a number`},
		{`{"Tags":"x"}`, "", `Tags "x": must be a list`},
		{`{"Netwrok":"x"}`, "", `unknown key "Netwrok" (known: Backend, EnableIPv6, Network, Ratio, SubnetLen, Tags)`},
		{`{"Netwrok":"x"}`, "Backend.", `Backend: unknown key "Netwrok"`},
		{`[1]`, "", `"[1]": must be a JSON object`},
		{`{"a":`, "", `decoding`},
	} {
		var c conf
		err := Decode([]byte(tt.in), &c, tt.path)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("Decode(%s) = %v, want %q", tt.in, err, tt.want)
		}
		var fe *FieldError
		if tt.want != "decoding" && !errors.As(err, &fe) {
			t.Errorf("Decode(%s): %T is not a *FieldError", tt.in, err)
		}
	}
}

func FuzzDecode(f *testing.F) {
	f.Add([]byte(`{"Network":"10.0.0.0/8","SubnetLen":24}`))
	f.Add([]byte(`{"SubnetLen":"abc","Tags":[1,2]}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, data []byte) {
		var c conf
		if err := Decode(data, &c, "x."); err != nil && err.Error() == "" {
			t.Fatal("empty error")
		}
	})
}
