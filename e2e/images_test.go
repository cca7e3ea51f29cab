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
// the run, which only reads them. Each set is written once, the sets
// independently: a test waits only for the set it needs.
var images struct {
	sync.Mutex
	builds map[string]*imageBuild
}

// imageBuild is one set's write: once, then its directory or its error.
type imageBuild struct {
	once sync.Once
	dir  string
	err  error
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
	return imagesOf(t, bin, set, tag, false)
}

// labImagesNiced is labImages with tools/mkimage at the lowest CPU
// priority (nice 19), for a test that writes them before it waits for its
// lane, beside tests that bound a gap in traffic.
func labImagesNiced(t testing.TB, bin string, set imageSet, tag string) string {
	t.Helper()
	return imagesOf(t, bin, set, tag, true)
}

func imagesOf(t testing.TB, bin string, set imageSet, tag string, niced bool) string {
	t.Helper()
	key := strings.Join([]string{bin, string(set), tag}, " ")
	images.Lock()
	if images.builds == nil {
		images.builds = map[string]*imageBuild{}
	}
	b := images.builds[key]
	if b == nil {
		b = &imageBuild{}
		images.builds[key] = b
	}
	images.Unlock()
	b.once.Do(func() {
		// Said, should the write end the test that runs it (t.Fatal).
		b.err = fmt.Errorf("writing the lab images (%s) ended with the test %s", set, t.Name())
		b.dir, b.err = writeLabImages(t, bin, set, tag, niced)
	})
	if b.err != nil {
		t.Fatal(b.err)
	}
	return b.dir
}

func writeLabImages(t testing.TB, bin string, set imageSet, tag string, niced bool) (string, error) {
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
	cmd := exec.Command(filepath.Join(tools, "mkimage"), append(args, "-out", dir)...)
	if niced {
		// nice(1) sets the priority before mkimage starts, so that every
		// thread it makes has it.
		cmd = exec.Command("nice", append([]string{"-n", "19"}, cmd.Args...)...)
	}
	out, err := cmd.CombinedOutput()
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
	for k, b := range images.builds {
		if b.dir != "" {
			os.RemoveAll(b.dir)
		}
		delete(images.builds, k)
	}
}
