package control

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"

	"google.golang.org/grpc/credentials"
)

// TLSFiles are the PEM files of cluster TLS: the actor transport's mutual
// TLS, and the signatures of what a node gossips (GossipSeal).
type TLSFiles struct {
	Cert, Key, CA string
}

// Set reports whether any of the files is named: cluster TLS is on.
func (f TLSFiles) Set() bool { return f.Cert != "" || f.Key != "" || f.CA != "" }

// Check refuses files named only in part, an error about the command line.
func (f TLSFiles) Check() error {
	if f.Set() && (f.Cert == "" || f.Key == "" || f.CA == "") {
		return errors.New("--cluster-tls-cert, --cluster-tls-key and --cluster-tls-ca go together: set all three or none")
	}
	return nil
}

// Credentials builds mutual TLS for the actor transport: every node shows
// a certificate signed by the cluster's CA and accepts only peers that do.
// Peers are dialled by IP address, so what is checked is the signature, not
// a host name: a certificate from the cluster CA is what makes a member.
func (f TLSFiles) Credentials() (credentials.TransportCredentials, error) {
	cfg, err := f.config()
	if err != nil {
		return nil, err
	}
	return credentials.NewTLS(cfg), nil
}

// Verifier returns what checks the actor transport a peer gossips: a TLS
// handshake in which it shows a certificate of the cluster's CA, as every
// call between nodes does, and then identify (actors.Node.Identify) over
// the transport, which must answer with the peer's name. The handshake
// alone proves only that some node of the cluster listens there: a peer
// could gossip another node's address.
func (f TLSFiles) Verifier(identify func(ctx context.Context, address string) (string, error)) (func(ctx context.Context, name, address string) error, error) {
	cfg, err := f.config()
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context, name, address string) error {
		d := tls.Dialer{Config: cfg}
		conn, err := d.DialContext(ctx, "tcp", address)
		if err != nil {
			return fmt.Errorf("it showed no certificate of this cluster's CA at %s (%w)", address, err)
		}
		conn.Close()
		got, err := identify(ctx, address)
		switch {
		case err != nil:
			return fmt.Errorf("the node at %s did not say who it is (%w)", address, err)
		case got != name:
			return fmt.Errorf("the actor address it gossips, %s, is the node %s's", address, got)
		}
		return nil
	}, nil
}

// config is the TLS of both ends of the actor transport.
func (f TLSFiles) config() (*tls.Config, error) {
	pair, verify, err := f.load()
	if err != nil {
		return nil, err
	}
	cfg := &tls.Config{
		Certificates: []tls.Certificate{pair},
		MinVersion:   tls.VersionTLS13,
		// Both sides check the other's chain in VerifyPeerCertificate;
		// the standard check would also want the dialled IP in the
		// certificate.
		InsecureSkipVerify: true,
		ClientAuth:         tls.RequireAnyClientCert,
		VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
			_, err := verify(raw)
			return err
		},
	}
	return cfg, nil
}

// load reads this node's key pair and the CA, and returns the check of a
// peer's chain (leaf first, DER) against the CA, which gives the leaf.
func (f TLSFiles) load() (tls.Certificate, func(raw [][]byte) (*x509.Certificate, error), error) {
	pair, err := tls.LoadX509KeyPair(f.Cert, f.Key)
	if err != nil {
		return tls.Certificate{}, nil, fmt.Errorf("cluster: --cluster-tls-cert/--cluster-tls-key: %w", err)
	}
	caPEM, err := os.ReadFile(f.CA)
	if err != nil {
		return tls.Certificate{}, nil, fmt.Errorf("cluster: --cluster-tls-ca: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return tls.Certificate{}, nil, fmt.Errorf("cluster: --cluster-tls-ca %s holds no PEM certificate", f.CA)
	}
	verify := func(raw [][]byte) (*x509.Certificate, error) {
		if len(raw) == 0 {
			return nil, errors.New("cluster: the peer showed no certificate")
		}
		certs := make([]*x509.Certificate, len(raw))
		for i, r := range raw {
			c, err := x509.ParseCertificate(r)
			if err != nil {
				return nil, err
			}
			certs[i] = c
		}
		inter := x509.NewCertPool()
		for _, c := range certs[1:] {
			inter.AddCert(c)
		}
		_, err := certs[0].Verify(x509.VerifyOptions{Roots: pool, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}})
		return certs[0], err
	}
	return pair, verify, nil
}
