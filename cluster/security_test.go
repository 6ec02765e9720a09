package cluster

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
)

// testCA makes a CA and signs node certificates with it, as PEM files.
type testCA struct {
	dir  string
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	path string
}

func newTestCA(t *testing.T, name string) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	ca := &testCA{dir: t.TempDir(), cert: cert, key: key}
	ca.path = ca.write(t, name+"-ca.pem", "CERTIFICATE", der)
	return ca
}

func (ca *testCA) write(t *testing.T, name, kind string, der []byte) string {
	t.Helper()
	p := filepath.Join(ca.dir, name)
	if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// NewTestCA is newTestCA for the multi-process tests.
var NewTestCA = newTestCA

// Node issues a certificate for a node and returns its TLS files.
func (ca *testCA) Node(t *testing.T, name string) TLSFiles {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: name},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, _ := x509.MarshalECPrivateKey(key)
	return TLSFiles{Cert: ca.write(t, name+".pem", "CERTIFICATE", der), Key: ca.write(t, name+"-key.pem", "EC PRIVATE KEY", keyDER), CA: ca.path}
}

// TestTLSRefusesAPeerFromAnotherCA does the handshakes of the transport's
// credentials directly: a peer whose certificate another CA signed is
// refused in both directions.
func TestTLSRefusesAPeerFromAnotherCA(t *testing.T) {
	ours, theirs := newTestCA(t, "ours"), newTestCA(t, "theirs")
	cases := []struct {
		name           string
		server, client TLSFiles
		ok             bool
	}{
		{"same CA", ours.Node(t, "s"), ours.Node(t, "c"), true},
		{"client from another CA", ours.Node(t, "s"), theirs.Node(t, "c"), false},
		{"server from another CA", theirs.Node(t, "s"), ours.Node(t, "c"), false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			sc, err := tc.server.credentials()
			if err != nil {
				t.Fatal(err)
			}
			cc, err := tc.client.credentials()
			if err != nil {
				t.Fatal(err)
			}
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			serverErr := make(chan error, 1)
			go func() {
				c1, err := ln.Accept()
				if err != nil {
					serverErr <- err
					return
				}
				defer c1.Close()
				_, _, err = sc.ServerHandshake(c1)
				serverErr <- err
			}()
			c2, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer c2.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_, _, clientErr := cc.ClientHandshake(ctx, "127.0.0.1:1", c2)
			if clientErr != nil {
				c2.Close()
			}
			sErr := <-serverErr
			if ok := clientErr == nil && sErr == nil; ok != tc.ok {
				t.Fatalf("handshake: client %v, server %v; want ok=%v", clientErr, sErr, tc.ok)
			}
		})
	}
}
