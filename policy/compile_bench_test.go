package policy

import (
	"fmt"
	"testing"

	"github.com/twill-net/twill/testsupport/policyscale"
)

// BenchmarkCompile: the pure half of a change at 1,000 pods and 500
// policies (BenchmarkPolicyChange adds the kernel's).
func BenchmarkCompile(b *testing.B) {
	s := scale()
	for b.Loop() {
		Compile(s)
	}
}

// BenchmarkCompilerChange: Compiler's compile of one label change at
// 10,000 pods and 2,000 policies, and with 100 ClusterNetworkPolicies
// beside them (BenchmarkPolicyChangeAtScale adds the kernel's write).
func BenchmarkCompilerChange(b *testing.B) {
	for _, tc := range []struct {
		name string
		cnps int
	}{{"networkpolicies", 0}, {"with-clusternetworkpolicies", 100}} {
		b.Run(tc.name, func(b *testing.B) {
			s := scaleOf(10000, 2000)
			s.ClusterPolicies = versioned(policyscale.ClusterPolicies(tc.cnps))
			var k Compiler
			k.Compile(s)
			i := 0
			for b.Loop() {
				n := (i * 3) % len(s.Pods)
				p := s.Pods[n].DeepCopy()
				p.Labels = map[string]string{"app": p.Labels["app"], "role": fmt.Sprint("r", i%8)}
				p.ResourceVersion = fmt.Sprint("c", i)
				s.Pods[n] = p
				k.Compile(s)
				if !k.Incremental {
					b.Fatal("a label change compiled in full")
				}
				i++
			}
		})
	}
}
