package lab

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/twill-net/twill/lab/cluster"
)

// ClusterDNS is the kube-dns Service's ClusterIP, the nameserver every
// kubelet puts in its pods' resolv.conf (kubeletConfig's clusterDNS), in
// an IPv4 or dual-stack lab (kubeNet.DNS).
const ClusterDNS = "10.96.0.10"

// corednsYAML is the lab's DNS add-on, as a cluster installs it: CoreDNS
// in kube-system answering for cluster.local from the API (the kubernetes
// plugin), behind the kube-dns Service at ClusterDNS. It has no upstream:
// the lab has no internet, so other names are refused.
const corednsYAML = `apiVersion: v1
kind: ServiceAccount
metadata: {name: coredns, namespace: kube-system}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: "system:coredns"}
rules:
- {apiGroups: [""], resources: [endpoints, services, pods, namespaces], verbs: [list, watch]}
- {apiGroups: [discovery.k8s.io], resources: [endpointslices], verbs: [list, watch]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: "system:coredns"}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "system:coredns"}
subjects: [{kind: ServiceAccount, name: coredns, namespace: kube-system}]
---
apiVersion: v1
kind: ConfigMap
metadata: {name: coredns, namespace: kube-system}
data:
  Corefile: |
    .:53 {
        errors
        health {
            lameduck 5s
        }
        ready
        kubernetes cluster.local in-addr.arpa ip6.arpa {
            pods insecure
            fallthrough in-addr.arpa ip6.arpa
            ttl 30
        }
        cache 30
        loadbalance
    }
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: coredns, namespace: kube-system, labels: {k8s-app: kube-dns}}
spec:
  replicas: 2
  selector: {matchLabels: {k8s-app: kube-dns}}
  template:
    metadata: {labels: {k8s-app: kube-dns}}
    spec:
      serviceAccountName: coredns
      priorityClassName: system-cluster-critical
      dnsPolicy: Default
      tolerations: [{key: CriticalAddonsOnly, operator: Exists}]
      affinity:
        podAntiAffinity:
          preferredDuringSchedulingIgnoredDuringExecution:
          - weight: 100
            podAffinityTerm: {topologyKey: kubernetes.io/hostname, labelSelector: {matchLabels: {k8s-app: kube-dns}}}
      containers:
      - name: coredns
        image: IMAGE
        imagePullPolicy: Never
        args: [-conf, /etc/coredns/Corefile]
        volumeMounts: [{name: config, mountPath: /etc/coredns, readOnly: true}]
        ports:
        - {name: dns, containerPort: 53, protocol: UDP}
        - {name: dns-tcp, containerPort: 53, protocol: TCP}
        securityContext:
          capabilities: {add: [NET_BIND_SERVICE], drop: [ALL]}
          readOnlyRootFilesystem: true
        livenessProbe: {httpGet: {path: /health, port: 8080}, initialDelaySeconds: 10, periodSeconds: 10}
        readinessProbe: {httpGet: {path: /ready, port: 8181}, periodSeconds: 2}
      volumes:
      - name: config
        configMap: {name: coredns, items: [{key: Corefile, path: Corefile}]}
---
apiVersion: v1
kind: Service
metadata: {name: kube-dns, namespace: kube-system, labels: {k8s-app: kube-dns, kubernetes.io/name: CoreDNS}}
spec:
  selector: {k8s-app: kube-dns}
  clusterIP: CLUSTERDNS
  ports:
  - {name: dns, port: 53, protocol: UDP}
  - {name: dns-tcp, port: 53, protocol: TCP}
`

// corednsManifest is corednsYAML running image, its Service at dns.
func corednsManifest(image, dns string) string {
	return strings.NewReplacer("IMAGE", image, "CLUSTERDNS", dns).Replace(corednsYAML)
}

// deployDNS installs CoreDNS and waits until its pods are ready: the pods
// need the pod network, so this comes after twill.
func (s *State) deployDNS(ctx context.Context) error {
	if out, err := s.Kubectl(ctx, strings.NewReader(corednsManifest(s.CoreDNSImage, s.kubeNet().DNS)), "apply", "-f", "-"); err != nil {
		return fmt.Errorf("kubectl apply (CoreDNS): %w\n%s", err, out)
	}
	return cluster.Poll(ctx, 3*time.Minute, "CoreDNS to be ready", func() error {
		out, err := s.Kubectl(ctx, nil, "-n", "kube-system", "get", "deployment", "coredns", "-o",
			"jsonpath={.status.readyReplicas}/{.spec.replicas}")
		if err != nil {
			return fmt.Errorf("%w: %s", err, out)
		}
		if ready, want, _ := strings.Cut(strings.TrimSpace(out), "/"); ready != want {
			return s.nodeError(fmt.Errorf("CoreDNS: %s of %s pods ready", ready, want))
		}
		return nil
	})
}
