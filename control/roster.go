package control

import (
	"cmp"
	"fmt"
	"slices"

	"github.com/dpnode/dpnode/dp"
)

// Hold is the ranks one node holds: Count ranks from Start on.
type Hold struct {
	// Node is the node's stable identity (its --node-id, or else its
	// gossip address), the same across its restarts, so that a node that
	// comes back after a crash finds its ranks.
	Node         string
	Start, Count int
	// Joining: the ranks are the node's, but it has not started them. A
	// joining hold keeps its ranks from other nodes and is not part of
	// the deployment's size until the leader sees the node serve
	// (Commit), so that a node that dies while it loads its model leaves
	// the size, and the quorum, as they were.
	Joining bool
}

// End is one past the hold's last rank.
func (h Hold) End() int { return h.Start + h.Count }

func (h Hold) String() string {
	if h.Count == 1 {
		return fmt.Sprintf("rank %d", h.Start)
	}
	return fmt.Sprintf("ranks %d to %d", h.Start, h.End()-1)
}

// Roster is which node holds which ranks, as the leader decided it.
// It is cluster state with a version: every change is decided by one
// leader, which holds a majority of the ranks of the roster it
// changes, and nodes keep the newest roster they have heard of. A count
// of the visible members would not do: each side of a partition would
// see a majority of its own.
//
// With a fixed size (--data-parallel-size N) the deployment has ranks 0 to
// N-1 whoever holds them, and the roster records only the ranks given out
// by assignment (--data-parallel-start-rank auto). With an elastic size
// (--data-parallel-size auto) the deployment is exactly the ranks the
// roster gives out: a node that joins grows it, one that leaves shrinks
// it, one that crashes keeps its ranks until it comes back.
type Roster struct {
	// Version rises with every change.
	Version uint64
	// Epoch is the epoch of the leader that made the change; it orders
	// two rosters of one version (two leaders that each believed they
	// led, for a moment).
	Epoch uint64
	// Fixed is the fixed size; 0 for an elastic one.
	Fixed int
	// Holds are ordered by Start and never overlap.
	Holds []Hold
}

// Elastic reports whether the deployment's size follows its roster.
func (r Roster) Elastic() bool { return r.Fixed == 0 }

// Size is the number of ranks in the deployment.
func (r Roster) Size() int {
	if !r.Elastic() {
		return r.Fixed
	}
	return r.Given()
}

// Given counts the ranks the roster gives out to nodes that serve them
// (joining holds are not counted).
func (r Roster) Given() int {
	n := 0
	for _, h := range r.Holds {
		if !h.Joining {
			n += h.Count
		}
	}
	return n
}

// Span is one past the highest rank number in the deployment: a rank
// below it may be served, one at or above it is not. An elastic roster
// has holes where nodes left.
func (r Roster) Span() int {
	if !r.Elastic() {
		return r.Fixed
	}
	if len(r.Holds) == 0 {
		return 0
	}
	return r.Holds[len(r.Holds)-1].End()
}

// Has reports whether rank is one of the deployment's (a joining node's
// ranks are not yet).
func (r Roster) Has(rank int) bool {
	if !r.Elastic() {
		return rank >= 0 && rank < r.Fixed
	}
	h, ok := r.Holder(rank)
	return ok && !h.Joining
}

// Holder returns the hold that gives out rank, joining or not.
func (r Roster) Holder(rank int) (Hold, bool) {
	i := slices.IndexFunc(r.Holds, func(h Hold) bool { return rank >= h.Start && rank < h.End() })
	if i < 0 {
		return Hold{}, false
	}
	return r.Holds[i], true
}

// Holding returns the node's hold.
func (r Roster) Holding(node string) (Hold, bool) {
	i := slices.IndexFunc(r.Holds, func(h Hold) bool { return h.Node == node })
	if i < 0 {
		return Hold{}, false
	}
	return r.Holds[i], true
}

// Newer reports whether r supersedes o.
func (r Roster) Newer(o Roster) bool {
	return cmp.Or(cmp.Compare(r.Version, o.Version), cmp.Compare(r.Epoch, o.Epoch)) > 0
}

// Claim is a node's request for ranks.
type Claim struct {
	Node string
	// Start is the first rank the node asks for, or -1 for the lowest
	// free ones.
	Start, Count int
	// Experts, when above 0, is the model's expert count: the deployment's
	// size must divide it (expert parallelism shards the experts over
	// the ranks).
	Experts int
}

