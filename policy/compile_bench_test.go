package policy

import "testing"

// BenchmarkCompile: the pure half of a change at 1,000 pods and 500
// policies (BenchmarkPolicyChange adds the kernel's).
func BenchmarkCompile(b *testing.B) {
	s := scale()
	for b.Loop() {
		Compile(s)
	}
}
