module github.com/tencentcloud/tencentcloud-sdk-go/tencentcloud/vpc

// A stand-in for Tencent Cloud's VPC SDK (see ../common/go.mod).

go 1.22
