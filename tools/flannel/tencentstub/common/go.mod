module github.com/tencentcloud/tencentcloud-sdk-go/tencentcloud/common

// A stand-in for Tencent Cloud's SDK, which the Go module proxy here does
// not serve. flanneld's tencentvpc backend links it; the tests never use
// that backend, so every call fails with ErrStub.

go 1.22
