package cluster

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"errors"
	"fmt"

	dpnodev1 "github.com/dpnode/dpnode/proto/dpnode/v1"
)

// RosterSeal signs the rosters a node decides and checks those it hears
// of. Under cluster TLS a roster travels signed with the deciding node's
// key, and nodes adopt no other: gossip says nothing of who sent a
// message, and a roster says which node serves which ranks.
type RosterSeal interface {
	Sign(roster []byte) (*dpnodev1.SignedRoster, error)
	Check(*dpnodev1.SignedRoster) error
}

// tlsSeal is the RosterSeal of a node's cluster TLS files.
type tlsSeal struct {
	chain  [][]byte
	signer crypto.Signer
	verify func(raw [][]byte) (*x509.Certificate, error)
}

// RosterSeal returns the seal of the node whose TLS files these are.
func (f TLSFiles) RosterSeal() (RosterSeal, error) {
	pair, verify, err := f.load()
	if err != nil {
		return nil, err
	}
	signer, ok := pair.PrivateKey.(crypto.Signer)
	if !ok || len(pair.Certificate) == 0 {
		return nil, fmt.Errorf("cluster: --cluster-tls-key holds a %T, which cannot sign", pair.PrivateKey)
	}
	return &tlsSeal{chain: pair.Certificate, signer: signer, verify: verify}, nil
}

func (s *tlsSeal) Sign(roster []byte) (*dpnodev1.SignedRoster, error) {
	var opts crypto.SignerOpts = crypto.SHA256
	digest := roster
	if _, ok := s.signer.Public().(ed25519.PublicKey); ok {
		opts = crypto.Hash(0)
	} else {
		sum := sha256.Sum256(roster)
		digest = sum[:]
	}
	sig, err := s.signer.Sign(rand.Reader, digest, opts)
	if err != nil {
		return nil, fmt.Errorf("cluster: signing a roster: %w", err)
	}
	return &dpnodev1.SignedRoster{Roster: roster, Certificates: s.chain, Signature: sig}, nil
}

func (s *tlsSeal) Check(sr *dpnodev1.SignedRoster) error {
	cert, err := s.verify(sr.Certificates)
	if err != nil {
		return fmt.Errorf("cluster: a roster signed by no certificate of this cluster's CA: %w", err)
	}
	var algo x509.SignatureAlgorithm
	switch cert.PublicKey.(type) {
	case *ecdsa.PublicKey:
		algo = x509.ECDSAWithSHA256
	case *rsa.PublicKey:
		algo = x509.SHA256WithRSA
	case ed25519.PublicKey:
		algo = x509.PureEd25519
	default:
		return fmt.Errorf("cluster: a roster signed with a %T key", cert.PublicKey)
	}
	if err := cert.CheckSignature(algo, sr.Roster, sr.Signature); err != nil {
		return errors.New("cluster: a roster whose signature does not match its signer's certificate")
	}
	return nil
}
