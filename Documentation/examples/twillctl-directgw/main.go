// Command twillctl-directgw is a custom twillctl: the built-in backends plus
// the example directgw backend, so that `twillctl status` checks a directgw
// node's kernel state and `twillctl config put` validates its configuration.
package main

import (
	"os"

	_ "github.com/twill-net/twill/Documentation/examples/directgw"
	"github.com/twill-net/twill/backend"
	_ "github.com/twill-net/twill/backend/builtin"
	"github.com/twill-net/twill/cmd/twillctl/app"
)

func main() { os.Exit(app.Main(backend.Default)) }
