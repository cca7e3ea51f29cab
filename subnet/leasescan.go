package subnet

import (
	"bytes"
	"encoding/json"
)

// scanLeaseAttrs reads lease JSON in the layout nodes write without
// encoding/json's reflection (at start-up a node decodes every peer's
// lease): an object whose keys are the known ones, each spelled exactly
// and at most once, strings of printable ASCII without escapes, and
// BackendData and BackendV6Data null or a valid object. It reports false
// for anything else, which ParseLeaseAttrs hands to encoding/json; where
// it reports true, the result is what encoding/json decodes
// (FuzzScanLeaseAttrs checks this). Raw values alias data.
func scanLeaseAttrs(data []byte) (j leaseAttrsJSON, ok bool) {
	s := leaseScanner{b: data}
	if !s.next('{') {
		return j, false
	}
	var seen uint8
	if !s.next('}') {
		for {
			key, ok := s.str()
			if !ok || !s.next(':') {
				return j, false
			}
			bit, ok := s.member(string(key), &j)
			if !ok || seen&bit != 0 {
				return j, false
			}
			seen |= bit
			if s.next('}') {
				break
			}
			if !s.next(',') {
				return j, false
			}
		}
	}
	s.ws()
	return j, s.i == len(s.b)
}

type leaseScanner struct {
	b []byte
	i int
}

// member reads the value of key into j, and returns the key's bit.
func (s *leaseScanner) member(key string, j *leaseAttrsJSON) (uint8, bool) {
	switch key {
	case "PublicIP":
		v, ok := s.str()
		j.PublicIP = string(v)
		return 1, ok
	case "PublicIPv6":
		if s.null() {
			j.PublicIPv6 = nil
			return 2, true
		}
		v, ok := s.str()
		str := string(v)
		j.PublicIPv6 = &str
		return 2, ok
	case "BackendType":
		v, ok := s.str()
		j.BackendType = string(v)
		return 4, ok
	case "BackendData":
		v, ok := s.raw()
		j.BackendData = v
		return 8, ok
	case "BackendV6Data":
		v, ok := s.raw()
		j.BackendV6Data = v
		return 16, ok
	case "NodeAgent":
		v, ok := s.str()
		j.NodeAgent = string(v)
		return 32, ok
	}
	return 0, false
}

// ws skips JSON whitespace.
func (s *leaseScanner) ws() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

// next skips whitespace and consumes c if it comes next.
func (s *leaseScanner) next(c byte) bool {
	s.ws()
	if s.i < len(s.b) && s.b[s.i] == c {
		s.i++
		return true
	}
	return false
}

// str reads a string of printable ASCII without escapes.
func (s *leaseScanner) str() ([]byte, bool) {
	if !s.next('"') {
		return nil, false
	}
	start := s.i
	for ; s.i < len(s.b); s.i++ {
		switch c := s.b[s.i]; {
		case c == '"':
			s.i++
			return s.b[start : s.i-1], true
		case c < 0x20 || c > 0x7e || c == '\\':
			return nil, false
		}
	}
	return nil, false
}

// null consumes the literal null.
func (s *leaseScanner) null() bool {
	s.ws()
	if bytes.HasPrefix(s.b[s.i:], []byte("null")) {
		s.i += 4
		return true
	}
	return false
}

// raw reads null or an object, which must be valid JSON, as it stands.
func (s *leaseScanner) raw() (json.RawMessage, bool) {
	if s.null() {
		return json.RawMessage(s.b[s.i-4 : s.i]), true
	}
	if s.i >= len(s.b) || s.b[s.i] != '{' {
		return nil, false
	}
	start, depth, inStr := s.i, 0, false
	for ; s.i < len(s.b); s.i++ {
		c := s.b[s.i]
		switch {
		case inStr && c == '\\':
			s.i++
		case c == '"':
			inStr = !inStr
		case inStr:
		case c == '{' || c == '[':
			depth++
		case c == '}' || c == ']':
			depth--
		}
		if depth == 0 {
			s.i++
			v := s.b[start:s.i]
			return v, json.Valid(v)
		}
	}
	return nil, false
}
