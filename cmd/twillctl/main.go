// Command twillctl is twill's operator and lab tool, with the built-in
// backends (status computes their desired state; config put validates
// their configuration).
package main

import (
	"os"

	"github.com/twill-net/twill/backend"
	_ "github.com/twill-net/twill/backend/eni" // built-in backends register in init()
	_ "github.com/twill-net/twill/backend/hostgw"
	_ "github.com/twill-net/twill/backend/vxlan"
	_ "github.com/twill-net/twill/backend/wireguard"
	"github.com/twill-net/twill/cmd/twillctl/app"
)

func main() { os.Exit(app.Main(backend.Default)) }
