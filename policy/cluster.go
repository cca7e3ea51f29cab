package policy

import (
	"context"
	"errors"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// ListCluster reads from the apiserver what Explain reads.
func ListCluster(ctx context.Context, cli kubernetes.Interface) (*Cluster, error) {
	var opts metav1.ListOptions
	nodes, nerr := cli.CoreV1().Nodes().List(ctx, opts)
	pods, perr := cli.CoreV1().Pods("").List(ctx, opts)
	nss, serr := cli.CoreV1().Namespaces().List(ctx, opts)
	nps, aerr := cli.NetworkingV1().NetworkPolicies("").List(ctx, opts)
	if err := errors.Join(listed("Nodes", nerr), listed("pods", perr), listed("namespaces", serr), listed("NetworkPolicies", aerr)); err != nil {
		return nil, err
	}
	return &Cluster{Nodes: pointers(nodes.Items), Pods: pointers(pods.Items), Namespaces: pointers(nss.Items), Policies: pointers(nps.Items)}, nil
}

// listed names what a failed list was listing.
func listed(what string, err error) error {
	if err != nil {
		return fmt.Errorf("listing %s: %w", what, err)
	}
	return nil
}

// pointers is a pointer to each of items.
func pointers[T any](items []T) []*T {
	out := make([]*T, len(items))
	for i := range items {
		out[i] = &items[i]
	}
	return out
}
