package ociimage

import (
	"reflect"
	"strings"
	"testing"
)

func TestParseDepends(t *testing.T) {
	text := `procps
  Depends: libc6
 |Depends: libelogind0
  Depends: libsystemd0
  Depends: <debconf-2.0>
    cdebconf
    debconf
  Recommends: psmisc
  PreDepends: libtinfo6
libc6
  Depends: libgcc-s1
`
	got, err := ParseDepends(text)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][]string{
		"procps": {"libc6", "libelogind0", "cdebconf", "libtinfo6"},
		"libc6":  {"libgcc-s1"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	if _, err := ParseDepends("  Depends: libc6\n"); err == nil || !strings.Contains(err.Error(), "line 1") {
		t.Fatalf("a relation before any package: err = %v, want one naming line 1", err)
	}
}

func TestDebClosure(t *testing.T) {
	db := map[string]string{
		"curl":      "curl\n  Depends: libc6\n  Depends: libcurl4\n",
		"libcurl4":  "libcurl4\n  Depends: libc6\n  Depends: libssl3\n",
		"libc6":     "libc6\n  Depends: libgcc-s1\n",
		"libssl3":   "libssl3\n  Depends: debconf\n",
		"libgcc-s1": "libgcc-s1\n",
	}
	asked := 0
	depends := func(pkgs []string) (string, error) {
		asked++
		var b strings.Builder
		for _, p := range pkgs {
			b.WriteString(db[p])
		}
		return b.String(), nil
	}
	got, err := debClosure([]string{"curl"}, []string{"debconf"}, depends)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"curl", "libc6", "libcurl4", "libgcc-s1", "libssl3"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("closure = %v, want %v (debconf skipped)", got, want)
	}
	if asked > 4 {
		t.Fatalf("apt-cache asked %d times for a closure 4 levels deep", asked)
	}
}
