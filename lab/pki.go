package lab

import (
	"fmt"
)

// The Kubernetes lab's certificates come from one CA (internal/pki): it
// signs the apiserver's serving certificate and every client certificate.
// Identities follow Kubernetes' conventions, so the Node authorizer,
// NodeRestriction and the built-in RBAC bindings apply to the lab's
// components as they do in a real cluster.

// kubeconfig renders a kubeconfig for a client certificate.
func kubeconfig(server, caFile, crt, key string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: lab
  cluster:
    server: %s
    certificate-authority: %s
users:
- name: lab
  user:
    client-certificate: %s
    client-key: %s
contexts:
- name: lab
  context: {cluster: lab, user: lab}
current-context: lab
`, server, caFile, crt, key)
}
