//go:build llamacpp

// Command dpnode-llama-worker holds one rank's model for dpnode's llama.cpp
// engine. dpnode starts it, one per rank (and one per API node for the
// tokenizer), with its end of a socket pair as file descriptor 3, and
// speaks to it in the messages of proto/dpnode/v1/worker.proto. It is not
// meant to be run by hand.
package main

import (
	"fmt"
	"net"
	"os"
	"path/filepath"

	"github.com/dpnode/dpnode/engine/llamacpp/worker"
)

func main() {
	f := os.NewFile(3, "engine-socket")
	conn, err := net.FileConn(f)
	if err != nil {
		fmt.Fprintln(os.Stderr, "dpnode-llama-worker: no engine socket on fd 3; dpnode starts this worker itself:", err)
		os.Exit(2)
	}
	f.Close()
	opts := worker.Options{}
	if exe, err := os.Executable(); err == nil {
		opts.BackendDir = filepath.Join(filepath.Dir(exe), "llamacpp")
	}
	if err := worker.Serve(conn, opts); err != nil {
		fmt.Fprintln(os.Stderr, "dpnode-llama-worker:", err)
		os.Exit(1)
	}
}
