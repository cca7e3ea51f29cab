// Command twill-lab is the lab half of twillctl: `twillctl lab`, `twillctl
// etcd` and `twillctl cni` run it (see cmd/twill-lab/app). The image ships
// twillctl without it.
package main

import (
	"os"

	"github.com/twill-net/twill/cmd/twill-lab/app"
)

func main() { os.Exit(app.Main()) }
