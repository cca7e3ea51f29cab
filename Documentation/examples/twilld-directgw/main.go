// Command twilld-directgw is a custom twilld: the built-in backends plus
// the example directgw backend, registered by blank import.
package main

import (
	"os"

	_ "github.com/twill-net/twill/Documentation/examples/directgw"
	"github.com/twill-net/twill/backend"
	_ "github.com/twill-net/twill/backend/builtin"
	"github.com/twill-net/twill/cmd/twilld/app"
)

func main() { os.Exit(app.Main(backend.Default)) }
