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

// LiveLoad scores ranks on the API server's exact in-flight counts, split
// into running and queued by the engines' own stats: score = 4·queued +
// running, plus a penalty for queued work on a rank whose KV cache is over
// half full (where new requests wait for blocks). This is vLLM's score,
// without its 100 ms staleness: a request sent a microsecond ago counts at
// once. Ties rotate, so equal ranks share a burst evenly.
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

func liveScore(r *RankLoad) float64 {
	running := min(r.InFlight, r.Running)
	queued := float64(r.InFlight - running)
	return 4*queued + float64(running) + 6*queued*max(0, r.KVUsage-0.5)
}
