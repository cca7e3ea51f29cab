// Package ociimage writes container images as docker-archive tarballs, the
// format `ctr images import` and `docker load` both read, from files on this
// machine: static binaries, and Debian packages unpacked as layers. It needs
// no container engine and no registry, so the lab and the tests can run
// twill's real image under containerd on a machine that has neither.
//
// The image layout is go-containerregistry's (v1.Image, layers, config);
// this package only says what goes in.
package ociimage

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"sort"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/twill-net/twill/internal/atomicfile"
)

// File is a file copied from this machine into an image.
type File struct {
	Src  string      // path on this machine
	Data []byte      // the file's content when Src is empty
	Dst  string      // absolute path in the image
	Mode os.FileMode // permission bits; 0 means 0755
}

// Spec describes an image.
type Spec struct {
	// Ref names the image, for example twill.local/twill:v0.2.0.
	Ref        string
	Entrypoint []string
	Cmd        []string
	Env        []string
	// Debs are Debian packages whose files make up the lower layers, one
	// layer each, in order.
	Debs []string
	// Files, Symlinks (path in the image -> target) and Dirs (empty
	// directories, mode 1777 for /tmp, 0755 otherwise) make the top layer.
	Files    []File
	Symlinks map[string]string
	Dirs     []string
}

// Write builds the image and writes it to out as a docker-archive tarball
// tagged spec.Ref. The file appears complete or not at all.
func Write(out string, spec Spec) error { return WriteAll(out, []Spec{spec}) }

// WriteAll builds the images and writes them to out as one docker-archive
// tarball, each tagged with its Ref: a layer several images hold (a Debian
// package, or the same files) is built once and stored once.
func WriteAll(out string, specs []Spec) error {
	layers := map[string]v1.Layer{}
	images := map[name.Reference]v1.Image{}
	for _, spec := range specs {
		tag, err := name.NewTag(spec.Ref, name.WeakValidation)
		if err != nil {
			return fmt.Errorf("image reference %q: %w", spec.Ref, err)
		}
		img, err := build(spec, layers)
		if err != nil {
			return err
		}
		images[tag] = img
	}
	return atomicfile.WriteFrom(out, func(w io.Writer) error { return tarball.MultiRefWrite(images, w) }, 0o644)
}

// build assembles one image, taking its layers from made when an earlier
// image made them (keyed by a Debian package's path, or by the top layer's
// files, links and directories) and adding those it makes.
func build(spec Spec, made map[string]v1.Layer) (v1.Image, error) {
	layer := func(key string, make func() (v1.Layer, error)) (v1.Layer, error) {
		if l, ok := made[key]; ok {
			return l, nil
		}
		l, err := make()
		if err == nil {
			made[key] = l
		}
		return l, err
	}
	var layers []v1.Layer
	for _, deb := range spec.Debs {
		l, err := layer("deb "+deb, func() (v1.Layer, error) { return debLayer(deb) })
		if err != nil {
			return nil, err
		}
		layers = append(layers, l)
	}
	// fmt prints the map of links sorted, so equal tops have one key.
	top, err := layer(fmt.Sprint("files ", spec.Files, spec.Symlinks, spec.Dirs), func() (v1.Layer, error) {
		return filesLayer(spec.Files, spec.Symlinks, spec.Dirs)
	})
	if err != nil {
		return nil, err
	}
	layers = append(layers, top)
	img, err := mutate.AppendLayers(empty.Image, layers...)
	if err != nil {
		return nil, fmt.Errorf("assembling %s: %w", spec.Ref, err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.Architecture, cf.OS = "amd64", "linux"
	cf.Config.Entrypoint, cf.Config.Cmd = spec.Entrypoint, spec.Cmd
	cf.Config.Env = append([]string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}, spec.Env...)
	return mutate.ConfigFile(img, cf)
}

// Ref reads the tag a tarball written by Write carries.
func Ref(tarballPath string) (string, error) {
	m, err := tarball.LoadManifest(func() (io.ReadCloser, error) { return os.Open(tarballPath) })
	if err != nil {
		return "", fmt.Errorf("reading %s: %w", tarballPath, err)
	}
	if len(m) != 1 || len(m[0].RepoTags) != 1 {
		return "", fmt.Errorf("reading %s: want exactly one image with one tag", tarballPath)
	}
	return m[0].RepoTags[0], nil
}

// debLayer is a Debian package's files as a layer (dpkg-deb unpacks it, so
// every compression the package may use is handled).
func debLayer(deb string) (v1.Layer, error) {
	out, err := exec.Command("dpkg-deb", "--fsys-tarfile", deb).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			err = fmt.Errorf("%w: %s", err, strings.TrimSpace(string(ee.Stderr)))
		}
		return nil, fmt.Errorf("unpacking %s: %w", deb, err)
	}
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(out)), nil })
}

// filesLayer is one layer holding files (and their parent directories) and
// symlinks, with fixed times and owners so the same inputs make the same
// layer.
func filesLayer(files []File, symlinks map[string]string, extraDirs []string) (v1.Layer, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	epoch := time.Unix(0, 0)
	dirs := map[string]bool{}
	var addDir func(d string) error
	addDir = func(d string) error {
		if d == "/" || d == "." || dirs[d] {
			return nil
		}
		if err := addDir(path.Dir(d)); err != nil {
			return err
		}
		dirs[d] = true
		return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: strings.TrimPrefix(d, "/") + "/", Mode: 0o755, ModTime: epoch})
	}
	for _, d := range extraDirs {
		if err := addDir(path.Dir(d)); err != nil {
			return nil, err
		}
		mode := int64(0o755)
		if d == "/tmp" {
			mode = 0o1777
		}
		dirs[d] = true
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: strings.TrimPrefix(d, "/") + "/", Mode: mode, ModTime: epoch}); err != nil {
			return nil, err
		}
	}
	for _, f := range files {
		if !path.IsAbs(f.Dst) {
			return nil, fmt.Errorf("image file %s: destination %q must be absolute", f.Src, f.Dst)
		}
		data := f.Data
		if f.Src != "" {
			var err error
			if data, err = os.ReadFile(f.Src); err != nil {
				return nil, fmt.Errorf("image file: %w", err)
			}
		}
		if err := addDir(path.Dir(f.Dst)); err != nil {
			return nil, err
		}
		mode := f.Mode
		if mode == 0 {
			mode = 0o755
		}
		hdr := &tar.Header{Typeflag: tar.TypeReg, Name: strings.TrimPrefix(f.Dst, "/"), Mode: int64(mode.Perm()), Size: int64(len(data)), ModTime: epoch}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, err
		}
		if _, err := tw.Write(data); err != nil {
			return nil, err
		}
	}
	links := make([]string, 0, len(symlinks))
	for l := range symlinks {
		links = append(links, l)
	}
	sort.Strings(links)
	for _, l := range links {
		if err := addDir(path.Dir(l)); err != nil {
			return nil, err
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: strings.TrimPrefix(l, "/"), Linkname: symlinks[l], Mode: 0o777, ModTime: epoch}); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	data := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil })
}
