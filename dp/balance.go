package dp

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"

	"github.com/dpnode/dpnode/engine"
)

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
	// SnapshotWaiting and SnapshotRunning are the rank's counts in the
	// coordinator's last load snapshot, numbered SnapshotSeq: what vLLM
	// balances on.
	SnapshotWaiting int
	SnapshotRunning int
	SnapshotSeq     uint64
	// PendingPrefill is the prompt tokens still to prefill of the requests
	// in flight at the rank that have produced no token yet, less what
	// their picks expected the rank to hold in its prefix cache.
	PendingPrefill int
}

// Request is what a policy knows of the request it places.
type Request struct {
	// PromptTokens is the prompt's length.
	PromptTokens int
	// Blocks are the hashes of the prompt's full KV-cache blocks, chained
	// as an engine chains them (engine.HashBlock), so that equal leading
	// hashes mean a shared prefix.
	Blocks []engine.BlockHash
	// BlockSize is the tokens in one block.
	BlockSize int
	// Cached is set by Pick: the prompt tokens the chosen rank likely
	// holds in its prefix cache (0 for policies that do not guess).
	Cached int
}

// NewRequest describes prompt for a policy, with the hashes of its blocks
// of blockSize tokens under the request's cache salt.
func NewRequest(prompt []uint32, blockSize int, salt string) *Request {
	return &Request{PromptTokens: len(prompt), Blocks: engine.PrefixHashes(prompt, blockSize, salt), BlockSize: blockSize}
}

// Policy picks the rank for a request.
//
// Concurrency: not safe for concurrent use; an API server actor owns one.
type Policy interface {
	// Pick returns the index in ranks of the chosen rank, or -1 when none
	// is available. The rank is then assumed to serve req.
	Pick(req *Request, ranks []RankLoad) int
}

// The policy names of --balance-policy.
const (
	PolicyLive       = "live"
	PolicyVLLM       = "vllm"
	PolicyRoundRobin = "round-robin"
	PolicyPowerOfTwo = "p2c"
)

// PolicyNames lists the policies, the default first.
var PolicyNames = []string{PolicyLive, PolicyVLLM, PolicyRoundRobin, PolicyPowerOfTwo}

// PolicyConfig is what NewPolicy needs to know of the deployment.
type PolicyConfig struct {
	// APIServers is how many API servers balance over the same ranks:
	// vLLM's score counts each pick that many times.
	APIServers int
	// StepTokens is the engines' token budget per step
	// (--max-num-batched-tokens).
	StepTokens int
	// PrefillWeight is live's LiveLoad.PrefillWeight; 0 is
	// DefaultPrefillWeight.
	PrefillWeight float64
	// Seed seeds the random choices of p2c.
	Seed uint64
}

// NewPolicy returns the named policy.
func NewPolicy(name string, c PolicyConfig) (Policy, error) {
	switch name {
	case PolicyLive:
		p := NewLiveLoad(c.StepTokens)
		if c.PrefillWeight > 0 {
			p.PrefillWeight = c.PrefillWeight
		}
		return p, nil
	case PolicyVLLM:
		return &SnapshotScore{ClientCount: max(c.APIServers, 1)}, nil
	case PolicyRoundRobin:
		return &RoundRobin{}, nil
	case PolicyPowerOfTwo:
		return NewPowerOfTwo(c.Seed), nil
	}
	return nil, fmt.Errorf("unknown balance policy %q (want %s)", name, strings.Join(PolicyNames, ", "))
}

var (
	_ Policy = (*LiveLoad)(nil)
	_ Policy = (*SnapshotScore)(nil)
	_ Policy = (*RoundRobin)(nil)
	_ Policy = (*PowerOfTwo)(nil)
)

