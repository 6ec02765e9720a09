package cluster

import (
	"bytes"
	"context"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/remote"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	dpnode "github.com/dpnode/dpnode"
)

// testCA is a cluster CA in a test's temporary directory, made by the
// code of dpnode certs.
type testCA struct{ *CA }

func newTestCA(t *testing.T, _ string) *testCA {
	t.Helper()
	ca, created, err := OpenCA(t.TempDir())
	if err != nil || !created {
		t.Fatalf("a new CA: %v (created %v)", err, created)
	}
	return &testCA{ca}
}

// NewTestCA is newTestCA for the multi-process tests.
var NewTestCA = newTestCA

// Node issues a certificate for a node and returns its TLS files.
func (ca *testCA) Node(t *testing.T, name string) TLSFiles {
	t.Helper()
	f, err := ca.Issue(name)
	if err != nil {
		t.Fatal(err)
	}
	return f
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
		{"same CA", ours.Node(t, "s1"), ours.Node(t, "c1"), true},
		{"client from another CA", ours.Node(t, "s2"), theirs.Node(t, "c2"), false},
		{"server from another CA", theirs.Node(t, "s3"), ours.Node(t, "c3"), false},
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

// TestCertsDirectory: dpnode certs' directory is made once and reused: the
// CA, its key and the gossip key only its owner may read, one certificate
// per node that the CA verifies, and no file overwritten.
func TestCertsDirectory(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "certs")
	ca, created, err := OpenCA(dir)
	if err != nil || !created {
		t.Fatalf("%v %v", err, created)
	}
	a, err := ca.Issue("node-a")
	if err != nil {
		t.Fatal(err)
	}
	again, created, err := OpenCA(dir)
	if err != nil || created {
		t.Fatalf("reopening: %v, created %v", err, created)
	}
	b, err := again.Issue("node-b")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := again.Issue("node-a"); err == nil {
		t.Fatal("a node's certificate was issued twice over its files")
	}
	if _, err := again.Issue("../escape"); err == nil {
		t.Fatal("a node name with a path in it was accepted")
	}
	// Both certificates verify against the same CA: the nodes can talk.
	for _, f := range []TLSFiles{a, b} {
		if _, err := f.credentials(); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{caKeyFile, GossipKeyFile, "node-a-key.pem"} {
		st, err := os.Stat(filepath.Join(dir, name))
		if err != nil || st.Mode().Perm() != 0o600 {
			t.Fatalf("%s: %v %v; want mode 0600", name, err, st)
		}
	}
	key, err := os.ReadFile(filepath.Join(dir, GossipKeyFile))
	if err != nil {
		t.Fatal(err)
	}
	o := DefaultOptions()
	o.GossipKey = strings.TrimSpace(string(key))
	o.Profiles = dpnode.SimProfiles
	if _, err := o.check(); err != nil {
		t.Fatalf("the gossip key dpnode certs wrote: %v", err)
	}
}

// TestClusterPortsOffLoopbackNeedKeyAndTLS: gossip and the actor
// transport listen on loopback by default; on any other address a node
// refuses to start without both the gossip key and cluster TLS, unless
// told --insecure-cluster.
func TestClusterPortsOffLoopbackNeedKeyAndTLS(t *testing.T) {
	if b := DefaultOptions().Bind; !strings.HasPrefix(b, "127.0.0.1:") {
		t.Fatalf("the default --bind is %s, not loopback", b)
	}
	tlsFiles := TLSFiles{Cert: "n.pem", Key: "n-key.pem", CA: "ca.pem"}
	key := "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY="
	cases := []struct {
		name     string
		bind     string
		key      string
		tls      TLSFiles
		insecure bool
		refused  bool
	}{
		{"loopback, nothing", "127.0.0.1:7946", "", TLSFiles{}, false, false},
		{"another loopback address", "127.0.0.9:7946", "", TLSFiles{}, false, false},
		{"all interfaces, nothing", "0.0.0.0:7946", "", TLSFiles{}, false, true},
		{"a LAN address, key only", "10.0.0.1:7946", key, TLSFiles{}, false, true},
		{"a LAN address, TLS only", "10.0.0.1:7946", "", tlsFiles, false, true},
		{"a LAN address, key and TLS", "10.0.0.1:7946", key, tlsFiles, false, false},
		{"all interfaces, insecure", "0.0.0.0:7946", "", TLSFiles{}, true, false},
		// A name is checked for what it resolves to: memberlist cannot
		// listen on a name, and listened on every interface for one.
		{"a name of loopback", "localhost:7946", "", TLSFiles{}, false, false},
		{"a name of a LAN address, nothing", "node-a.lan:7946", "", TLSFiles{}, false, true},
		{"a name of a LAN address, key and TLS", "node-a.lan:7946", key, tlsFiles, false, false},
		{"IPv6 loopback", "[::1]:7946", "", TLSFiles{}, false, false},
	}
	dns := &fakeDNS{names: map[string][]string{"localhost": {"::1", "127.0.0.1"}, "node-a.lan": {"10.0.0.7"}}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			o := DefaultOptions()
			o.Profiles = dpnode.SimProfiles
			o.Bind, o.GossipKey, o.TLS, o.InsecureCluster, o.Resolver = tc.bind, tc.key, tc.tls, tc.insecure, dns
			_, err := o.check()
			if refused := err != nil; refused != tc.refused {
				t.Fatalf("refused %v (%v), want %v", refused, err, tc.refused)
			}
			if err != nil && (!strings.Contains(err.Error(), "dpnode certs") || !strings.Contains(err.Error(), "--insecure-cluster")) {
				t.Fatalf("the error does not say how to fix it: %v", err)
			}
		})
	}
}

