// Command twillctl is twill's operator and lab tool, with the built-in
// backends (status computes their desired state; config put validates
// their configuration).
package main

import (
	"os"

	"github.com/twill-net/twill/backend"
	_ "github.com/twill-net/twill/backend/builtin" // the built-in backends register in init()
	"github.com/twill-net/twill/cmd/twillctl/app"
)

func main() { os.Exit(app.Main(backend.Default)) }