// LiveLoad, dpnode's policy, scores ranks on the API server's exact
// in-flight counts, with the requests a saturated engine reports queued
// weighing four times: load = in-flight + 3·queued. This is vLLM's
// 4·waiting + running without its 100 ms staleness: a request sent a
// microsecond ago counts at once.
//
// Queue counts only where it means waiting for capacity: the engine runs
// as many requests as it may, or its KV cache is nearly full. Elsewhere an
// engine reports as waiting the requests that arrived during its last
// step, which it admits at the next; weighing those herds a burst away
// from whichever rank reported last. Nor does a request the engine has not
// reported on count as queue: reports from a remote rank come later than
// from a local one, and counting the gap would starve remote ranks.
//
// Prefix affinity: the policy remembers which prompt blocks it sent to
// which rank, and takes off a rank's load Affinity times the share of the
// request's prompt the rank likely holds in its prefix cache. A request
// whose prefix a rank holds goes there unless that rank has more than
// Affinity requests more than the least loaded: the imbalance affinity may
// cause is bounded. Ties go to the longer cached prefix, then rotate, so
// equal ranks share a burst evenly.
type LiveLoad struct {
	// Affinity is how many requests of load a full prefix hit is worth; 0
	// turns affinity off.
	Affinity float64
	// PrefillWeight is how many requests of load one step's worth
	// (StepTokens) of prefill waiting at a rank counts as, this request's
	// own uncached prompt included; 0 turns it off.
	PrefillWeight float64
	// StepTokens is the engines' token budget per step
	// (--max-num-batched-tokens).
	StepTokens int
	rotor      rotor
	prefix     PrefixIndex
	matched    []int
}

// LiveLoad's default weights, chosen in the virtual-time simulator: a full
// prefix hit is worth two requests of load, and a step's worth of prefill
// waiting at a rank eight. On docs/BENCHMARKS.md's heavy-tailed workload
// at 80% load over four ranks, TTFT p99 is 603 ms without the prefill
// term, 412 ms with it at 8, and 399 ms at 4096: past a few requests per
// step, the weight matters little.
const (
	DefaultAffinity      = 2
	DefaultPrefillWeight = 8
)

// NewLiveLoad returns dpnode's policy with its default weights, for
// engines that take stepTokens tokens per step (0: no prefill term).
func NewLiveLoad(stepTokens int) *LiveLoad {
	return &LiveLoad{Affinity: DefaultAffinity, PrefillWeight: DefaultPrefillWeight, StepTokens: stepTokens}
}

// Pick implements Policy.
func (p *LiveLoad) Pick(req *Request, ranks []RankLoad) int {
	useAffinity := p.Affinity > 0 && req != nil && len(req.Blocks) > 0 && req.BlockSize > 0 && req.PromptTokens > 0
	if useAffinity {
		p.matched = p.prefix.Match(req.Blocks, ranks, p.matched[:0])
	}
	best := p.rotor.least(ranks, func(i int) float64 {
		r := &ranks[i]
		s := liveScore(r)
		cached := 0
		if useAffinity {
			cached = min(p.matched[i]*req.BlockSize, req.PromptTokens)
		}
		if cached > 0 {
			// The share of the prompt's prefill the rank would skip.
			s -= p.Affinity * float64(cached) / float64(req.PromptTokens)
		}
		if p.PrefillWeight > 0 && p.StepTokens > 0 {
			own := 0
			if req != nil {
				own = req.PromptTokens - cached
			}
			s += p.PrefillWeight * float64(r.PendingPrefill+own) / float64(p.StepTokens)
		}
		return s
	}, func(i, best int) bool {
		// At equal load the longer cached prefix wins.
		return useAffinity && p.matched[i] > p.matched[best]
	})
	if useAffinity && best >= 0 {
		req.Cached = min(p.matched[best]*req.BlockSize, req.PromptTokens)
		p.prefix.Record(ranks[best].Rank, req.Blocks)
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

// SnapshotScore is vLLM's policy (DPLBAsyncMPClient): the least
// 4·waiting + running, on the counts of the coordinator's last snapshot
// (published at most every 100 ms), with each pick adding ClientCount to
// the chosen rank's waiting until the next snapshot. Ties rotate.
type SnapshotScore struct {
	// ClientCount is the number of API servers balancing over the ranks.
	ClientCount int
	seq         uint64
	bumps       []int
	rotor       rotor
}

// Pick implements Policy.
func (p *SnapshotScore) Pick(_ *Request, ranks []RankLoad) int {
	if len(p.bumps) != len(ranks) {
		p.bumps = make([]int, len(ranks))
	}
	for i := range ranks {
		if ranks[i].SnapshotSeq != p.seq {
			p.seq = ranks[i].SnapshotSeq
			clear(p.bumps)
			break
		}
	}
	best := p.rotor.least(ranks, func(i int) float64 {
		return float64(4*(ranks[i].SnapshotWaiting+p.bumps[i]) + ranks[i].SnapshotRunning)
	}, nil)
	if best >= 0 {
		p.bumps[best] += max(p.ClientCount, 1)
	}
	return best
}

// rotor picks the available rank of least score, looking from a start
// that moves on by one each pick, so that ties rotate over the ranks.
type rotor struct{ next int }

// least returns the index of the available rank with the least score,
// where tie, when not nil, may prefer i to an equal best; -1 when no rank
// is available.
func (o *rotor) least(ranks []RankLoad, score func(i int) float64, tie func(i, best int) bool) int {
	best, bestScore := -1, 0.0
	n := len(ranks)
	for k := range n {
		i := (o.next + k) % n
		if !ranks[i].Available {
			continue
		}
		s := score(i)
		if best < 0 || s < bestScore || (s == bestScore && tie != nil && tie(i, best)) {
			best, bestScore = i, s
		}
	}
	if n > 0 {
		o.next = (o.next + 1) % n
	}
	return best
}

// RoundRobin sends each request to the next available rank in turn.
type RoundRobin struct{ next int }

// Pick implements Policy.
func (p *RoundRobin) Pick(_ *Request, ranks []RankLoad) int {
	n := len(ranks)
	for k := range n {
		i := (p.next + k) % n
		if ranks[i].Available {
			p.next = (i + 1) % n
			return i
		}
	}
	return -1
}

// PowerOfTwo samples two available ranks at random and sends the request
// to the one with fewer requests in flight.
type PowerOfTwo struct {
	rng       *rand.Rand
	available []int
}

// NewPowerOfTwo returns a power-of-two-choices policy seeded with seed.
func NewPowerOfTwo(seed uint64) *PowerOfTwo {
	return &PowerOfTwo{rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))}
}

