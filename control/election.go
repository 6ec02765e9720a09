package control

import (
	"cmp"
	"fmt"
)

// Member is what the leader election knows of a live node.
type Member struct {
	Name string
	// Boot is the node's start time in Unix nanoseconds; with Name it
	// orders members by age.
	Boot      int64
	StartRank int
	LocalSize int
	// Key is the node's identity in the roster (its --node-id, or else its
	// gossip address).
	Key string
	// Pending: the node is in gossip but has not started its actors (it
	// waits for its ranks, or loads its model). Its committed ranks count
	// as live; it cannot lead.
	Pending bool
}

// older orders members oldest first, names breaking ties.
func older(a, b Member) int {
	return cmp.Or(cmp.Compare(a.Boot, b.Boot), cmp.Compare(a.Name, b.Name))
}

// Election is one node's verdict on who leads: the leader decides the
// roster, and its node runs the coordinator.
type Election struct {
	// Leader is the oldest live member; zero when there is none.
	Leader Member
	// Epoch numbers the leader's incarnation of the coordinator. It is the
	// leader's boot time: when a leader dies, the next oldest takes over,
	// and it booted later, so epochs only grow, whatever clocks say.
	Epoch uint64
	// Quorum is true when the live members host a majority of the ranks:
	// without it, no coordinator runs, so that two halves of a split
	// cluster never both coordinate.
	Quorum bool
	// RanksSeen counts the distinct ranks the live members host.
	RanksSeen int
	// Decides is true when the leader may change the roster: it sees a
	// majority of the ranks the roster gives out (in an elastic
	// deployment, the Quorum). A fixed deployment whose ranks are given
	// out grows from its first node, which holds all there is of the
	// roster long before it holds a majority of the fixed size.
	Decides bool
}

// Elect picks the leader among the members one node sees alive; the
// roster says which ranks the deployment has.
func Elect(members []Member, roster Roster) Election {
	var e Election
	if len(members) == 0 {
		return e
	}
	seen := make(map[int]bool)
	held := make(map[int]bool)
	for _, m := range members {
		for r := m.StartRank; r < m.StartRank+m.LocalSize; r++ {
			if roster.Has(r) {
				seen[r] = true
			}
		}
		// A node that is given its ranks may be seen before it gossips
		// them: they are live from its join on.
		if h, ok := roster.Holding(m.Key); ok && m.Key != "" && !h.Joining {
			for r := h.Start; r < h.End(); r++ {
				seen[r], held[r] = true, true
			}
		}
		if !m.Pending && (e.Leader.Name == "" || older(m, e.Leader) < 0) {
			e.Leader = m
		}
	}
	e.Epoch = uint64(e.Leader.Boot)
	e.RanksSeen = len(seen)
	e.Quorum = 2*e.RanksSeen > roster.Size()
	e.Decides = e.Leader.Name != "" && (e.Quorum || 2*len(held) > roster.Given())
	return e
}

// RankConflict returns an error naming the member that already hosts one
// of the ranks of a joining node, or nil.
func RankConflict(joining Member, members []Member) error {
	for _, m := range members {
		if m.Name == joining.Name {
			continue
		}
		lo := max(m.StartRank, joining.StartRank)
		hi := min(m.StartRank+m.LocalSize, joining.StartRank+joining.LocalSize)
		if lo < hi {
			return fmt.Errorf("control: rank %d is already served by node %s (ranks %d to %d); give this node other ranks with --data-parallel-start-rank",
				lo, m.Name, m.StartRank, m.StartRank+m.LocalSize-1)
		}
	}
	return nil
}
