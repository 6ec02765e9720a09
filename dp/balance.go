package dp

// RankLoad is a balancer's view of one rank.
type RankLoad struct {
	Rank int
	// Available is false while the rank is restarting or gone.
	Available bool
	// InFlight counts requests this API server sent to the rank that have
	// not finished. It is exact: the API server counts them itself.
	InFlight int
	// Waiting and Running are the engine's own counts after its last step.
	Waiting int
	Running int
	// KVUsage is the engine's share of KV blocks in use, from 0 to 1.
	KVUsage float64
	// Capacity is the most requests the engine runs at once
	// (--max-num-seqs); 0 when unknown.
	Capacity int
}

// Policy picks the rank for a request.
//
// Concurrency: not safe for concurrent use; an API server actor owns one.
type Policy interface {
	// Pick returns the index in ranks of the chosen rank, or -1 when none
	// is available.
	Pick(ranks []RankLoad) int
}

var _ Policy = (*LiveLoad)(nil)

// LiveLoad scores ranks on the API server's exact in-flight counts, with
// the requests a saturated engine reports queued weighing four times:
// score = in-flight + 3·queued. This is vLLM's 4·waiting + running without
// its 100 ms staleness: a request sent a microsecond ago counts at once.
//
// Queue counts only where it means waiting for capacity: the engine runs
// as many requests as it may, or its KV cache is nearly full. Elsewhere an
// engine reports as waiting the requests that arrived during its last
// step, which it admits at the next; weighing those herds a burst away
// from whichever rank reported last. Nor does a request the engine has not
// reported on count as queue: reports from a remote rank come later than
// from a local one, and counting the gap would starve remote ranks. Ties
// rotate, so equal ranks share a burst evenly.
type LiveLoad struct {
	next int
}

// Pick implements Policy.
func (p *LiveLoad) Pick(ranks []RankLoad) int {
	best, bestScore := -1, 0.0
	n := len(ranks)
	for k := range n {
		i := (p.next + k) % n
		r := &ranks[i]
		if !r.Available {
			continue
		}
		if s := liveScore(r); best < 0 || s < bestScore {
			best, bestScore = i, s
		}
	}
	if n > 0 {
		p.next = (p.next + 1) % n
	}
	return best
}

// kvSaturated is the KV usage from which new requests wait for blocks.
const kvSaturated = 0.9

func liveScore(r *RankLoad) float64 {
	queued := 0
	if (r.Capacity > 0 && r.Running >= r.Capacity) || r.KVUsage >= kvSaturated {
		queued = min(r.Waiting, r.InFlight)
	}
	return float64(r.InFlight + 3*queued)
}