// Pick implements Policy.
func (p *PowerOfTwo) Pick(_ *Request, ranks []RankLoad) int {
	p.available = p.available[:0]
	for i := range ranks {
		if ranks[i].Available {
			p.available = append(p.available, i)
		}
	}
	switch len(p.available) {
	case 0:
		return -1
	case 1:
		return p.available[0]
	}
	a := p.rng.IntN(len(p.available))
	b := p.rng.IntN(len(p.available) - 1)
	if b >= a {
		b++
	}
	i, j := p.available[a], p.available[b]
	if ranks[j].InFlight < ranks[i].InFlight {
		return j
	}
	return i
}

// PrefixIndex remembers, per rank, the prompt blocks last sent there,
// up to Capacity blocks per rank (least recently sent go first): an
// estimate of what each rank's prefix cache holds.
type PrefixIndex struct {
	// Capacity is the most blocks remembered per rank; 0 means
	// DefaultPrefixCapacity.
	Capacity int
	ranks    map[int]*rankBlocks
	// holders counts the ranks that remember each prompt's first block,
	// so that a prompt no rank has seen is told in one lookup, not one per
	// rank. Only first blocks are counted: block hashes chain from the
	// prompt's start, so a first block is never another prompt's later
	// one, and a lookup only ever asks for a first block. Blocks are keyed
	// by their hash's Key: two blocks that share one are a wrong guess of
	// what a rank holds, never a wrong answer.
	holders map[uint64]int
}

// DefaultPrefixCapacity is about what one H100's KV cache holds of an 8B
// model, in blocks of 16 tokens.
const DefaultPrefixCapacity = 1 << 15

type rankBlocks struct {
	// used is when each remembered block was last sent, in Record calls;
	// firsts are those of them that began a prompt.
	used   map[uint64]uint64
	firsts map[uint64]struct{}
	tick   uint64
}

// Match fills matched[i] with how many leading blocks of blocks ranks[i]
// likely holds, and returns it.
func (x *PrefixIndex) Match(blocks []engine.BlockHash, ranks []RankLoad, matched []int) []int {
	if len(blocks) == 0 || x.holders[blocks[0].Key()] == 0 {
		// Block hashes chain, so a rank without the first block holds
		// none of the prefix.
		for range ranks {
			matched = append(matched, 0)
		}
		return matched
	}
	for _, r := range ranks {
		n := 0
		if rb := x.ranks[r.Rank]; rb != nil {
			for _, h := range blocks {
				if _, ok := rb.used[h.Key()]; !ok {
					break
				}
				n++
			}
		}
		matched = append(matched, n)
	}
	return matched
}

