package backend

import (
	"bytes"
	"encoding/json"
	"fmt"

	"github.com/twill-net/twill/internal/strictjson"
)

// DecodeConfig decodes a backend's raw net-conf.json Backend object into
// dst, a pointer to a struct. Keys match field names case-insensitively; a
// key that matches no field is rejected with its name, and a value of the
// wrong type with the field and the value. "Type" is always accepted.
func DecodeConfig(raw json.RawMessage, dst any) error {
	if len(bytes.TrimSpace(raw)) == 0 || string(bytes.TrimSpace(raw)) == "null" {
		return nil
	}
	if err := strictjson.Decode(raw, dst, "Backend.", "Type"); err != nil {
		return fmt.Errorf("net-conf.json: %w", err)
	}
	return nil
}
