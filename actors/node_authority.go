package actors

import (
	"github.com/asynkron/protoactor-go/actor"

	"github.com/dpnode/dpnode/control"
	dpnodev1 "github.com/dpnode/dpnode/proto/dpnode/v1"
)

// The leader's decisions on the roster: claims, commits and sweeps of
// joining holds. Only the node that leads (decides) acts; the others
// ignore claims, which their senders repeat to every member.

// decides reports whether this node changes the roster: it leads, and
// sees a majority of the ranks (control.Election.Decides). A node with no
// peers never does.
func (n *nodeActor) decides() bool {
	return n.election.Decides && n.election.Leader.Name == n.cfg.Name && n.cfg.PublishRoster != nil
}

// decide adopts a roster this node decided as the leader, and spreads it;
// claimant is the node whose claim it answers, if any.
func (n *nodeActor) decide(ctx actor.Context, next control.Roster, claimant string) {
	if storeNewer(n.roster, next) {
		n.adoptRoster(ctx)
	}
	if n.cfg.PublishRoster != nil {
		n.cfg.PublishRoster(next, claimant)
	}
}

// commitJoining makes a joining node's ranks the deployment's once it
// serves them, when this node leads.
func (n *nodeActor) commitJoining(ctx actor.Context, key string, m *dpnodev1.NodeMeta) {
	if !n.decides() || key == "" {
		return
	}
	h, ok := n.known.Holding(key)
	if !ok || !h.Joining || int(m.StartRank) != h.Start || int(m.LocalSize) != h.Count {
		return
	}
	next, _ := n.known.Commit(key, n.election.Epoch)
	n.cfg.Logger.Info("a node serves the ranks it was given; they join the deployment", "node", key, "ranks", h.String(), "size", next.Size())
	n.decide(ctx, next, "")
}

// dropJoining frees the ranks of a node that left before it served them,
// when this node leads: it may never come back.
func (n *nodeActor) dropJoining(ctx actor.Context, key string) {
	if !n.decides() || key == "" {
		return
	}
	if h, ok := n.known.Holding(key); !ok || !h.Joining {
		return
	}
	next, _ := n.known.Release(key, n.election.Epoch)
	n.cfg.Logger.Warn("a node left before it served the ranks it was given; they are free again", "node", key)
	n.decide(ctx, next, "")
}

// sweepJoining settles the joining holds a new leader finds: those
// of nodes that serve are committed, those of nodes gone are freed.
func (n *nodeActor) sweepJoining(ctx actor.Context) {
	present := map[string]bool{}
	for _, p := range n.pending {
		present[p.key] = true
	}
	for name, key := range n.keys {
		if m := n.members[name]; m != nil {
			present[key] = true
			n.commitJoining(ctx, key, m)
		}
	}
	for _, h := range n.known.Holds {
		if h.Joining && !present[h.Node] {
			n.dropJoining(ctx, h.Node)
		}
	}
}

// claim decides a node's claim for ranks, or its leave, when this node
// runs the coordinator: the one place where ranks are given out, so that
// two nodes that join at once never get the same ones. Elsewhere the
// claim is ignored; the claimant sends it to every member until the
// roster answers it.
func (n *nodeActor) claim(ctx actor.Context, msg *claimRanks) {
	if !n.decides() {
		return
	}
	epoch := n.election.Epoch
	next := n.known
	if msg.release {
		var ok bool
		h, _ := n.known.Holding(msg.claim.Node)
		if next, ok = n.known.Release(msg.claim.Node, epoch); ok {
			n.cfg.Logger.Info("a node leaves and gives its ranks back", "node", msg.claim.Node, "size", next.Size())
			if n.coord != nil {
				// It has drained: the group goes on without its ranks
				// now, before its engines stop, so that no step waits
				// for them. The roster that follows keeps them out.
				var ranks []int
				for r := h.Start; r < h.End(); r++ {
					ranks = append(ranks, r)
				}
				ctx.Send(n.coord, &dropRanks{ranks: ranks})
			}
		}
	} else {
		var busy []control.Member
		for name, m := range n.members {
			busy = append(busy, control.Member{Name: name, StartRank: int(m.StartRank), LocalSize: int(m.LocalSize)})
		}
		c := msg.claim
		c.Experts = max(c.Experts, n.cfg.Experts)
		var h control.Hold
		var err error
		if next, h, err = n.known.Assign(c, busy, epoch); err != nil {
			n.cfg.Logger.Warn("refused a node's claim for ranks", "node", c.Node, "error", err)
			if n.cfg.RefuseClaim != nil {
				n.cfg.RefuseClaim(c.Node, err)
			}
			return
		}
		if next.Version != n.known.Version {
			n.cfg.Logger.Info("gave a node its ranks", "node", c.Node, "ranks", h.String(), "size", next.Size())
		}
	}
	// Published even when nothing changed: the claimant asks because it
	// has not heard of the roster that answers it.
	n.decide(ctx, next, msg.claim.Node)
}
