package lab

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/twill-net/twill/dist"
)

// HelmRelease is the release name lab up --helm installs twill as.
const HelmRelease = "twill"

// HelmValues are the values lab up --helm installs dist/chart/twill with:
// the same edits InstallManifest makes to dist/kube-twill.yml (the image,
// the backend, and the IPv6 network of a dual-stack or IPv6-only lab),
// then extra (helm --set, as given to lab up --helm-set), which win.
func HelmValues(image, backendType, family string, extra []string) []string {
	repo, tag := splitImage(image)
	args := []string{"--set-string", "image.repository=" + repo, "--set-string", "image.tag=" + tag,
		"--set-string", "backend.type=" + backendType}
	switch family {
	case "dual":
		args = append(args, "--set-string", "ipv6Network="+ClusterCIDRV6)
	case "ipv6":
		args = append(args, "--set-json", `network=""`, "--set-string", "ipv6Network="+ClusterCIDRV6)
	}
	for _, e := range extra {
		args = append(args, "--set", e)
	}
	return args
}

// splitImage splits an image reference into repository and tag (latest
// when it names none).
func splitImage(ref string) (repo, tag string) {
	slash := strings.LastIndex(ref, "/")
	if i := strings.LastIndex(ref, ":"); i > slash {
		return ref[:i], ref[i+1:]
	}
	return ref, "latest"
}

// writeChart writes the embedded chart to dir/chart and returns its path.
func writeChart(dir string) (string, error) {
	sub, err := fs.Sub(dist.Chart, dist.ChartDir)
	if err != nil {
		return "", err
	}
	out := filepath.Join(dir, "chart", "twill")
	if err := os.RemoveAll(out); err != nil {
		return "", err
	}
	if err := os.CopyFS(out, sub); err != nil {
		return "", fmt.Errorf("writing the chart to %s: %w", out, err)
	}
	return out, nil
}

// helmEnv keeps helm's cache, configuration and data in the lab's
// directory, and points it at the lab's apiserver as its admin: nothing
// lands in the user's home.
func (s *State) helmEnv() []string {
	h := filepath.Join(s.Dir, "helm")
	return []string{"KUBECONFIG=" + s.AdminKubeconfig, "HELM_CACHE_HOME=" + filepath.Join(h, "cache"),
		"HELM_CONFIG_HOME=" + filepath.Join(h, "config"), "HELM_DATA_HOME=" + filepath.Join(h, "data")}
}
