// Package builtin links twill's built-in backends (eni, host-gw, vxlan,
// wireguard): each registers itself with backend.Default in init(). A
// binary imports it for that side effect only, next to any backend of its
// own:
//
//	import _ "github.com/twill-net/twill/backend/builtin"
package builtin

import (
	_ "github.com/twill-net/twill/backend/eni"
	_ "github.com/twill-net/twill/backend/hostgw"
	_ "github.com/twill-net/twill/backend/vxlan"
	_ "github.com/twill-net/twill/backend/wireguard"
)
