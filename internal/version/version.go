// Package version carries the build's version, set with
// -ldflags "-X github.com/twill-net/twill/internal/version.Version=...".
package version

// Version is the release this binary was built from.
var Version = "dev"
