// Package clusterread reads from the apiserver what policy.Explain reads,
// through client-go's generated clientset, for twillctl and the tests.
// It stands apart from package policy so that twilld, which links policy,
// does not link the clientset: its package initialisation registers every
// API group and cost twilld 10 MiB of RSS at 5,000 Nodes.
package clusterread

import (
	"context"
	"errors"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/twill-net/twill/policy"
)

// Read reads from the apiserver what policy.Explain reads.
func Read(ctx context.Context, cli kubernetes.Interface) (*policy.Cluster, error) {
	var opts metav1.ListOptions
	nodes, nerr := cli.CoreV1().Nodes().List(ctx, opts)
	pods, perr := cli.CoreV1().Pods("").List(ctx, opts)
	nss, serr := cli.CoreV1().Namespaces().List(ctx, opts)
	nps, aerr := cli.NetworkingV1().NetworkPolicies("").List(ctx, opts)
	if err := errors.Join(listed("Nodes", nerr), listed("pods", perr), listed("namespaces", serr), listed("NetworkPolicies", aerr)); err != nil {
		return nil, err
	}
	return &policy.Cluster{Nodes: pointers(nodes.Items), Pods: pointers(pods.Items), Namespaces: pointers(nss.Items), Policies: pointers(nps.Items)}, nil
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