// Record notes that rank was sent blocks.
func (x *PrefixIndex) Record(rank int, blocks []engine.BlockHash) {
	if x.ranks == nil {
		x.ranks = map[int]*rankBlocks{}
		x.holders = map[uint64]int{}
	}
	rb := x.ranks[rank]
	if rb == nil {
		rb = &rankBlocks{used: map[uint64]uint64{}, firsts: map[uint64]struct{}{}}
		x.ranks[rank] = rb
	}
	rb.tick++
	if len(blocks) > 0 {
		if k := blocks[0].Key(); rb.used[k] == 0 {
			x.holders[k]++
			rb.firsts[k] = struct{}{}
		}
	}
	for _, h := range blocks {
		rb.used[h.Key()] = rb.tick
	}
	capacity := x.Capacity
	if capacity <= 0 {
		capacity = DefaultPrefixCapacity
	}
	if len(rb.used) > 2*capacity {
		// Keep the capacity most recently sent: amortised over the
		// capacity records that filled the map since the last trim.
		ticks := make([]uint64, 0, len(rb.used))
		for _, t := range rb.used {
			ticks = append(ticks, t)
		}
		slices.Sort(ticks)
		cut := ticks[len(ticks)-capacity]
		for h, t := range rb.used {
			if t < cut {
				delete(rb.used, h)
				rb.release(x, h)
			}
		}
	}
}

// Forget drops what is remembered of rank (its engine restarted with an
// empty cache).
func (x *PrefixIndex) Forget(rank int) {
	if rb := x.ranks[rank]; rb != nil {
		for h := range rb.firsts {
			rb.release(x, h)
		}
		delete(x.ranks, rank)
	}
}

// release notes that the rank no longer remembers the block of key h.
func (rb *rankBlocks) release(x *PrefixIndex, h uint64) {
	if _, first := rb.firsts[h]; !first {
		return
	}
	delete(rb.firsts, h)
	if x.holders[h]--; x.holders[h] <= 0 {
		delete(x.holders, h)
	}
}

// Forgetter is a policy that remembers something of each rank; Forget is
// called when a rank's engine restarts.
type Forgetter interface {
	Forget(rank int)
}

// Forget implements Forgetter.
func (p *LiveLoad) Forget(rank int) { p.prefix.Forget(rank) }

// Account is an API server's own count of what it has sent one rank: the
// part of a rank's load that is exact, because it is counted as requests
// are sent rather than reported by the engine later. The runtime's API
// server and the simulator keep it the same way, here.
type Account struct {
	// InFlight and PendingPrefill are RankLoad's.
	InFlight       int
	PendingPrefill int
}

// Prefill is the tokens a request sent to a rank is expected to make it
// prefill: its tokens (the prompt, and the output a moved request brings)
// less those the pick expected the rank to hold in its prefix cache.
func Prefill(tokens, cached int) int { return max(tokens-cached, 0) }

// Send counts a request sent to the rank that will prefill prefill tokens.
func (a *Account) Send(prefill int) {
	a.InFlight++
	a.PendingPrefill += prefill
}

// Prefilled counts a request's prefill done: its first token came.
func (a *Account) Prefilled(prefill int) { a.PendingPrefill -= prefill }

// Release counts a request out of the rank (ended, failed, aborted or
// moved), with the prefill it still counted (0 once prefilled).
func (a *Account) Release(prefill int) {
	a.InFlight--
	a.PendingPrefill -= prefill
}

// EngineCounts are an engine's own counts, as it reported them after a
// step or as a load snapshot carried them.
type EngineCounts struct {
	Waiting, Running int
	KVUsage          float64
}

// Load is the rank's load as a policy sees it: this account, the engine's
// latest counts, and those of the snapshot numbered snapSeq.
func (a Account) Load(rank int, available bool, capacity int, latest, snap EngineCounts, snapSeq uint64) RankLoad {
	return RankLoad{Rank: rank, Available: available, InFlight: a.InFlight, Capacity: capacity,
		Waiting: latest.Waiting, Running: latest.Running, KVUsage: latest.KVUsage,
		SnapshotWaiting: snap.Waiting, SnapshotRunning: snap.Running, SnapshotSeq: snapSeq,
		PendingPrefill: a.PendingPrefill}
}
