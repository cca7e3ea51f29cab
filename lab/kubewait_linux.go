package lab

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/twill-net/twill/lab/cluster"
)

// TwillNamespace and TwillDaemonSet name what dist/kube-twill.yml creates.
const (
	TwillNamespace = "kube-twill"
	TwillDaemonSet = "kube-twill-ds"
)

func (s *State) kubeNodes(ctx context.Context) ([]corev1.Node, error) {
	var l corev1.NodeList
	if err := s.apiJSON(ctx, "/api/v1/nodes", &l); err != nil {
		return nil, err
	}
	return l.Items, nil
}

// kubePods lists the pods of a namespace matching a label selector.
func (s *State) kubePods(ctx context.Context, namespace, selector string) ([]corev1.Pod, error) {
	var l corev1.PodList
	path := "/api/v1/namespaces/" + namespace + "/pods"
	if selector != "" {
		path += "?labelSelector=" + selector
	}
	if err := s.apiJSON(ctx, path, &l); err != nil {
		return nil, err
	}
	return l.Items, nil
}

// nodeCondition returns a Node's condition of type t.
func nodeCondition(n corev1.Node, t corev1.NodeConditionType) (corev1.NodeCondition, bool) {
	for _, c := range n.Status.Conditions {
		if c.Type == t {
			return c, true
		}
	}
	return corev1.NodeCondition{}, false
}

// TwillReady says what still keeps twill from being installed and working
// on every node: the DaemonSet rolled out (every pod updated and ready),
// every Node Ready with NetworkUnavailable=False. "" means all is well.
func (s *State) TwillReady(ctx context.Context) (string, error) {
	var ds appsv1.DaemonSet
	if err := s.apiJSON(ctx, "/apis/apps/v1/namespaces/"+TwillNamespace+"/daemonsets/"+TwillDaemonSet, &ds); err != nil {
		return "", err
	}
	st := ds.Status
	if st.ObservedGeneration < ds.Generation || st.DesiredNumberScheduled != int32(len(s.Nodes)) ||
		st.UpdatedNumberScheduled != st.DesiredNumberScheduled || st.NumberReady != st.DesiredNumberScheduled {
		why := fmt.Sprintf("DaemonSet %s: %d of %d pods updated, %d ready", TwillDaemonSet, st.UpdatedNumberScheduled, len(s.Nodes), st.NumberReady)
		if pods, err := s.kubePods(ctx, TwillNamespace, ""); err == nil {
			for _, p := range pods {
				if d := podTrouble(p); d != "" {
					why += "; " + d
				}
			}
		}
		return why, nil
	}
	nodes, err := s.kubeNodes(ctx)
	if err != nil {
		return "", err
	}
	for _, n := range nodes {
		if c, ok := nodeCondition(n, corev1.NodeReady); !ok || c.Status != corev1.ConditionTrue {
			return fmt.Sprintf("Node %s not Ready (%s)", n.Name, c.Message), nil
		}
		if c, ok := nodeCondition(n, corev1.NodeNetworkUnavailable); !ok || c.Status != corev1.ConditionFalse {
			return fmt.Sprintf("Node %s: NetworkUnavailable is not False", n.Name), nil
		}
	}
	return "", nil
}

// waitTwill waits for TwillReady.
func (s *State) waitTwill(ctx context.Context) error {
	return cluster.Poll(ctx, 3*time.Minute, "twill to roll out", func() error {
		why, err := s.TwillReady(ctx)
		if err == nil && why != "" {
			err = fmt.Errorf("%s", why)
		}
		return s.nodeError(err)
	})
}

// deployWorkload applies the lab's test workload and waits until every pod
// is ready, then records the pods.
func (s *State) deployWorkload(ctx context.Context, perNode int) error {
	m := workloadManifest(s.LabImage, perNode*len(s.Nodes), s.Nodes[0].Name)
	if out, err := s.Kubectl(ctx, strings.NewReader(m), "apply", "-f", "-"); err != nil {
		return fmt.Errorf("kubectl apply (lab workload): %w\n%s", err, out)
	}
	want := perNode*len(s.Nodes) + 1
	if err := cluster.Poll(ctx, 3*time.Minute, "the lab's pods to be ready", func() error {
		if err := s.refreshPods(ctx); err != nil {
			return err
		}
		if len(s.Pods) < want {
			return fmt.Errorf("%d of %d pods ready", len(s.Pods), want)
		}
		return nil
	}); err != nil {
		return err
	}
	// kube-proxy programs a Service's endpoints a moment after they are
	// ready: wait until every node routes the Service.
	to, err := s.echoServiceTargets(ctx)
	if err != nil {
		return err
	}
	var from []Vantage
	for _, n := range s.Nodes {
		from = append(from, Vantage{Name: n.Name, NetNS: "/var/run/netns/" + n.NS})
	}
	return cluster.Poll(ctx, time.Minute, "kube-proxy on every node to route Service echo", func() error {
		if r := Matrix(ctx, s.BinDir, from, to); r.Failed > 0 {
			return fmt.Errorf("%d of %d probes from the nodes to Service echo (%v) failed", r.Failed, len(from)*len(to), to)
		}
		return nil
	})
}

