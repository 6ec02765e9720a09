package control

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
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

// Node issues a certificate for a node and returns its TLS files.
func (ca *testCA) Node(t *testing.T, name string) TLSFiles {
	t.Helper()
	f, err := ca.Issue(name)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// Seal issues a certificate for a node and returns the node's Seal.
func (ca *testCA) Seal(t *testing.T, name string) Seal {
	t.Helper()
	s, err := ca.Node(t, name).GossipSeal()
	if err != nil {
		t.Fatal(err)
	}
	return s
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
			sc, err := tc.server.Credentials()
			if err != nil {
				t.Fatal(err)
			}
			cc, err := tc.client.Credentials()
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
		if _, err := f.Credentials(); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{caKeyFile, GossipKeyFile, "node-a-key.pem"} {
		st, err := os.Stat(filepath.Join(dir, name))
		if err != nil || st.Mode().Perm() != 0o600 {
			t.Fatalf("%s: %v %v; want mode 0600", name, err, st)
		}
	}
}
