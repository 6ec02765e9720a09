package node

import (
	"bytes"
	"context"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/remote"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/dpnode/dpnode/control"
	"github.com/dpnode/dpnode/control/controltest"
)

// TestCertsGossipKeyIsAccepted: the gossip key dpnode certs writes
// (control.OpenCA) is one --gossip-key takes.
func TestCertsGossipKeyIsAccepted(t *testing.T) {
	dir := t.TempDir()
	if _, _, err := control.OpenCA(dir); err != nil {
		t.Fatal(err)
	}
	key, err := os.ReadFile(filepath.Join(dir, control.GossipKeyFile))
	if err != nil {
		t.Fatal(err)
	}
	o := DefaultOptions()
	o.GossipKey = strings.TrimSpace(string(key))
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
	tlsFiles := control.TLSFiles{Cert: "n.pem", Key: "n-key.pem", CA: "ca.pem"}
	key := "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY="
	cases := []struct {
		name     string
		bind     string
		key      string
		tls      control.TLSFiles
		insecure bool
		refused  bool
	}{
		{"loopback, nothing", "127.0.0.1:7946", "", control.TLSFiles{}, false, false},
		{"another loopback address", "127.0.0.9:7946", "", control.TLSFiles{}, false, false},
		{"all interfaces, nothing", "0.0.0.0:7946", "", control.TLSFiles{}, false, true},
		{"a LAN address, key only", "10.0.0.1:7946", key, control.TLSFiles{}, false, true},
		{"a LAN address, TLS only", "10.0.0.1:7946", "", tlsFiles, false, true},
		{"a LAN address, key and TLS", "10.0.0.1:7946", key, tlsFiles, false, false},
		{"all interfaces, insecure", "0.0.0.0:7946", "", control.TLSFiles{}, true, false},
		// A name is checked for what it resolves to: memberlist cannot
		// listen on a name, and listened on every interface for one.
		{"a name of loopback", "localhost:7946", "", control.TLSFiles{}, false, false},
		{"a name of a LAN address, nothing", "node-a.lan:7946", "", control.TLSFiles{}, false, true},
		{"a name of a LAN address, key and TLS", "node-a.lan:7946", key, tlsFiles, false, false},
		{"IPv6 loopback", "[::1]:7946", "", control.TLSFiles{}, false, false},
	}
	dns := &controltest.DNS{Names: map[string][]string{"localhost": {"::1", "127.0.0.1"}, "node-a.lan": {"10.0.0.7"}}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			o := DefaultOptions()
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
	dns := &controltest.DNS{Names: map[string][]string{"localhost": {"::1", "127.0.0.1"}, "v6only": {"fe80::1", "::1"}}}
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
		o.Logger = slog.New(slog.DiscardHandler)
		o.Host, o.Port, o.Bind, o.RPCPort = "127.0.0.1", 0, bind, 0
		run, err := Start(o)
		if err != nil {
			if bind == "[::1]:0" && strings.Contains(err.Error(), "cannot assign requested address") {
				t.Log("this machine has no IPv6 loopback")
				continue
			}
			t.Fatalf("--bind %s: %v", bind, err)
		}
		gossip := run.membership.Address()
		if err := run.Shutdown(); err != nil {
			t.Fatal(err)
		}
		host, _, err := net.SplitHostPort(gossip)
		if ip := net.ParseIP(host); err != nil || !ip.IsLoopback() {
			t.Fatalf("--bind %s: gossip listens on %s, not loopback", bind, gossip)
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
	o.Logger = slog.New(slog.DiscardHandler)
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
	if got := callTransport(t, addr, nil); got != codes.Unauthenticated.String() {
		t.Fatalf("a call without the secret: %s; want Unauthenticated", got)
	}
	if got := callTransport(t, addr, make([]byte, 32)); got != codes.Unauthenticated.String() {
		t.Fatalf("a call with another secret: %s; want Unauthenticated", got)
	}
	secret, err := transportSecret(nil, true)
	if err != nil {
		t.Fatal(err)
	}
	// A member gets past the check, to the stream; protoactor's unary
	// methods, which panic, are refused.
	if got := callTransport(t, addr, secret); got != codes.Unimplemented.String() {
		t.Fatalf("ListProcesses with the user's secret: %s; want Unimplemented", got)
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

// transportCallEnv makes the test binary a client of an actor transport:
// "address secret-in-hex" (see callTransport).
const transportCallEnv = "DPNODE_TEST_TRANSPORT_CALL"

// callTransport calls the actor transport at addr as a process holding
// secret (nil: none) would, and returns the status code of the first call
// refused ("OK" if none was). The client runs in a child process: gRPC's
// client goroutines outlive a closed connection and read its process-wide
// logger, which the next node started in this process writes
// (protoactor's remote.Start), unsynchronized.
func callTransport(t *testing.T, addr string, secret []byte) string {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	// Under -race a process waits a second at exit unless told not to.
	cmd.Env = append(os.Environ(), transportCallEnv+"="+addr+" "+hex.EncodeToString(secret), "GORACE=atexit_sleep_ms=0")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("the client process: %v\n%s", err, stderr.Bytes())
	}
	return strings.TrimSpace(string(out))
}

// The child process of callTransport: it calls, prints the status code and
// exits before any test runs.
func init() {
	call, ok := os.LookupEnv(transportCallEnv)
	if !ok {
		return
	}
	addr, key, _ := strings.Cut(call, " ")
	secret, err := hex.DecodeString(key)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	opts := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	if len(secret) > 0 {
		_, send := guardOptions(secret)
		opts = append(opts, send)
	}
	conn, err := grpc.Dial(addr, opts...)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	c := remote.NewRemotingClient(conn)
	_, err = c.ListProcesses(ctx, &remote.ListProcessesRequest{})
	if err == nil {
		var stream remote.Remoting_ReceiveClient
		if stream, err = c.Receive(ctx); err == nil {
			_, err = stream.Recv()
		}
	}
	cancel()
	conn.Close()
	fmt.Println(status.Code(err))
	os.Exit(0)
}
