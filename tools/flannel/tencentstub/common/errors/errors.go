// Package errors is a stand-in for the SDK's error type.
package errors

// TencentCloudSDKError is the SDK's error; the stand-in never returns one.
type TencentCloudSDKError struct{ Message string }

func (e *TencentCloudSDKError) Error() string { return e.Message }
