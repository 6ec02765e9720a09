// Package controltest holds what the tests of package control and of its
// users share.
package controltest

import (
	"context"
	"net"
	"sync"
)

// DNS is a control.Resolver that answers lookups from a table, counts
// them and reports each on Looked, the way a headless Service's name
// resolves to its pods.
type DNS struct {
	// Names maps a host name to its addresses; a name not in it does not
	// resolve.
	Names map[string][]string
	// Looked, when not nil, is sent the count of lookups after each one,
	// unless nobody is ready to take it.
	Looked chan int

	mu      sync.Mutex
	lookups int
}

// LookupHost implements control.Resolver.
func (f *DNS) LookupHost(_ context.Context, host string) ([]string, error) {
	f.mu.Lock()
	f.lookups++
	n, addrs, ok := f.lookups, f.Names[host], f.Names[host] != nil
	f.mu.Unlock()
	if f.Looked != nil {
		select {
		case f.Looked <- n:
		default:
		}
	}
	if !ok {
		return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
	}
	return addrs, nil
}

// Lookups counts the lookups so far.
func (f *DNS) Lookups() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.lookups
}
