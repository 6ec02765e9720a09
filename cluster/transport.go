package cluster

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"time"

	"github.com/asynkron/protoactor-go/remote"
	"github.com/hashicorp/go-sockaddr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
)

// TLSFiles are the PEM files of the actor transport's mutual TLS.
type TLSFiles struct {
	Cert, Key, CA string
}

func (f TLSFiles) set() bool { return f.Cert != "" || f.Key != "" || f.CA != "" }

func (f TLSFiles) check() error {
	if f.set() && (f.Cert == "" || f.Key == "" || f.CA == "") {
		return flagError("--cluster-tls-cert, --cluster-tls-key and --cluster-tls-ca go together: set all three or none")
	}
	return nil
}

// credentials builds mutual TLS for the actor transport: every node shows
// a certificate signed by the cluster's CA and accepts only peers that do.
// Peers are dialled by IP address, so what is checked is the signature, not
// a host name: a certificate from the cluster CA is what makes a member.
func (f TLSFiles) credentials() (credentials.TransportCredentials, error) {
	cfg, err := f.config()
	if err != nil {
		return nil, err
	}
	return credentials.NewTLS(cfg), nil
}

// verifier returns what checks the actor transport a peer gossips: a TLS
// handshake in which it shows a certificate of the cluster's CA, as every
// call between nodes does, and then identify (actors.Node.Identify) over
// the transport, which must answer with the peer's name. The handshake
// alone proves only that some node of the cluster listens there: a peer
// could gossip another node's address.
func (f TLSFiles) verifier(identify func(ctx context.Context, address string) (string, error)) (func(ctx context.Context, name, address string) error, error) {
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

// dialTimeout bounds one attempt to connect to a peer's actor transport.
const dialTimeout = 2 * time.Second

// transportConfig sets up the actor transport on bindHost:port, reachable
// by other nodes at advertiseHost.
// With a secret, every call must carry it (secret.go).
func transportConfig(bindHost, advertiseHost string, port int, tlsFiles TLSFiles, secret []byte) (*remote.Config, error) {
	if port == 0 {
		// remote advertises a fixed address, so choose the port now.
		ln, err := net.Listen("tcp", net.JoinHostPort(bindHost, "0"))
		if err != nil {
			return nil, fmt.Errorf("cluster: finding a free port for the actor transport: %w", err)
		}
		port = ln.Addr().(*net.TCPAddr).Port
		ln.Close()
	}
	creds := insecure.NewCredentials()
	serverOpts := []grpc.ServerOption{
		// A path that drops packets (a partition, a dead host) shows as a
		// broken connection within Time+Timeout, and so as Terminated to
		// whoever watches the actors behind it, instead of hanging for the
		// minutes TCP takes.
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: keepaliveTime, Timeout: keepaliveTimeout}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: keepaliveTime / 2, PermitWithoutStream: true}),
	}
	if tlsFiles.set() {
		c, err := tlsFiles.credentials()
		if err != nil {
			return nil, err
		}
		creds = c
		serverOpts = append(serverOpts, grpc.Creds(c))
	}
	var dialOpts []grpc.DialOption
	guard, sendSecret := guardOptions(secret)
	serverOpts = append(serverOpts, guard...)
	if sendSecret != nil {
		dialOpts = append(dialOpts, sendSecret)
	}
	opts := []remote.ConfigOption{
		remote.WithAdvertisedHost(net.JoinHostPort(advertiseHost, strconv.Itoa(port))),
		remote.WithServerOptions(serverOpts...),
		remote.WithDialOptions(append(dialOpts, grpc.WithTransportCredentials(creds),
			grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: keepaliveTime, Timeout: keepaliveTimeout, PermitWithoutStream: true}),
			// The transport dials a peer up to five times before it gives
			// the endpoint up, and a dial that returns at once leaves a
			// client connection behind when what follows fails: it keeps
			// redialling forever, and connects to the peer's next
			// incarnation. A dial that waits for the connection closes
			// what it opened when it fails, so nothing is left: at once on
			// a refused connection (a killed process), after dialTimeout
			// on silence.
			grpc.WithBlock(), grpc.FailOnNonTempDialError(true), grpc.WithTimeout(dialTimeout))...),
	}
	// remote joins host and port with a bare colon: an IPv6 host needs
	// its brackets to be listened on.
	if ip := net.ParseIP(bindHost); ip != nil && ip.To4() == nil {
		bindHost = "[" + bindHost + "]"
	}
	return remote.Configure(bindHost, port, opts...), nil
}

// Keepalive of the actor transport's connections.
const (
	keepaliveTime    = 5 * time.Second
	keepaliveTimeout = 3 * time.Second
)

// advertiseHost is the address other nodes reach this one at: --advertise
// if given, else the bind address unless it is a wildcard, else the
// machine's private IP (as memberlist would choose).
func advertiseHost(bindHost, advertise string) (string, error) {
	if advertise != "" {
		h, _, err := splitHostPort(advertise, 0)
		return h, err
	}
	if ip := net.ParseIP(bindHost); ip != nil && !ip.IsUnspecified() {
		return bindHost, nil
	}
	ip, err := sockaddr.GetPrivateIP()
	if err != nil || ip == "" {
		return "", flagError("cannot tell which address other nodes reach this one at; set --advertise")
	}
	return ip, nil
}
