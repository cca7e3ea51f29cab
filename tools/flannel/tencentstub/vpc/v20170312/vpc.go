// Package v20170312 is a stand-in for Tencent Cloud's VPC client: the
// types flanneld's tencentvpc backend names, and calls that always fail.
package v20170312

import "errors"

// ErrStub is what every call returns.
var ErrStub = errors.New("tencentcloud: this flanneld was built with a stub SDK; the tencentvpc backend is unavailable")

// Client is the VPC API client.
type Client struct{}

// NewClientWithSecretId returns a client whose calls fail.
func NewClientWithSecretId(id, key, region string) (*Client, error) { return &Client{}, nil }

// Filter narrows a describe call.
type Filter struct {
	Name   *string
	Values []*string
}

// Route is one route of a route table.
type Route struct {
	RouteId              *uint64
	DestinationCidrBlock *string
	GatewayType          *string
	GatewayId            *string
	RouteType            *string
	Enabled              *bool
}

// RouteTable is a VPC route table.
type RouteTable struct {
	RouteTableId *string
	RouteSet     []*Route
}

// DescribeRouteTablesRequest asks for route tables.
type DescribeRouteTablesRequest struct{ Filters []*Filter }

// DescribeRouteTablesResponse answers it.
type DescribeRouteTablesResponse struct {
	Response *struct{ RouteTableSet []*RouteTable }
}

// DeleteRoutesRequest deletes routes.
type DeleteRoutesRequest struct {
	RouteTableId *string
	Routes       []*Route
}

// DeleteRoutesResponse answers it.
type DeleteRoutesResponse struct{}

// CreateRoutesRequest creates routes.
type CreateRoutesRequest struct {
	RouteTableId *string
	Routes       []*Route
}

// CreateRoutesResponse answers it.
type CreateRoutesResponse struct{}

// NewDescribeRouteTablesRequest returns an empty request.
func NewDescribeRouteTablesRequest() *DescribeRouteTablesRequest {
	return &DescribeRouteTablesRequest{}
}

// NewDeleteRoutesRequest returns an empty request.
func NewDeleteRoutesRequest() *DeleteRoutesRequest { return &DeleteRoutesRequest{} }

// NewCreateRoutesRequest returns an empty request.
func NewCreateRoutesRequest() *CreateRoutesRequest { return &CreateRoutesRequest{} }

// DescribeRouteTables fails.
func (c *Client) DescribeRouteTables(*DescribeRouteTablesRequest) (*DescribeRouteTablesResponse, error) {
	return nil, ErrStub
}

// DeleteRoutes fails.
func (c *Client) DeleteRoutes(*DeleteRoutesRequest) (*DeleteRoutesResponse, error) {
	return nil, ErrStub
}

// CreateRoutes fails.
func (c *Client) CreateRoutes(*CreateRoutesRequest) (*CreateRoutesResponse, error) {
	return nil, ErrStub
}