// Assign gives a claim its ranks and returns the roster that records it,
// with the version and epoch of the deciding leader, and the hold.
// A node that holds ranks already keeps them (it restarted) when it asks
// for as many; the roster is then returned unchanged. Otherwise it gets
// the ranks it named, or the lowest Count consecutive ranks that nobody
// holds: neither in the roster nor in busy, the live members that host
// ranks the roster does not record (nodes with fixed ranks in a fixed
// deployment, and nodes that gave their ranks back but have not left).
func (r Roster) Assign(c Claim, busy []Member, epoch uint64) (Roster, Hold, error) {
	if c.Count < 1 {
		return r, Hold{}, fmt.Errorf("control: node %s asks for %d ranks; a node that joins brings at least one", c.Node, c.Count)
	}
	if h, ok := r.Holding(c.Node); ok && h.Count == c.Count && (c.Start < 0 || c.Start == h.Start) {
		return r, h, nil
	}
	// A node that comes back with another shape gives its old ranks up.
	next := r.without(c.Node)
	taken := func(lo, hi int) bool {
		for _, h := range next.Holds {
			if lo < h.End() && h.Start < hi {
				return true
			}
		}
		for _, m := range busy {
			if m.LocalSize > 0 && lo < m.StartRank+m.LocalSize && m.StartRank < hi {
				return true
			}
		}
		return false
	}
	limit := dp.MaxRanks
	if !r.Elastic() {
		limit = r.Fixed
	}
	start := c.Start
	if start < 0 {
		for start = 0; start+c.Count <= limit && taken(start, start+c.Count); start++ {
		}
	}
	switch {
	case start+c.Count > limit && c.Start < 0:
		return r, Hold{}, fmt.Errorf("control: no %d free consecutive ranks below %d for node %s; the deployment is full", c.Count, limit, c.Node)
	case start+c.Count > limit:
		return r, Hold{}, fmt.Errorf("control: node %s asks for ranks %d to %d, but ranks end at %d", c.Node, start, start+c.Count-1, limit-1)
	case taken(start, start+c.Count):
		return r, Hold{}, fmt.Errorf("control: node %s asks for ranks %d to %d, and some are already held; give it other ranks with --data-parallel-start-rank, or auto", c.Node, start, start+c.Count-1)
	}
	h := Hold{Node: c.Node, Start: start, Count: c.Count, Joining: true}
	next.Holds = append(next.Holds, h)
	slices.SortFunc(next.Holds, func(a, b Hold) int { return a.Start - b.Start })
	// Joining holds count: two nodes that join at once must both fit.
	grown := 0
	for _, h := range next.Holds {
		grown += h.Count
	}
	if c.Experts > 0 && next.Elastic() && c.Experts%grown != 0 {
		return r, Hold{}, fmt.Errorf("control: node %s would make the deployment %d ranks, which does not divide the model's %d experts; grow it by steps that keep the size a divisor of %d",
			c.Node, grown, c.Experts, c.Experts)
	}
	next.Version, next.Epoch = r.Version+1, epoch
	return next, h, nil
}

// Commit makes a joining node's ranks part of the deployment, once it
// serves them; it says whether the node had a joining hold.
func (r Roster) Commit(node string, epoch uint64) (Roster, bool) {
	i := slices.IndexFunc(r.Holds, func(h Hold) bool { return h.Node == node && h.Joining })
	if i < 0 {
		return r, false
	}
	next := r
	next.Holds = slices.Clone(r.Holds)
	next.Holds[i].Joining = false
	next.Version, next.Epoch = r.Version+1, epoch
	return next, true
}

// Release returns the roster without the node's ranks, and whether it
// held any; the version rises only when it did.
func (r Roster) Release(node string, epoch uint64) (Roster, bool) {
	if _, ok := r.Holding(node); !ok {
		return r, false
	}
	next := r.without(node)
	next.Version, next.Epoch = r.Version+1, epoch
	return next, true
}

func (r Roster) without(node string) Roster {
	next := r
	next.Holds = slices.DeleteFunc(slices.Clone(r.Holds), func(h Hold) bool { return h.Node == node })
	return next
}