// TestBindNamesAreResolved: the cluster ports listen on the address a
// --bind name resolves to, its first IPv4 one, and an IPv6 address works
// with its brackets.
func TestBindNamesAreResolved(t *testing.T) {
	dns := &fakeDNS{names: map[string][]string{"localhost": {"::1", "127.0.0.1"}, "v6only": {"fe80::1", "::1"}}}
	for bind, want := range map[string]string{
		"localhost:7946": "127.0.0.1:7946",
		"localhost":      "127.0.0.1:7946",
		"v6only:0":       "[fe80::1]:0",
		"[::1]:7946":     "[::1]:7946",
		"10.0.0.1:7946":  "10.0.0.1:7946",
		":7946":          ":7946",
	} {
		if got, err := resolveBind(dns, bind); err != nil || got != want {
			t.Errorf("--bind %s: %q %v; want %q", bind, got, err, want)
		}
	}
	if _, err := resolveBind(dns, "nowhere:7946"); err == nil {
		t.Error("a name that does not resolve was accepted")
	}
	// A whole node on IPv6 loopback: the actor transport listens too.
	for _, bind := range []string{"[::1]:0", "localhost:0"} {
		o := DefaultOptions()
		o.Profiles, o.Logger = dpnode.SimProfiles, slog.New(slog.DiscardHandler)
		o.Host, o.Port, o.Bind, o.RPCPort = "127.0.0.1", 0, bind, 0
		run, err := Start(o)
		if err != nil {
			if bind == "[::1]:0" && strings.Contains(err.Error(), "cannot assign requested address") {
				t.Log("this machine has no IPv6 loopback")
				continue
			}
			t.Fatalf("--bind %s: %v", bind, err)
		}
		addr := run.membership.list.LocalNode().Addr
		if err := run.Shutdown(); err != nil {
			t.Fatal(err)
		}
		if !addr.IsLoopback() {
			t.Fatalf("--bind %s: gossip listens on %v, not loopback", bind, addr)
		}
	}
}

// TestActorTransportNeedsTheSecret: a local process without the cluster's
// secret can make no call on a node's actor transport (before, any could
// subscribe to the ranks and add requests straight to an engine); one
// with it can. Nodes of the user share the secret through a file only
// the user can read.
func TestActorTransportNeedsTheSecret(t *testing.T) {
	t.Setenv("XDG_CONFIG_HOME", t.TempDir())
	o := DefaultOptions()
	o.Profiles, o.Logger = dpnode.SimProfiles, slog.New(slog.DiscardHandler)
	o.Host, o.Port, o.Bind, o.RPCPort = "127.0.0.1", 0, "127.0.0.1:0", 0
	run, err := Start(o)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := run.Shutdown(); err != nil {
			t.Error(err)
		}
	}()
	addr := run.Node().Meta().ActorAddress
	call := func(opts ...grpc.DialOption) error {
		conn, err := grpc.Dial(addr, append(opts, grpc.WithTransportCredentials(insecure.NewCredentials()))...)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c := remote.NewRemotingClient(conn)
		if _, err := c.ListProcesses(ctx, &remote.ListProcessesRequest{}); err != nil {
			return err
		}
		stream, err := c.Receive(ctx)
		if err == nil {
			_, err = stream.Recv()
		}
		return err
	}
	if err := call(); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("a call without the secret: %v; want Unauthenticated", err)
	}
	wrong := make([]byte, 32)
	_, wrongOpt := guardOptions(wrong)
	if err := call(wrongOpt); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("a call with another secret: %v; want Unauthenticated", err)
	}
	secret, err := transportSecret(nil, true)
	if err != nil {
		t.Fatal(err)
	}
	_, rightOpt := guardOptions(secret)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := grpc.Dial(addr, rightOpt, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// A member gets past the check, to the stream; protoactor's unary
	// methods, which panic, are refused.
	if _, err := remote.NewRemotingClient(conn).ListProcesses(ctx, &remote.ListProcessesRequest{}); status.Code(err) != codes.Unimplemented {
		t.Fatalf("ListProcesses with the user's secret: %v; want Unimplemented", err)
	}

	// The file is the user's alone; one open to others is refused.
	dir, _ := os.UserConfigDir()
	file := filepath.Join(dir, loopbackSecretFile)
	st, err := os.Stat(file)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("the secret's file: %v %v; want mode 0600", st, err)
	}
	if err := os.Chmod(file, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := transportSecret(nil, true); err == nil || !strings.Contains(err.Error(), "other users") {
		t.Fatalf("a secret readable by others: %v", err)
	}
	// The gossip key gives every node of a cluster the same secret.
	a, _ := transportSecret([]byte("0123456789abcdef"), true)
	b, _ := transportSecret([]byte("0123456789abcdef"), false)
	if !bytes.Equal(a, b) || bytes.Equal(a, secret) {
		t.Fatal("the gossip key's secret is not the same on every node, or is the loopback one")
	}
}
