//go:build tools

// Package tools pins sigs.k8s.io/network-policy-api: its CRDs for the
// lab (build.sh) and its conformance suite.
package tools

import _ "sigs.k8s.io/network-policy-api/conformance"
