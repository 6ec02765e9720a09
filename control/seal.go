package control

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

// Seal signs what a node decides and gossips (rosters, refusals of
// claims) and checks what it hears. Under cluster TLS these travel signed
// with the sender's node key, and nodes take no other: gossip says
// nothing of who sent a message, and these say which node serves which
// ranks.
type Seal interface {
	Sign(body []byte) (*dpnodev1.Signed, error)
	Check(*dpnodev1.Signed) error
}

// tlsSeal is the Seal of a node's cluster TLS files.
type tlsSeal struct {
	chain  [][]byte
	signer crypto.Signer
	verify func(raw [][]byte) (*x509.Certificate, error)
}

// GossipSeal returns the Seal of the node whose TLS files these are.
func (f TLSFiles) GossipSeal() (Seal, error) {
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

func (s *tlsSeal) Sign(body []byte) (*dpnodev1.Signed, error) {
	var opts crypto.SignerOpts = crypto.SHA256
	digest := body
	if _, ok := s.signer.Public().(ed25519.PublicKey); ok {
		opts = crypto.Hash(0)
	} else {
		sum := sha256.Sum256(body)
		digest = sum[:]
	}
	sig, err := s.signer.Sign(rand.Reader, digest, opts)
	if err != nil {
		return nil, fmt.Errorf("cluster: signing a gossip message: %w", err)
	}
	return &dpnodev1.Signed{Body: body, Certificates: s.chain, Signature: sig}, nil
}

func (s *tlsSeal) Check(sr *dpnodev1.Signed) error {
	cert, err := s.verify(sr.Certificates)
	if err != nil {
		return fmt.Errorf("cluster: signed by no certificate of this cluster's CA: %w", err)
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
		return fmt.Errorf("cluster: signed with a %T key", cert.PublicKey)
	}
	if err := cert.CheckSignature(algo, sr.Body, sr.Signature); err != nil {
		return errors.New("cluster: a signature that does not match its signer's certificate")
	}
	return nil
}
