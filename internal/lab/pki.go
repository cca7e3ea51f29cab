package lab

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"time"
)

// pki is a Kubernetes lab's certificate authority: one CA signs the
// apiserver's serving certificate and every client certificate. Identities
// follow Kubernetes' conventions, so the Node authorizer, NodeRestriction
// and the built-in RBAC bindings apply to the lab's components as they do
// in a real cluster.
type pki struct {
	dir    string
	ca     *x509.Certificate
	caKey  *ecdsa.PrivateKey
	serial int64
}

// newPKI makes a CA in dir (ca.crt, ca.key).
func newPKI(dir string) (*pki, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "twill-lab-ca"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(10 * 365 * 24 * time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageCRLSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	ca, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	p := &pki{dir: dir, ca: ca, caKey: key, serial: 1}
	if err := writePEM(p.CAFile(), "CERTIFICATE", der); err != nil {
		return nil, err
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, err
	}
	return p, writePEM(filepath.Join(dir, "ca.key"), "EC PRIVATE KEY", kb)
}

// CAFile is the CA certificate's path.
func (p *pki) CAFile() string { return filepath.Join(p.dir, "ca.crt") }

// certSpec is one certificate to issue.
type certSpec struct {
	name string // file name stem: <name>.crt, <name>.key
	cn   string
	orgs []string
	ips  []netip.Addr
	dns  []string
	// server makes it a serving certificate; otherwise a client one.
	server bool
}

// issue writes <name>.crt and <name>.key and returns their paths.
func (p *pki) issue(c certSpec) (crt, key string, err error) {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", "", err
	}
	p.serial++
	now := time.Now()
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(p.serial), Subject: pkix.Name{CommonName: c.cn, Organization: c.orgs},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(365 * 24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment, DNSNames: c.dns}
	for _, ip := range c.ips {
		tmpl.IPAddresses = append(tmpl.IPAddresses, net.IP(ip.AsSlice()))
	}
	tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	if c.server {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.ca, &k.PublicKey, p.caKey)
	if err != nil {
		return "", "", fmt.Errorf("issuing %s: %w", c.name, err)
	}
	kb, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		return "", "", err
	}
	crt, key = filepath.Join(p.dir, c.name+".crt"), filepath.Join(p.dir, c.name+".key")
	if err := writePEM(crt, "CERTIFICATE", der); err != nil {
		return "", "", err
	}
	return crt, key, writePEM(key, "EC PRIVATE KEY", kb)
}

// serviceAccountKey writes the key pair that signs ServiceAccount tokens.
func (p *pki) serviceAccountKey() (priv, pub string, err error) {
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
	priv, pub = filepath.Join(p.dir, "sa.key"), filepath.Join(p.dir, "sa.pub")
	if err := writePEM(priv, "EC PRIVATE KEY", kb); err != nil {
		return "", "", err
	}
	return priv, pub, writePEM(pub, "PUBLIC KEY", pb)
}

func writePEM(path, typ string, der []byte) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600)
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
