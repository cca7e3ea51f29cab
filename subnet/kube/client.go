package kube

import (
	"context"
	"errors"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// ClientOptions says how to reach the apiserver.
type ClientOptions struct {
	// Kubeconfig is --kubeconfig-file; empty means in-cluster (the pod's
	// ServiceAccount).
	Kubeconfig string
	// APIURL is --kube-api-url; it overrides the kubeconfig's server.
	APIURL    string
	UserAgent string
}

// NewClient returns a core/v1 client. It speaks protobuf, which the
// apiserver encodes and the informer decodes with far less garbage than
// JSON on large clusters.
func NewClient(o ClientOptions) (corev1client.CoreV1Interface, error) {
	var (
		cfg *rest.Config
		err error
	)
	if o.Kubeconfig == "" && o.APIURL == "" {
		cfg, err = rest.InClusterConfig()
		if err != nil {
			return nil, fmt.Errorf("--kubeconfig-file not set and not running in a pod: %w", err)
		}
	} else {
		cfg, err = clientcmd.BuildConfigFromFlags(o.APIURL, o.Kubeconfig)
		if err != nil {
			return nil, fmt.Errorf("--kubeconfig-file %q / --kube-api-url %q: %w", o.Kubeconfig, o.APIURL, err)
		}
	}
	cfg.UserAgent = o.UserAgent
	cfg.ContentType = "application/vnd.kubernetes.protobuf"
	cfg.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	cfg.QPS, cfg.Burst = 20, 40
	c, err := corev1client.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client for %s: %w", cfg.Host, err)
	}
	return c, nil
}

// NodeName finds the local node: NODE_NAME (the DaemonSet sets it from the
// downward API), else the node the pod POD_NAMESPACE/POD_NAME runs on,
// which needs "get pods" (not granted by dist/kube-twill.yml's role).
func NodeName(ctx context.Context, c corev1client.PodsGetter, getenv func(string) string) (string, error) {
	if n := getenv("NODE_NAME"); n != "" {
		return n, nil
	}
	pod, ns := getenv("POD_NAME"), getenv("POD_NAMESPACE")
	if pod == "" || ns == "" {
		return "", errors.New("cannot tell which node this is: set NODE_NAME (the DaemonSet sets it from spec.nodeName), or POD_NAME and POD_NAMESPACE")
	}
	p, err := c.Pods(ns).Get(ctx, pod, metav1.GetOptions{})
	if err != nil {
		return "", fmt.Errorf("finding the node from pod %s/%s (POD_NAMESPACE/POD_NAME): %w", ns, pod, err)
	}
	if p.Spec.NodeName == "" {
		return "", fmt.Errorf("pod %s/%s (POD_NAMESPACE/POD_NAME): spec.nodeName is empty", ns, pod)
	}
	return p.Spec.NodeName, nil
}
