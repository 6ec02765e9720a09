package node

import (
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/asynkron/protoactor-go/remote"
	"github.com/hashicorp/go-sockaddr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"

	"github.com/dpnode/dpnode/control"
)

// dialTimeout bounds one attempt to connect to a peer's actor transport.
const dialTimeout = 2 * time.Second

// transportConfig sets up the actor transport on bindHost:port, reachable
// by other nodes at advertiseHost.
// With a secret, every call must carry it (secret.go).
func transportConfig(bindHost, advertiseHost string, port int, tlsFiles control.TLSFiles, secret []byte) (*remote.Config, error) {
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
	if tlsFiles.Set() {
		c, err := tlsFiles.Credentials()
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
		h, _, err := control.SplitHostPort(advertise, 0)
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
