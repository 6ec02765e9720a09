package actors

import (
	"errors"
	"net"
	"syscall"
	"time"

	"github.com/asynkron/protoactor-go/actor"
)

// How a node finds out that a member is gone before gossip does: probes
// of its actor transport, and what follows when one fails.

// probe asks whether the process of the member at a peer address is
// still there, after the actor transport lost its connection to it (or
// another node elected a newer coordinator). Gossip takes seconds to tell
// a dead node from a slow one, since silence is all it hears; a refused
// connection is a stronger signal. The kernel of a live host refuses a
// connection to a port nobody listens on, which is what a killed process
// leaves, while a stopped or overloaded process still has its connections
// accepted by the kernel. So a refusal is taken as death at once, and
// anything else (accepted, timed out, unreachable) is left to gossip.
func (n *nodeActor) probe(ctx actor.Context, addr string) {
	if name := n.memberAt(addr); name != "" && name != n.cfg.Name {
		n.probeMember(ctx, name, addr)
	}
}

// memberAt names the member whose actors are at addr, or "".
func (n *nodeActor) memberAt(addr string) string {
	for name, m := range n.members {
		if m.ActorAddress == addr {
			return name
		}
	}
	return ""
}

func (n *nodeActor) probeMember(ctx actor.Context, name, addr string) {
	if addr == "" || addr == n.self.ActorAddress || n.probing[addr] || n.stopping {
		return
	}
	n.probing[addr] = true
	self, root := ctx.Self(), ctx.ActorSystem().Root
	go func() {
		err := probeRefused(addr)
		root.Send(self, &peerGone{name: name, address: addr, err: err})
	}()
}

// Probes of a lost peer: several, because a killed process's connections
// may drop a moment before its listening socket closes (a connection made
// then is accepted, or reset), and because a probe costs one connection
// the kernel accepts.
const (
	probeTries    = 10
	probeInterval = 50 * time.Millisecond
	probeTimeout  = 500 * time.Millisecond
)

// probeRefused returns the error of a connection to addr that was
// refused. It returns nil when the port stayed open through every try, or
// did not answer one (silence is gossip's to judge).
func probeRefused(addr string) error {
	for i := range probeTries {
		if i > 0 {
			time.Sleep(probeInterval)
		}
		c, err := net.DialTimeout("tcp", addr, probeTimeout)
		var ne net.Error
		switch {
		case err == nil:
			c.Close()
		case errors.Is(err, syscall.ECONNREFUSED):
			return err
		case errors.As(err, &ne) && ne.Timeout():
			return nil
		}
	}
	return nil
}

// goneRecheck is how long a member found gone stays gone while gossip
// still has it alive, before it is probed again: a refusal that was not a
// death (a firewall that rejects, say) costs the member this long, not
// forever.
const goneRecheck = 15 * time.Second

type recheckGone struct {
	name string
}

// peerGone acts on a probe: a member whose port refused connections is
// gone for this node, as if gossip had declared it dead, until gossip
// does. One found gone that answers a later probe, while gossip never
// declared it dead, is a member again.
func (n *nodeActor) peerGone(ctx actor.Context, msg *peerGone) {
	delete(n.probing, msg.address)
	if n.stopping {
		return
	}
	if meta := n.gone[msg.name]; meta != nil {
		if msg.err != nil {
			n.recheckLater(ctx, msg.name)
			return
		}
		if n.memberAt(msg.address) != "" {
			// A new incarnation answers at the address: the one found
			// gone stays gone until gossip says so too.
			return
		}
		n.cfg.Logger.Warn("a node found gone answers again, and gossip never declared it dead; it is a member again",
			"node", msg.name, "address", msg.address)
		delete(n.gone, msg.name)
		n.members[msg.name] = meta
		ctx.Send(n.api, &nodeUp{name: msg.name, meta: meta})
		n.reelect(ctx)
		return
	}
	m, known := n.members[msg.name]
	if msg.err == nil || !known || m.ActorAddress != msg.address {
		return
	}
	n.cfg.Logger.Warn("a node's process is gone: its actor port refuses connections; not waiting for gossip",
		"node", msg.name, "address", msg.address, "error", msg.err)
	n.metrics.nodesFoundGone.Inc()
	n.metrics.events.add(EventNodeGone, msg.name, -1, "its actor port refuses connections: the process is gone")
	n.gone[msg.name] = m
	// Not cut: the transport lost its connection to it already (that is
	// what set the probe off), and a new incarnation at the address may
	// be connected by now, which a cut would sever.
	n.memberGone(ctx, msg.name, false)
	n.recheckLater(ctx, msg.name)
	n.reelect(ctx)
}

func (n *nodeActor) recheckLater(ctx actor.Context, name string) {
	self, root := ctx.Self(), ctx.ActorSystem().Root
	time.AfterFunc(goneRecheck, func() { root.Send(self, &recheckGone{name: name}) })
}
