package lab

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"

	"github.com/twill-net/twill/lab/cluster"
)

// FlannelNamespace and FlannelDaemonSet name what a lab up --flannel
// installs, as kube-flannel.yml names them.
const (
	FlannelNamespace = "kube-flannel"
	FlannelDaemonSet = "kube-flannel-ds"
)

// flannelManifest is kube-flannel's install in its shape: the namespace,
// the flannel ServiceAccount and its role, net-conf.json and the CNI
// conflist in kube-flannel-cfg, and the DaemonSet (an init container
// installing the CNI plugins and conflist, flanneld --kube-subnet-mgr with
// NET_ADMIN and NET_RAW on the host network). The image holds flanneld,
// built from the Go module proxy (tools/flannel), and twill's stand-in for
// flannel's CNI plugin (tools/flannelcni), which the proxy does not serve.
func flannelManifest(image, backend string) (string, error) {
	conf, err := json.Marshal(map[string]any{"Network": ClusterCIDR, "Backend": map[string]string{"Type": backend}})
	if err != nil {
		return "", err
	}
	r := strings.NewReplacer("IMAGE", image, "NETCONF", string(conf), "NAMESPACE", FlannelNamespace, "DAEMONSET", FlannelDaemonSet)
	return r.Replace(flannelTemplate), nil
}

// flannelTemplate is flannelManifest with IMAGE, NETCONF, NAMESPACE and
// DAEMONSET to fill in.
const flannelTemplate = `apiVersion: v1
kind: Namespace
metadata:
  name: NAMESPACE
  labels: {pod-security.kubernetes.io/enforce: privileged}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: flannel, namespace: NAMESPACE}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: flannel}
rules:
  - {apiGroups: [""], resources: [pods], verbs: [get]}
  - {apiGroups: [""], resources: [nodes], verbs: [get, list, watch]}
  - {apiGroups: [""], resources: [nodes/status], verbs: [patch]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: flannel}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: flannel}
subjects: [{kind: ServiceAccount, name: flannel, namespace: NAMESPACE}]
---
apiVersion: v1
kind: ConfigMap
metadata: {name: kube-flannel-cfg, namespace: NAMESPACE}
data:
  cni-conf.json: |
    {"name": "cbr0", "cniVersion": "1.0.0", "plugins": [
      {"type": "flannel", "delegate": {"hairpinMode": true, "isDefaultGateway": true}},
      {"type": "portmap", "capabilities": {"portMappings": true}}]}
  net-conf.json: |
    NETCONF
---
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: DAEMONSET, namespace: NAMESPACE, labels: {app: flannel}}
spec:
  selector: {matchLabels: {app: flannel}}
  template:
    metadata: {labels: {app: flannel}}
    spec:
      hostNetwork: true
      priorityClassName: system-node-critical
      serviceAccountName: flannel
      tolerations: [{operator: Exists, effect: NoSchedule}]
      initContainers:
        - name: install-cni
          image: IMAGE
          command: ["/opt/bin/flannelcni", "install", "/etc/kube-flannel/cni-conf.json", "/host/opt/cni/bin", "/host/etc/cni/net.d/10-flannel.conflist"]
          volumeMounts:
            - {name: cni-plugin, mountPath: /host/opt/cni/bin}
            - {name: cni, mountPath: /host/etc/cni/net.d}
            - {name: flannel-cfg, mountPath: /etc/kube-flannel/}
      containers:
        - name: kube-flannel
          image: IMAGE
          command: ["/opt/bin/flanneld"]
          args: ["--ip-masq", "--kube-subnet-mgr"]
          env:
            - {name: POD_NAME, valueFrom: {fieldRef: {fieldPath: metadata.name}}}
            - {name: POD_NAMESPACE, valueFrom: {fieldRef: {fieldPath: metadata.namespace}}}
            - {name: NODE_NAME, valueFrom: {fieldRef: {fieldPath: spec.nodeName}}}
            - {name: EVENT_QUEUE_DEPTH, value: "5000"}
          resources: {requests: {cpu: 50m, memory: 50Mi}}
          securityContext:
            privileged: false
            capabilities: {add: [NET_ADMIN, NET_RAW]}
          volumeMounts:
            - {name: run, mountPath: /run/flannel}
            - {name: flannel-cfg, mountPath: /etc/kube-flannel/}
            - {name: xtables-lock, mountPath: /run/xtables.lock}
      volumes:
        - {name: run, hostPath: {path: /run/flannel}}
        - {name: cni-plugin, hostPath: {path: /opt/cni/bin}}
        - {name: cni, hostPath: {path: /etc/cni/net.d}}
        - {name: flannel-cfg, configMap: {name: kube-flannel-cfg}}
        - {name: xtables-lock, hostPath: {path: /run/xtables.lock, type: FileOrCreate}}
`

// installFlannel applies kube-flannel and waits until every node's
// flanneld has written its subnet.env.
func (s *State) installFlannel(ctx context.Context, backend string) error {
	m, err := flannelManifest(s.FlannelImage, backend)
	if err != nil {
		return err
	}
	if out, err := s.Kubectl(ctx, strings.NewReader(m), "apply", "-f", "-"); err != nil {
		return fmt.Errorf("kubectl apply (kube-flannel): %w\n%s", err, out)
	}
	return cluster.Poll(ctx, 3*time.Minute, "flannel to roll out", func() error {
		var ds appsv1.DaemonSet
		if err := s.apiJSON(ctx, "/apis/apps/v1/namespaces/"+FlannelNamespace+"/daemonsets/"+FlannelDaemonSet, &ds); err != nil {
			return err
		}
		if st := ds.Status; st.NumberReady != int32(len(s.Nodes)) {
			why := fmt.Sprintf("DaemonSet %s: %d of %d pods ready", FlannelDaemonSet, st.NumberReady, len(s.Nodes))
			if pods, err := s.kubePods(ctx, FlannelNamespace, ""); err == nil {
				for _, p := range pods {
					if d := podTrouble(p); d != "" {
						why += "; " + d
					}
				}
			}
			return s.nodeError(fmt.Errorf("%s", why))
		}
		for _, n := range s.Nodes {
			if _, err := s.NodeExec(ctx, n.Name, nil, "test", "-f", "/run/flannel/subnet.env"); err != nil {
				return fmt.Errorf("no /run/flannel/subnet.env on %s yet", n.Name)
			}
		}
		return nil
	})
}
