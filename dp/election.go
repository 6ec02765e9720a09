package dp

import (
	"cmp"
	"fmt"
	"slices"
)

// Member is what the coordinator election knows of a live node.
type Member struct {
	Name string
	// Boot is the node's start time in Unix nanoseconds; with Name it
	// orders members by age.
	Boot      int64
	StartRank int
	LocalSize int
}

// older orders members oldest first, names breaking ties.
func older(a, b Member) int {
	return cmp.Or(cmp.Compare(a.Boot, b.Boot), cmp.Compare(a.Name, b.Name))
}

// Election is one node's verdict on who runs the coordinator.
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
}

// Elect picks the coordinator among the members one node sees alive.
func Elect(members []Member, dpSize int) Election {
	var e Election
	if len(members) == 0 {
		return e
	}
	e.Leader = slices.MinFunc(members, older)
	e.Epoch = uint64(e.Leader.Boot)
	seen := make(map[int]bool)
	for _, m := range members {
		for r := m.StartRank; r < m.StartRank+m.LocalSize; r++ {
			if r >= 0 && r < dpSize {
				seen[r] = true
			}
		}
	}
	e.RanksSeen = len(seen)
	e.Quorum = 2*e.RanksSeen > dpSize
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
			return fmt.Errorf("dp: rank %d is already served by node %s (ranks %d to %d); give this node other ranks with --data-parallel-start-rank",
				lo, m.Name, m.StartRank, m.StartRank+m.LocalSize-1)
		}
	}
	return nil
}
