package control

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"math/big"
	"os"
	"path/filepath"
	"regexp"
	"time"
)

// CA is a cluster's certificate authority: every node's certificate for
// the actor transport's mutual TLS is signed by it, and a certificate it
// signed is what makes a peer a member (see TLSFiles.Credentials).
type CA struct {
	dir  string
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

// The files of a cluster's secrets directory.
const (
	CACertFile    = "ca.pem"
	caKeyFile     = "ca-key.pem"
	GossipKeyFile = "gossip.key"
)

// Validity of what OpenCA and Issue write.
const (
	caValidity   = 10 * 365 * 24 * time.Hour
	nodeValidity = 2 * 365 * 24 * time.Hour
)

var nodeNamePattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`)

// OpenCA loads the CA of dir, or creates it there (and the directory, only
// its owner may read) when dir has none; created says which. Creating it
// also writes a gossip key, so that the directory holds every secret a
// node needs.
func OpenCA(dir string) (ca *CA, created bool, err error) {
	certPEM, err := os.ReadFile(filepath.Join(dir, CACertFile))
	switch {
	case err == nil:
		ca, err := loadCA(dir, certPEM)
		return ca, false, err
	case !errors.Is(err, fs.ErrNotExist):
		return nil, false, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, false, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, false, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{SerialNumber: serial(), Subject: pkix.Name{CommonName: "dpnode cluster CA"},
		IsCA: true, BasicConstraintsValid: true, MaxPathLenZero: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(caValidity)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, false, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, false, err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, false, err
	}
	gossip := make([]byte, 32)
	if _, err := rand.Read(gossip); err != nil {
		return nil, false, err
	}
	for _, f := range []struct {
		name string
		data []byte
	}{
		{caKeyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})},
		{GossipKeyFile, []byte(base64.StdEncoding.EncodeToString(gossip) + "\n")},
		// The certificate last: its presence says the directory is whole.
		{CACertFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})},
	} {
		if err := writeNew(filepath.Join(dir, f.name), f.data); err != nil {
			return nil, false, err
		}
	}
	return &CA{dir: dir, cert: cert, key: key}, true, nil
}

func loadCA(dir string, certPEM []byte) (*CA, error) {
	block, _ := pem.Decode(certPEM)
	if block == nil || block.Type != "CERTIFICATE" {
		return nil, fmt.Errorf("%s holds no PEM certificate", filepath.Join(dir, CACertFile))
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return nil, err
	}
	keyPEM, err := os.ReadFile(filepath.Join(dir, caKeyFile))
	if err != nil {
		return nil, fmt.Errorf("the CA's key: %w", err)
	}
	block, _ = pem.Decode(keyPEM)
	if block == nil {
		return nil, fmt.Errorf("%s holds no PEM key", filepath.Join(dir, caKeyFile))
	}
	key, err := x509.ParseECPrivateKey(block.Bytes)
	if err != nil {
		return nil, err
	}
	if !key.PublicKey.Equal(cert.PublicKey) {
		return nil, fmt.Errorf("%s is not the key of %s", caKeyFile, CACertFile)
	}
	return &CA{dir: dir, cert: cert, key: key}, nil
}

// Issue writes a certificate and key for the node name, signed by the CA,
// as NAME.pem and NAME-key.pem in the CA's directory, and returns the TLS
// files the node runs with. It refuses to overwrite a node's files.
func (ca *CA) Issue(name string) (TLSFiles, error) {
	if !nodeNamePattern.MatchString(name) {
		return TLSFiles{}, fmt.Errorf("node name %q: use letters, digits, '.', '_' and '-'", name)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return TLSFiles{}, err
	}
	now := time.Now()
	notAfter := now.Add(nodeValidity)
	if notAfter.After(ca.cert.NotAfter) {
		notAfter = ca.cert.NotAfter
	}
	tmpl := &x509.Certificate{SerialNumber: serial(), Subject: pkix.Name{CommonName: name},
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		NotBefore:   now.Add(-time.Hour), NotAfter: notAfter}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		return TLSFiles{}, err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return TLSFiles{}, err
	}
	f := TLSFiles{Cert: filepath.Join(ca.dir, name+".pem"), Key: filepath.Join(ca.dir, name+"-key.pem"), CA: filepath.Join(ca.dir, CACertFile)}
	if err := writeNew(f.Key, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})); err != nil {
		return TLSFiles{}, err
	}
	if err := writeNew(f.Cert, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})); err != nil {
		os.Remove(f.Key)
		return TLSFiles{}, err
	}
	return f, nil
}

// writeNew writes a file only its owner may read, refusing to replace one.
func writeNew(path string, data []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		os.Remove(path)
		return err
	}
	return f.Close()
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(err) // crypto/rand does not fail
	}
	return n
}
