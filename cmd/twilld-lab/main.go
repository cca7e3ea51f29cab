// Command twilld-lab is twilld for the lab: the built-in backends plus the
// eni backend's simulated cloud provider ("sim"), which the shipped twilld
// does not link. twillctl lab up --backend eni runs it on the lab's
// simulated VPC; it is built the way a custom twilld with a third-party
// backend is (see Documentation/writing-a-backend.md).
package main

import (
	"os"

	"github.com/twill-net/twill/backend"
	_ "github.com/twill-net/twill/backend/builtin" // the built-in backends register in init()
	"github.com/twill-net/twill/cmd/twilld/app"
	_ "github.com/twill-net/twill/lab/eni/sim"
)

func main() { os.Exit(app.Main(backend.Default)) }
