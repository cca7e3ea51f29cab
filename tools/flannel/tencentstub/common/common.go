// Package common is a stand-in for the part of Tencent Cloud's SDK that
// flanneld's tencentvpc backend uses: pointer helpers.
package common

// StringPtr returns a pointer to s.
func StringPtr(s string) *string { return &s }

// StringPtrs returns pointers to each of ss.
func StringPtrs(ss []string) []*string {
	out := make([]*string, len(ss))
	for i := range ss {
		out[i] = &ss[i]
	}
	return out
}

// BoolPtr returns a pointer to b.
func BoolPtr(b bool) *bool { return &b }
