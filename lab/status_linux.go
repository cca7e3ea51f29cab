package lab

import (
	"context"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// PrintStatus writes what a lab is made of and whether its parts run: for
// each node its address, subnet and daemons; then the pods. A Kubernetes
// lab's subnets, readiness and twill pods come from the apiserver.
func PrintStatus(ctx context.Context, s *State, out io.Writer) error {
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	kind := "etcd"
	if s.Kubernetes {
		kind = "Kubernetes"
	}
	nf := ""
	if s.Netfilter != "" {
		nf = "\tnetfilter " + s.Netfilter
	}
	if s.IPFamily != "" && s.IPFamily != "ipv4" {
		nf += "\t" + s.IPFamily
	}
	fmt.Fprintf(w, "lab %s\t%s\tbackend %s\tunderlay %s%s\tup since %s\n\n", s.Name, kind, s.Backend, s.Underlay, nf, s.Created.Format(time.RFC3339))
	running := func(ns, role string) string {
		for _, p := range s.Processes {
			if p.NS == ns && p.Role == role && alive(p.PID) {
				return fmt.Sprintf("pid %d", p.PID)
			}
		}
		return "not running"
	}
	if !s.Kubernetes {
		fmt.Fprintln(w, "NODE\tNETNS\tADDRESS\tSUBNET\tTWILLD")
		for _, n := range s.Nodes {
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", n.Name, n.NS, n.Addr, n.subnets(), running(n.NS, "twilld"))
		}
	} else {
		nodes, err := s.kubeNodes(ctx)
		if err != nil {
			return fmt.Errorf("reading Nodes from the lab's apiserver: %w", err)
		}
		if err := s.refreshPods(ctx); err != nil {
			return err
		}
		twill, err := s.kubePods(ctx, TwillNamespace, "")
		if err != nil {
			return err
		}
		fmt.Fprintf(w, "apiserver %s (%s); kubectl: twillctl lab kubectl --name %s ...\n\n", s.APIServer, running(s.prefix()+"-ul", "kube-apiserver"), s.Name)
		fmt.Fprintln(w, "NODE\tNETNS\tADDRESS\tPOD CIDR\tREADY\tTWILL POD\tCONTAINERD\tKUBELET\tKUBE-PROXY")
		for _, n := range s.Nodes {
			cidr, ready, pod := "-", "unknown", "none"
			for _, k := range nodes {
				if k.Name != n.Name {
					continue
				}
				cidr = k.Spec.PodCIDR
				if c, ok := nodeCondition(k, corev1.NodeReady); ok {
					ready = string(c.Status)
				}
			}
			for _, p := range twill {
				if p.Spec.NodeName == n.Name {
					pod = fmt.Sprintf("%s (%s)", p.Name, p.Status.Phase)
					if podReady(p) {
						pod = fmt.Sprintf("%s (ready)", p.Name)
					}
				}
			}
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", n.Name, n.NS, n.Addr, cidr, ready, pod,
				running(n.NS, "containerd"), running(n.NS, "kubelet"), running(n.NS, "kube-proxy"))
		}
	}
	fmt.Fprintln(w, "\nPOD\tNODE\tIP")
	for _, p := range s.Pods {
		fmt.Fprintf(w, "%s\t%s\t%s\n", p.Name, p.Node, p.addrList())
	}
	return w.Flush()
}
