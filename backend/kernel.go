package backend

import "github.com/twill-net/twill/nl"

// The views of the kernel the sync engines and backends use: the kernel
// seam's contract (package nl), under the names backends have used.
type (
	RouteTable   = nl.RouteTable
	RouteWatcher = nl.RouteWatcher
	NeighWatcher = nl.NeighWatcher
	NeighTable   = nl.NeighTable
	RuleTable    = nl.RuleTable
	Kernel       = nl.Kernel
)
