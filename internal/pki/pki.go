// Package pki is a small certificate authority for the lab and the tests:
// the Kubernetes lab's control plane and etcd with client-certificate
// authentication get their certificates from it.
package pki

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

// CA is a certificate authority kept in a directory: it signs serving and
// client certificates, written beside it as PEM files (keys 0600).
type CA struct {
	dir    string
	ca     *x509.Certificate
	caKey  *ecdsa.PrivateKey
	serial int64
}

// New makes a CA in dir (ca.crt, ca.key) named cn.
func New(dir, cn string) (*CA, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: cn},
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
	p := &CA{dir: dir, ca: ca, caKey: key, serial: 1}
	if err := WritePEM(p.CAFile(), "CERTIFICATE", der); err != nil {
		return nil, err
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, err
	}
	return p, WritePEM(filepath.Join(dir, "ca.key"), "EC PRIVATE KEY", kb)
}

// CAFile is the CA certificate's path.
func (p *CA) CAFile() string { return filepath.Join(p.dir, "ca.crt") }

// Cert is one certificate to issue.
type Cert struct {
	Name string // file name stem: <Name>.crt, <Name>.key
	CN   string
	Orgs []string
	IPs  []netip.Addr
	DNS  []string
	// Server makes it a serving certificate; otherwise a client one.
	Server bool
}

// Issue writes <Name>.crt and <Name>.key and returns their paths.
func (p *CA) Issue(c Cert) (crt, key string, err error) {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", "", err
	}
	p.serial++
	now := time.Now()
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(p.serial), Subject: pkix.Name{CommonName: c.CN, Organization: c.Orgs},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(365 * 24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment, DNSNames: c.DNS}
	for _, ip := range c.IPs {
		tmpl.IPAddresses = append(tmpl.IPAddresses, net.IP(ip.AsSlice()))
	}
	tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	if c.Server {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.ca, &k.PublicKey, p.caKey)
	if err != nil {
		return "", "", fmt.Errorf("issuing %s: %w", c.Name, err)
	}
	kb, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		return "", "", err
	}
	crt, key = filepath.Join(p.dir, c.Name+".crt"), filepath.Join(p.dir, c.Name+".key")
	if err := WritePEM(crt, "CERTIFICATE", der); err != nil {
		return "", "", err
	}
	return crt, key, WritePEM(key, "EC PRIVATE KEY", kb)
}

// WritePEM writes one PEM block, 0600.
func WritePEM(path, typ string, der []byte) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600)
}

// ServiceAccountKey writes, beside the CA, the key pair that signs
// ServiceAccount tokens (sa.key, sa.pub), for kube-apiserver's
// --service-account-signing-key-file and --service-account-key-file.
func (p *CA) ServiceAccountKey() (priv, pub string, err error) {
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
	if err := WritePEM(priv, "EC PRIVATE KEY", kb); err != nil {
		return "", "", err
	}
	return priv, pub, WritePEM(pub, "PUBLIC KEY", pb)
}
