package actors

import (
	"errors"
	"net"
	"syscall"
	"testing"
)

// TestProbeTellsAGoneProcessFromASlowOne: a port nobody listens on is a
// death; a listener that never accepts (a stopped process: the kernel
// still completes the handshake) is not.
func TestProbeTellsAGoneProcessFromASlowOne(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if err := probeRefused(ln.Addr().String()); err != nil {
		t.Fatalf("a listener that never accepts: %v, want no verdict", err)
	}
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := closed.Addr().String()
	closed.Close()
	if err := probeRefused(addr); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("a closed port: %v, want connection refused", err)
	}
}
