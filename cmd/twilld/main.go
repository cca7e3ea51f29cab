// Command twilld is twill's per-node daemon, with the built-in backends.
package main

import (
	"os"

	"github.com/twill-net/twill/backend"
	_ "github.com/twill-net/twill/backend/eni" // built-in backends register in init()
	_ "github.com/twill-net/twill/backend/hostgw"
	_ "github.com/twill-net/twill/backend/vxlan"
	_ "github.com/twill-net/twill/backend/wireguard"
	"github.com/twill-net/twill/cmd/twilld/app"
)

func main() { os.Exit(app.Main(backend.Default)) }
