package kube

import (
	"context"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// Client is the slice of the Kubernetes API twilld uses: Nodes (list,
// watch, patch of the status subresource) and, only to find the local node
// when NODE_NAME is unset, one Pod get.
type Client interface {
	ListNodes(ctx context.Context, opts metav1.ListOptions) (*corev1.NodeList, error)
	WatchNodes(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error)
	PatchNodeStatus(ctx context.Context, name string, pt types.PatchType, data []byte) (*corev1.Node, error)
	GetPod(ctx context.Context, namespace, name string) (*corev1.Pod, error)
}

// ClientOptions says how to reach the apiserver.
type ClientOptions struct {
	// Kubeconfig is --kubeconfig-file; empty means in-cluster (the pod's
	// ServiceAccount).
	Kubeconfig string
	// APIURL is --kube-api-url; it overrides the kubeconfig's server.
	APIURL    string
	UserAgent string
}

// restClient speaks core/v1 with a scheme holding core/v1 alone. client-go's
// generated clientset registers every API group at start-up, which costs
// twilld about 9 MiB of resident memory for types it never reads.
type restClient struct {
	rc     *rest.RESTClient
	params runtime.ParameterCodec
}

// NewClient returns a Client for the apiserver. It speaks protobuf, which
// the informer decodes with far less garbage than JSON on large clusters.
func NewClient(o ClientOptions) (Client, error) {
	cfg, err := RESTConfig(o)
	if err != nil {
		return nil, err
	}
	return NewClientFor(cfg)
}

// RESTConfig is how to reach the apiserver: the kubeconfig, else the pod's
// ServiceAccount.
func RESTConfig(o ClientOptions) (*rest.Config, error) {
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
	return cfg, nil
}

// NewClientFor returns a Client for a rest.Config.
func NewClientFor(cfg *rest.Config) (Client, error) {
	rc, params, err := ProtobufClient(cfg, "/api", corev1.SchemeGroupVersion, corev1.AddToScheme)
	if err != nil {
		return nil, err
	}
	return &restClient{rc: rc, params: params}, nil
}

// ProtobufClient is a REST client for one API group version (its types
// added by add), under path ("/api" for core, "/apis" for the others),
// speaking protobuf, with a scheme holding that group alone.
func ProtobufClient(cfg *rest.Config, path string, gv schema.GroupVersion, add func(*runtime.Scheme) error) (*rest.RESTClient, runtime.ParameterCodec, error) {
	scheme := runtime.NewScheme()
	if err := add(scheme); err != nil {
		return nil, nil, err
	}
	metav1.AddToGroupVersion(scheme, gv)
	c := rest.CopyConfig(cfg)
	c.APIPath = path
	c.GroupVersion = &gv
	c.NegotiatedSerializer = serializer.NewCodecFactory(scheme).WithoutConversion()
	c.ContentType = runtime.ContentTypeProtobuf
	c.AcceptContentTypes = runtime.ContentTypeProtobuf + "," + runtime.ContentTypeJSON
	if c.QPS == 0 {
		c.QPS, c.Burst = 20, 40
	}
	rc, err := rest.RESTClientFor(c)
	if err != nil {
		return nil, nil, fmt.Errorf("kubernetes client for %s %s: %w", cfg.Host, gv, err)
	}
	return rc, runtime.NewParameterCodec(scheme), nil
}

func (c *restClient) ListNodes(ctx context.Context, opts metav1.ListOptions) (*corev1.NodeList, error) {
	out := &corev1.NodeList{}
	err := c.rc.Get().Resource("nodes").VersionedParams(&opts, c.params).Do(ctx).Into(out)
	return out, err
}

func (c *restClient) WatchNodes(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	opts.Watch = true
	return c.rc.Get().Resource("nodes").VersionedParams(&opts, c.params).Watch(ctx)
}

func (c *restClient) PatchNodeStatus(ctx context.Context, name string, pt types.PatchType, data []byte) (*corev1.Node, error) {
	out := &corev1.Node{}
	err := c.rc.Patch(pt).Resource("nodes").Name(name).SubResource("status").
		VersionedParams(&metav1.PatchOptions{FieldManager: "twilld"}, c.params).Body(data).Do(ctx).Into(out)
	return out, err
}

func (c *restClient) GetPod(ctx context.Context, namespace, name string) (*corev1.Pod, error) {
	out := &corev1.Pod{}
	err := c.rc.Get().Namespace(namespace).Resource("pods").Name(name).Do(ctx).Into(out)
	return out, err
}

// NodeName finds the local node: NODE_NAME (the DaemonSet sets it from the
// downward API), else the node the pod POD_NAMESPACE/POD_NAME runs on,
// which needs "get pods" (not granted by dist/kube-twill.yml's role).
func NodeName(ctx context.Context, c Client, getenv func(string) string) (string, error) {
	if n := getenv("NODE_NAME"); n != "" {
		return n, nil
	}
	pod, ns := getenv("POD_NAME"), getenv("POD_NAMESPACE")
	if pod == "" || ns == "" {
		return "", errors.New("cannot tell which node this is: set NODE_NAME (the DaemonSet sets it from spec.nodeName), or POD_NAME and POD_NAMESPACE")
	}
	p, err := c.GetPod(ctx, ns, pod)
	if err != nil {
		return "", fmt.Errorf("finding the node from pod %s/%s (POD_NAMESPACE/POD_NAME): %w", ns, pod, err)
	}
	if p.Spec.NodeName == "" {
		return "", fmt.Errorf("pod %s/%s (POD_NAMESPACE/POD_NAME): spec.nodeName is empty", ns, pod)
	}
	return p.Spec.NodeName, nil
}
