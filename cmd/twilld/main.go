// Command twilld is twill's per-node daemon, with the built-in backends.
package main

import (
	"os"

	"github.com/twill-net/twill/backend"
	_ "github.com/twill-net/twill/backend/builtin" // the built-in backends register in init()
	"github.com/twill-net/twill/cmd/twilld/app"
)

func main() { os.Exit(app.Main(backend.Default)) }
