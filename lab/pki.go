package lab

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"fmt"
	"path/filepath"

	"github.com/twill-net/twill/lab/pki"
)

// The Kubernetes lab's certificates come from one CA (lab/pki): it
// signs the apiserver's serving certificate and every client certificate.
// Identities follow Kubernetes' conventions, so the Node authorizer,
// NodeRestriction and the built-in RBAC bindings apply to the lab's
// components as they do in a real cluster.

// serviceAccountKey writes the key pair that signs ServiceAccount tokens.
func serviceAccountKey(p *pki.CA) (priv, pub string, err error) {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", "", err
	}
	kb, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		return "", "", err
	}
	pb, err := x509.MarshalPKIXPublicKey(&k.PublicKey)
	if err != nil {
		return "", "", err
	}
	dir := filepath.Dir(p.CAFile())
	priv, pub = filepath.Join(dir, "sa.key"), filepath.Join(dir, "sa.pub")
	if err := pki.WritePEM(priv, "EC PRIVATE KEY", kb); err != nil {
		return "", "", err
	}
	return priv, pub, pki.WritePEM(pub, "PUBLIC KEY", pb)
}

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
