// Command mkimage writes twill's container image and the lab's pause image
// as docker-archive tarballs (make image), without Docker or a registry:
//
//	go run ./tools/mkimage -bin bin -pause build/images/pause -debs build/debs -out build/images -tag v0.2.0
//
// With -coredns (make kube-images) it also writes the Kubernetes lab's
// CoreDNS image (coredns.tar), with -flannel kube-flannel's (flannel.tar,
// for lab up --flannel), and with -e2e (make e2e-images) stand-ins
// for the e2e suite's test images (e2e-images.tar), from the binaries
// tools/kube/build.sh built.
//
// The tarballs load with `ctr -n k8s.io images import` or `docker load`.
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/twill-net/twill/lab/ociimage"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "mkimage:", err)
		os.Exit(1)
	}
}

func run() error {
	bin := flag.String("bin", "bin", "directory holding twilld, twill, twillctl and twill-wg")
	pause := flag.String("pause", "", "pause binary for the pause image; with it, also lab.tar from -bin's twill-lab (none: neither)")
	debs := flag.String("debs", "build/debs", "cache of the Debian packages the image is made of")
	out := flag.String("out", "build/images", "directory to write twill.tar (and pause.tar and lab.tar) to")
	tag := flag.String("tag", "dev", "image tag")
	repo := flag.String("repo", "twill.local/twill", "image repository")
	coredns := flag.String("coredns", "", "also write coredns.tar from this directory's coredns (build/kube/current)")
	flanneld := flag.String("flannel", "", "also write flannel.tar (kube-flannel's image, for lab up --flannel) with this flanneld")
	flannelCNI := flag.String("flannelcni", "", "with -flannel: twill's stand-in for flannel's CNI plugin (tools/flannelcni)")
	e2e := flag.String("e2e", "", "with -pause: also write e2e-images.tar from this directory's e2e.test, agnhost and coredns")
	flag.Parse()
	files, err := ociimage.FetchDebs(*debs, ociimage.TwillDebs)
	if err != nil {
		return err
	}
	ref := *repo + ":" + *tag
	path := filepath.Join(*out, "twill.tar")
	if err := ociimage.Write(path, ociimage.TwillImage(ref, *bin, files)); err != nil {
		return err
	}
	fmt.Printf("%s: %s\n", path, ref)
	if *pause != "" {
		ref := "twill.local/pause:" + *tag
		path := filepath.Join(*out, "pause.tar")
		if err := ociimage.Write(path, ociimage.PauseImage(ref, *pause)); err != nil {
			return err
		}
		fmt.Printf("%s: %s\n", path, ref)
		ref = "twill.local/lab:" + *tag
		path = filepath.Join(*out, "lab.tar")
		if err := ociimage.Write(path, ociimage.LabImage(ref, filepath.Join(*bin, "twill-lab"))); err != nil {
			return err
		}
		fmt.Printf("%s: %s\n", path, ref)
	}
	if *coredns != "" {
		path := filepath.Join(*out, "coredns.tar")
		ref, err := ociimage.WriteCoreDNS(path, *coredns)
		if err != nil {
			return err
		}
		fmt.Printf("%s: %s\n", path, ref)
	}
	if *flanneld != "" {
		if *flannelCNI == "" {
			return fmt.Errorf("-flannel %s needs -flannelcni", *flanneld)
		}
		ref := "twill.local/flannel:" + *tag
		path := filepath.Join(*out, "flannel.tar")
		if err := ociimage.Write(path, ociimage.FlannelImage(ref, *flanneld, *flannelCNI, "/usr/lib/cni", files)); err != nil {
			return err
		}
		fmt.Printf("%s: %s\n", path, ref)
	}
	if *e2e != "" {
		return e2eImages(*e2e, *pause, *debs, *out)
	}
	return nil
}

func e2eImages(kubeBin, pause, debs, out string) error {
	if pause == "" {
		return fmt.Errorf("-e2e %s: the e2e images need -pause too", kubeBin)
	}
	path := filepath.Join(out, "e2e-images.tar")
	missing, err := ociimage.WriteE2EImages(path, kubeBin, pause, debs)
	if err != nil {
		return err
	}
	fmt.Printf("%s: stand-ins for the e2e suite's images (%d others have none: Documentation/conformance.md)\n", path, len(missing))
	return nil
}
