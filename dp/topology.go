package dp

import "fmt"

// Topology is a node's place in a data-parallel deployment.
type Topology struct {
	// Size is the number of ranks in the deployment (--data-parallel-size).
	Size int
	// LocalSize is the number of ranks this node hosts
	// (--data-parallel-size-local).
	LocalSize int
	// StartRank is the first rank this node hosts
	// (--data-parallel-start-rank); the node hosts StartRank up to
	// StartRank+LocalSize-1.
	StartRank int
}

// Validate rejects a topology that names impossible ranks, with a message
// that names the flags to change.
func (t Topology) Validate() error {
	switch {
	case t.Size < 1:
		return fmt.Errorf("dp: --data-parallel-size must be at least 1, got %d", t.Size)
	case t.LocalSize < 1:
		return fmt.Errorf("dp: --data-parallel-size-local must be at least 1, got %d", t.LocalSize)
	case t.LocalSize > t.Size:
		return fmt.Errorf("dp: --data-parallel-size-local (%d) cannot exceed --data-parallel-size (%d)", t.LocalSize, t.Size)
	case t.StartRank < 0:
		return fmt.Errorf("dp: --data-parallel-start-rank must be at least 0, got %d", t.StartRank)
	case t.StartRank+t.LocalSize > t.Size:
		return fmt.Errorf("dp: --data-parallel-start-rank (%d) plus --data-parallel-size-local (%d) exceeds --data-parallel-size (%d): this node would host ranks %d to %d, but ranks end at %d",
			t.StartRank, t.LocalSize, t.Size, t.StartRank, t.StartRank+t.LocalSize-1, t.Size-1)
	}
	return nil
}

// LocalRanks lists the ranks this node hosts.
func (t Topology) LocalRanks() []int {
	r := make([]int, t.LocalSize)
	for i := range r {
		r[i] = t.StartRank + i
	}
	return r
}

// Hosts reports whether this node hosts rank.
func (t Topology) Hosts(rank int) bool {
	return rank >= t.StartRank && rank < t.StartRank+t.LocalSize
}
