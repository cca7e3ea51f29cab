package policy

import (
	"context"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// ListCluster reads from the apiserver what Explain reads.
func ListCluster(ctx context.Context, cli kubernetes.Interface) (*Cluster, error) {
	c := &Cluster{}
	nodes, err := cli.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing Nodes: %w", err)
	}
	for i := range nodes.Items {
		c.Nodes = append(c.Nodes, &nodes.Items[i])
	}
	pods, err := cli.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing pods: %w", err)
	}
	for i := range pods.Items {
		c.Pods = append(c.Pods, &pods.Items[i])
	}
	nss, err := cli.CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing namespaces: %w", err)
	}
	for i := range nss.Items {
		c.Namespaces = append(c.Namespaces, &nss.Items[i])
	}
	nps, err := cli.NetworkingV1().NetworkPolicies("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing NetworkPolicies: %w", err)
	}
	for i := range nps.Items {
		c.Policies = append(c.Policies, &nps.Items[i])
	}
	return c, nil
}
