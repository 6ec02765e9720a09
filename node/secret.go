package node

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// The actor transport's peers prove they belong to the cluster on every
// call, before any message is read: with mutual TLS off loopback, and
// with a secret they share everywhere. Without it, any process on the
// machine could subscribe to the ranks, learn the engines' epochs and add
// requests straight to an engine, past the API's keys and admission.
//
// The secret is derived from the gossip key when there is one (every node
// of a cluster has it). Without one the cluster ports are on loopback, and
// the secret is the user's: a file only the user can read, made by the
// first node and read by the others, so that nodes the same user starts on
// one machine join each other and no other user's process reaches them.
// Where no such file can be kept, a node makes one of its own, and serves
// alone.

// secretHeader carries the secret, hex-encoded, on each call.
const secretHeader = "dpnode-cluster-secret"

// loopbackSecretFile is the user's secret's file, under the user's config
// directory.
const loopbackSecretFile = "dpnode/loopback-cluster-secret"

// transportSecret returns the actor transport's secret: derived from
// gossipKey when set; else, on loopback, the user's; else none (an
// --insecure-cluster off loopback, whose risk the flag accepts).
func transportSecret(gossipKey []byte, loopback bool) (secret []byte, err error) {
	if len(gossipKey) > 0 {
		h := sha256.New()
		h.Write([]byte("dpnode actor transport\x00"))
		h.Write(gossipKey)
		return h.Sum(nil), nil
	}
	if !loopback {
		return nil, nil
	}
	dir, err := os.UserConfigDir()
	if err == nil {
		secret, err = userSecret(filepath.Join(dir, loopbackSecretFile))
	}
	if err != nil {
		secret = make([]byte, 32)
		_, _ = rand.Read(secret)
		return secret, fmt.Errorf("cluster: no shared secret for the actor transport (%w): this node's own keeps every other node out", err)
	}
	return secret, nil
}

// userSecret reads the secret in file, making it if there is none: 32
// random bytes, readable by the user alone. It is written whole under
// another name and linked in place, so that nodes starting together all
// read the same one.
func userSecret(file string) ([]byte, error) {
	for range 3 {
		b, err := readSecret(file)
		if !errors.Is(err, fs.ErrNotExist) {
			return b, err
		}
		if err := os.MkdirAll(filepath.Dir(file), 0o700); err != nil {
			return nil, err
		}
		secret := make([]byte, 32)
		_, _ = rand.Read(secret)
		tmp, err := os.CreateTemp(filepath.Dir(file), ".secret-*")
		if err != nil {
			return nil, err
		}
		_, werr := tmp.WriteString(hex.EncodeToString(secret) + "\n")
		cerr := tmp.Close()
		if werr != nil || cerr != nil {
			os.Remove(tmp.Name())
			return nil, errors.Join(werr, cerr)
		}
		err = os.Link(tmp.Name(), file)
		os.Remove(tmp.Name())
		if err == nil {
			return secret, nil
		}
		if !errors.Is(err, fs.ErrExist) {
			return nil, err
		}
		// Another node made it first: read that one.
	}
	return nil, fmt.Errorf("%s could not be made", file)
}

// readSecret reads a secret file, refusing one that others could read or
// write, or that another user owns.
func readSecret(file string) ([]byte, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if st.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("%s is open to other users (mode %v): make it 0600", file, st.Mode().Perm())
	}
	if sys, ok := st.Sys().(*syscall.Stat_t); ok && int(sys.Uid) != os.Getuid() {
		return nil, fmt.Errorf("%s belongs to another user", file)
	}
	b := make([]byte, 128)
	n, _ := f.Read(b)
	secret, err := hex.DecodeString(strings.TrimSpace(string(b[:n])))
	if err != nil || len(secret) < 16 {
		return nil, fmt.Errorf("%s holds no secret: remove it, and the next node makes one", file)
	}
	return secret, nil
}

// secretCreds sends the secret on each call.
type secretCreds struct{ token string }

func (c secretCreds) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{secretHeader: c.token}, nil
}

// RequireTransportSecurity is false: on loopback the transport is plain.
func (secretCreds) RequireTransportSecurity() bool { return false }

// guardOptions returns the server options that refuse calls without the
// secret (when there is one), and the dial option that sends it (nil
// without one). They also refuse every unary call: the transport's
// messages go on its one stream, and protoactor's unary methods panic
// ("implement me"), which would end the process.
func guardOptions(secret []byte) ([]grpc.ServerOption, grpc.DialOption) {
	token := hex.EncodeToString(secret)
	check := func(ctx context.Context) error {
		if secret == nil {
			return nil
		}
		md, _ := metadata.FromIncomingContext(ctx)
		got := md.Get(secretHeader)
		if len(got) != 1 || subtle.ConstantTimeCompare([]byte(got[0]), []byte(token)) != 1 {
			return status.Error(codes.Unauthenticated, "dpnode: not a member of this cluster: the actor transport's secret is missing or wrong (nodes share it through --gossip-key, or on one machine through the user's "+loopbackSecretFile+")")
		}
		return nil
	}
	server := []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(func(ctx context.Context, _ any, info *grpc.UnaryServerInfo, _ grpc.UnaryHandler) (any, error) {
			if err := check(ctx); err != nil {
				return nil, err
			}
			return nil, status.Errorf(codes.Unimplemented, "dpnode: %s is not served", info.FullMethod)
		}),
		grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, next grpc.StreamHandler) error {
			if err := check(ss.Context()); err != nil {
				return err
			}
			return next(srv, ss)
		}),
	}
	if secret == nil {
		return server, nil
	}
	return server, grpc.WithPerRPCCredentials(secretCreds{token: token})
}