// echoServiceTargets are the lab's echo Service's ClusterIPs, one per
// family, port 80: "svc/echo", and "svc/echo-v6" for a dual-stack one's
// second.
func (s *State) echoServiceTargets(ctx context.Context) ([]Target, error) {
	var svc corev1.Service
	if err := s.apiJSON(ctx, "/api/v1/namespaces/"+kubeNamespace+"/services/echo", &svc); err != nil {
		return nil, err
	}
	ips := svc.Spec.ClusterIPs
	if len(ips) == 0 {
		ips = []string{svc.Spec.ClusterIP}
	}
	var to []Target
	for i, c := range ips {
		ip, err := netip.ParseAddr(c)
		if err != nil {
			return nil, fmt.Errorf("service echo: ClusterIP %q: %w", c, err)
		}
		name := "svc/echo"
		if i > 0 {
			name += "-v6"
		}
		to = append(to, Target{Name: name, Addr: netip.AddrPortFrom(ip, 80)})
	}
	return to, nil
}

// podTrouble says why a pod is not ready, from its containers' states
// ("" when it is ready).
func podTrouble(p corev1.Pod) string {
	if podReady(p) {
		return ""
	}
	var parts []string
	for _, cs := range append(slices.Clone(p.Status.InitContainerStatuses), p.Status.ContainerStatuses...) {
		switch {
		case cs.State.Waiting != nil:
			parts = append(parts, fmt.Sprintf("%s waiting (%s: %s)", cs.Name, cs.State.Waiting.Reason, cs.State.Waiting.Message))
		case cs.State.Terminated != nil && cs.State.Terminated.ExitCode != 0:
			parts = append(parts, fmt.Sprintf("%s exited %d (%s: %s)", cs.Name, cs.State.Terminated.ExitCode, cs.State.Terminated.Reason, cs.State.Terminated.Message))
		case cs.LastTerminationState.Terminated != nil:
			t := cs.LastTerminationState.Terminated
			parts = append(parts, fmt.Sprintf("%s restarted %d times, last exit %d (%s: %s)", cs.Name, cs.RestartCount, t.ExitCode, t.Reason, strings.TrimSpace(t.Message)))
		}
	}
	if len(parts) == 0 {
		for _, c := range p.Status.Conditions {
			if c.Status != corev1.ConditionTrue && c.Message != "" {
				parts = append(parts, fmt.Sprintf("%s: %s", c.Type, c.Message))
			}
		}
	}
	return fmt.Sprintf("pod %s on %s: %s", p.Name, p.Spec.NodeName, strings.Join(parts, "; "))
}

// refreshPods reads the lab workload's ready pods from the apiserver: a
// Kubernetes lab's pods come and go (deleted, rescheduled), so the
// recorded list is only the last seen.
func (s *State) refreshPods(ctx context.Context) error {
	pods, err := s.kubePods(ctx, kubeNamespace, "")
	if err != nil {
		return err
	}
	var ready []Pod
	for _, p := range pods {
		if p.DeletionTimestamp != nil || !podReady(p) {
			continue
		}
		pod := Pod{Name: p.Name, Node: p.Spec.NodeName, UID: string(p.UID)}
		for _, pip := range p.Status.PodIPs {
			ip, err := netip.ParseAddr(pip.IP)
			switch {
			case err != nil:
			case !pod.IP.IsValid():
				pod.IP = ip
			case ip.Is6() && pod.IP.Is4():
				pod.IPv6 = ip
			}
		}
		if pod.IP.IsValid() {
			ready = append(ready, pod)
		}
	}
	slices.SortFunc(ready, func(a, b Pod) int {
		return strings.Compare(a.Node+"/"+a.Name, b.Node+"/"+b.Name)
	})
	s.Pods = ready
	return nil
}

func podReady(p corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// RefreshPods reads the ready pods of the lab's namespace again into
// s.Pods (not saved).
func (s *State) RefreshPods(ctx context.Context) error { return s.refreshPods(ctx) }
