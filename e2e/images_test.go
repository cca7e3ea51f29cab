package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/twill-net/twill/testsupport/buildtest"
	"github.com/twill-net/twill/testsupport/kubetest"
)

// The Kubernetes labs' images are written once per test process, by
// tools/mkimage as make image writes them: built as a tool, without the
// race detector this package runs under (which made each write of them
// take about 50 s, for each lab, against 6 s), and shared by every lab of
// the run, which only reads them.
var images struct {
	sync.Mutex
	dirs map[string]string
	errs map[string]error
}

// imageSet names what a lab's image directory holds besides twill's,
// pause, CoreDNS and the lab's own images.
type imageSet string

const (
	kubeImages    imageSet = "kube"    // nothing more
	flannelImages imageSet = "flannel" // kube-flannel's (lab up --flannel)
	e2eImages     imageSet = "e2e"     // the e2e suite's stand-ins (lab conformance)
)

// labImages returns a directory holding the lab images of set, tagged tag,
// for lab up --image-dir; bin holds the binaries twill's image is made of.
func labImages(t testing.TB, bin string, set imageSet, tag string) string {
	t.Helper()
	key := strings.Join([]string{bin, string(set), tag}, " ")
	images.Lock()
	defer images.Unlock()
	if dir, ok := images.dirs[key]; ok {
		return dir
	}
	if err, ok := images.errs[key]; ok {
		t.Fatal(err)
	}
	dir, err := writeLabImages(t, bin, set, tag)
	if images.dirs == nil {
		images.dirs, images.errs = map[string]string{}, map[string]error{}
	}
	if err != nil {
		images.errs[key] = err
		t.Fatal(err)
	}
	images.dirs[key] = dir
	return dir
}

func writeLabImages(t testing.TB, bin string, set imageSet, tag string) (string, error) {
	tools := buildtest.Binaries(t, "github.com/twill-net/twill/tools/mkimage", "github.com/twill-net/twill/tools/pause")
	root := kubetest.Root(t)
	args := []string{"-bin", bin, "-pause", filepath.Join(tools, "pause"), "-debs", filepath.Join(root, "build", "debs"),
		"-tag", tag, "-coredns", kubeBinDir(t)}
	switch set {
	case kubeImages:
	case flannelImages:
		cni := buildtest.Binaries(t, "github.com/twill-net/twill/tools/flannelcni")
		args = append(args, "-flannel", flanneldBinary(t), "-flannelcni", filepath.Join(cni, "flannelcni"))
	case e2eImages:
		args = append(args, "-e2e", kubetest.E2ESuite(t))
	default:
		return "", fmt.Errorf("no image set %q", set)
	}
	dir, err := os.MkdirTemp("", "twill-test-images")
	if err != nil {
		return "", err
	}
	out, err := exec.Command(filepath.Join(tools, "mkimage"), append(args, "-out", dir)...).CombinedOutput()
	if err != nil {
		os.RemoveAll(dir)
		return "", fmt.Errorf("mkimage %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	t.Logf("lab images (%s): %s", set, strings.TrimSpace(string(out)))
	return dir, nil
}

// cleanupImages removes every directory labImages wrote; TestMain calls it
// after m.Run.
func cleanupImages() {
	images.Lock()
	defer images.Unlock()
	for k, dir := range images.dirs {
		os.RemoveAll(dir)
		delete(images.dirs, k)
	}
}
