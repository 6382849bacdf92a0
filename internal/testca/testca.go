// Package testca makes a certificate authority for TLS tests: a CA, a
// server certificate for the loopback names, and a client certificate,
// written as PEM files to a test's temporary directory; and LockOnce, the
// check each backend's TLS tests make with a URL.
package testca

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/distlock/lock"
)

// ServerName is a DNS name the server certificate carries besides
// localhost, 127.0.0.1 and ::1, for tests of server_name.
const ServerName = "lock-test-server"

// CA is a test certificate authority and the files it wrote.
type CA struct {
	// CAFile is the CA certificate (PEM): what a client trusts.
	CAFile string
	// CertFile and KeyFile are the server's certificate and key, valid
	// for localhost, 127.0.0.1, ::1 and ServerName, signed by the CA.
	CertFile, KeyFile string
	// ClientCertFile and ClientKeyFile are a client certificate and key
	// signed by the CA, for servers that require one.
	ClientCertFile, ClientKeyFile string
	// OtherCAFile is a second CA that signed nothing here: a client
	// that trusts only it must refuse the server.
	OtherCAFile string
}

// New creates a CA and its certificates in t's temporary directory.
func New(t testing.TB) *CA {
	t.Helper()
	dir := t.TempDir()
	caKey, caCert := newCA(t, "lock test CA")
	_, otherCert := newCA(t, "lock other CA")
	ca := &CA{
		CAFile:         filepath.Join(dir, "ca.pem"),
		CertFile:       filepath.Join(dir, "server.pem"),
		KeyFile:        filepath.Join(dir, "server-key.pem"),
		ClientCertFile: filepath.Join(dir, "client.pem"),
		ClientKeyFile:  filepath.Join(dir, "client-key.pem"),
		OtherCAFile:    filepath.Join(dir, "other-ca.pem"),
	}
	writePEM(t, ca.CAFile, "CERTIFICATE", caCert.Raw)
	writePEM(t, ca.OtherCAFile, "CERTIFICATE", otherCert.Raw)
	server := &x509.Certificate{
		SerialNumber: serial(t),
		Subject:      pkix.Name{CommonName: "localhost"},
		DNSNames:     []string{"localhost", ServerName},
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("::1")},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		// Servers of a cluster (etcd peers, Consul agents) also dial
		// each other with their own certificate.
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	signed(t, server, caCert, caKey, ca.CertFile, ca.KeyFile)
	client := &x509.Certificate{
		SerialNumber: serial(t),
		Subject:      pkix.Name{CommonName: "lock-test-client"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	signed(t, client, caCert, caKey, ca.ClientCertFile, ca.ClientKeyFile)
	return ca
}

func newCA(t testing.TB, name string) (*ecdsa.PrivateKey, *x509.Certificate) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatalf("testca: %v", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(t),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatalf("testca: %v", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatalf("testca: %v", err)
	}
	return key, cert
}

func signed(t testing.TB, tmpl, ca *x509.Certificate, caKey *ecdsa.PrivateKey, certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatalf("testca: %v", err)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatalf("testca: %v", err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatalf("testca: %v", err)
	}
	writePEM(t, certFile, "CERTIFICATE", der)
	writePEM(t, keyFile, "EC PRIVATE KEY", keyDER)
}

func serial(t testing.TB) *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		t.Fatalf("testca: %v", err)
	}
	return n
}

func writePEM(t testing.TB, path, kind string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600); err != nil {
		t.Fatalf("testca: %v", err)
	}
}

// A Refusal is a set of TLS parameters (name, value, ...) with which a
// client must refuse a server that presents the CA's server certificate,
// and what the error then says.
type Refusal struct {
	Name   string
	Params []string
	Want   string
}

// Refusals are the ways the backends' TLS tests expect a connection to the
// CA's server to be refused: trusting the system's roots only, trusting
// another CA, and checking the certificate for a name it does not carry.
func (ca *CA) Refusals() []Refusal {
	return []Refusal{
		{"SystemRoots", nil, "certificate signed by unknown authority"},
		{"OtherCA", []string{"ca_file", ca.OtherCAFile}, "certificate signed by unknown authority"},
		{"WrongServerName", []string{"ca_file", ca.CAFile, "server_name", "wrong.example"}, "not wrong.example"},
	}
}

// LockOnce opens rawURL, takes and releases a lock within wait, and
// returns the first error: what a TLS test does once it has a URL.
func LockOnce(rawURL string, wait time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	locks, err := lock.Open(ctx, rawURL)
	if err != nil {
		return err
	}
	defer locks.Close() // after a refusal, may wait for a cleanup release
	l, err := locks.TryAcquire(ctx, "tls")
	if err != nil {
		return err
	}
	return l.Release(ctx)
}
