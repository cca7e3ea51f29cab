package nl

var (
	_ Kernel       = (*Handle)(nil)
	_ RouteWatcher = (*Handle)(nil)
	_ NeighWatcher = (*Handle)(nil)
)
