package sim

import (
	"fmt"
	"math"
	"time"
)

// BatchShape is what the cost model needs to know about one engine step.
type BatchShape struct {
	// PrefillTokens (P) is the prompt (or recompute) tokens computed in
	// the step.
	PrefillTokens int
	// PrefillContextProduct is Σ over prefill chunks of chunkTokens ×
	// (tokensInContextBeforeChunk + chunkTokens/2): the mean context a
	// token of the chunk attends to, causal attention within the chunk
	// included. It prices attention in prefill.
	PrefillContextProduct int64
	// DecodeSeqs (N) is the sequences decoding one token.
	DecodeSeqs int
	// DecodeContextTokens (ΣK) is the total context length of the decode
	// sequences.
	DecodeContextTokens int64

	// The fields below describe expert parallelism (a MoE profile served
	// with --enable-expert-parallel); they are zero otherwise.

	// EPRanks is the size of the EP group; 0 or 1 means no EP.
	EPRanks int
	// EPTotalTokens (N_total) is the tokens in this step across all ranks
	// of the group; the rank's own N+P when smaller.
	EPTotalTokens int
	// CrossNode says the collective crosses nodes (RDMA) and so costs the
	// profile's ExpertParallel.CrossNodeFactor more.
	CrossNode bool
}

// StepTime is how long one engine step of shape b takes on the profiled
// hardware, including the expert-parallel collective. It is a pure function
// of p and b.
//
// A dense profile and a MoE profile without EP cost
//
//	a + b·P + c·N + d·ΣK/1000 + prefix·PrefillContextProduct/1000   (ms)
//
// with the coefficients of p.Cost (each cited in the profile's sources;
// the form and the fit are in docs/CALIBRATION.md). A MoE profile adds
// x·E(N+P), where E(T) is the expected number of distinct experts T tokens
// are routed to (see expectedExperts): a decode step is bound by streaming
// weights, and a MoE step streams only the experts it touches.
//
// With EP of size R, each rank streams only its own NumExperts/R experts,
// but every token in the group (N_total) is routed over all of them, so
// the expert term is x·E_R(N_total), and the dispatch/combine collective
// (CollectiveTime) is added. All ranks of an EP group step in lockstep: the
// caller pairs ranks' steps, and a step of the group lasts as long as its
// slowest rank's.
//
// An empty batch costs nothing without EP: there is no step. With EP an
// idle rank still has to join every layer's all-to-all, and vLLM does so by
// running a one-token dummy batch (execute_dummy_batch), so an empty EP
// step is priced as that batch: one token with no context, plus the
// collective. The token is priced as the cheaper kind (for every built-in
// profile, a prefill token), so that an empty step never costs more than
// a step that computes a token.
//
// StepTime panics if a count in b is negative: the scheduler built an
// impossible batch.
func (p *Profile) StepTime(b BatchShape) time.Duration {
	return msToDuration(p.stepMs(b))
}

// CollectiveTime is the expert-parallel all-to-all part of StepTime alone:
// zero without EP or for a dense profile, otherwise
//
//	(BaseMs + DecodeTokenMs·N + PrefillTokenMs·P) × CrossNodeFactor if CrossNode
//
// with N and P this rank's tokens (an empty step counting as the one-token
// dummy batch). The figures are docs/CALIBRATION.md's estimates for 48 MoE
// layers of dispatch and combine, scaled from the pplx-kernels and DeepEP
// measurements in the profile's sources. Using this rank's own tokens
// makes the busiest rank's collective the longest, and since the group
// waits for its slowest rank, that is the one that counts, as in an
// all-to-all bound by its largest payload.
func (p *Profile) CollectiveTime(b BatchShape) time.Duration {
	n, prefill := shapeTokens(b)
	if !p.expertParallel(b) {
		return 0
	}
	if n == 0 && prefill == 0 {
		n, prefill = dummyToken(p.ExpertParallel.DecodeTokenMs, p.ExpertParallel.PrefillTokenMs)
	}
	return msToDuration(p.collectiveMs(n, prefill, b.CrossNode))
}

// DecodeStepTime is the time of a decode-only step of batch sequences with
// contextTokens of context each, on one GPU without EP: the model's
// prediction of the median inter-token latency at that batch, which the
// calibration compares with the profile's Measured anchors.
func (p *Profile) DecodeStepTime(batch, contextTokens int) time.Duration {
	return p.StepTime(BatchShape{
		DecodeSeqs:          batch,
		DecodeContextTokens: int64(batch) * int64(contextTokens),
	})
}

// stepMs is StepTime in milliseconds.
func (p *Profile) stepMs(b BatchShape) float64 {
	n, prefill := shapeTokens(b)
	ep := p.expertParallel(b)
	if n == 0 && prefill == 0 {
		if !ep {
			return 0
		}
		n, prefill = dummyToken(p.Cost.DecodeSeqMs, p.Cost.PrefillTokenMs)
	}
	c := p.Cost
	ms := c.StepBaseMs +
		c.PrefillTokenMs*float64(prefill) +
		c.DecodeSeqMs*float64(n) +
		c.DecodeContextMsPer1K*float64(b.DecodeContextTokens)/1000 +
		c.PrefillPrefixMsPer1K*float64(b.PrefillContextProduct)/1000
	if p.Kind != KindMoE {
		return ms
	}
	tokens, ranks := n+prefill, 1
	if ep {
		tokens, ranks = max(tokens, b.EPTotalTokens), b.EPRanks
	}
	ms += c.ExpertMs * p.expectedExperts(tokens, ranks)
	if ep {
		ms += p.collectiveMs(n, prefill, b.CrossNode)
	}
	return ms
}

// dummyToken is the dummy batch's one token, as (decode, prefill) counts:
// of the kind whose cost per token is the lower.
func dummyToken(decodeMs, prefillMs float64) (n, prefill int) {
	if decodeMs < prefillMs {
		return 1, 0
	}
	return 0, 1
}

// expectedExperts is the expected number of distinct experts, of the
// NumExperts/ranks held by one rank, that tokens tokens routed
// independently and uniformly touch in one layer:
//
//	E_R(T) = (NumExperts/R)·(1 − ((NumExperts − ExpertsPerToken)/NumExperts)^T)
//
// since each expert escapes one token with probability
// (NumExperts−ExpertsPerToken)/NumExperts. For Qwen3-30B-A3B (128 experts,
// 8 active) E(T) is 8 at T=1, 52 at 8, 112 at 32 and ~126 from 64: a decode
// batch of 64 already streams almost every expert (docs/CALIBRATION.md).
func (p *Profile) expectedExperts(tokens, ranks int) float64 {
	experts := float64(p.MoE.NumExperts)
	miss := (experts - float64(p.MoE.ExpertsPerToken)) / experts
	return experts / float64(ranks) * (1 - math.Pow(miss, float64(tokens)))
}

// collectiveMs is CollectiveTime in milliseconds for n decode and prefill
// prefill tokens on the rank.
func (p *Profile) collectiveMs(n, prefill int, crossNode bool) float64 {
	e := p.ExpertParallel
	ms := e.BaseMs + e.DecodeTokenMs*float64(n) + e.PrefillTokenMs*float64(prefill)
	if crossNode {
		ms *= e.CrossNodeFactor
	}
	return ms
}

// expertParallel says whether b is a step of an expert-parallel group. A
// dense model has no experts to spread, so EP fields do not apply to it
// (vLLM likewise ignores --enable-expert-parallel for a dense model).
func (p *Profile) expertParallel(b BatchShape) bool {
	return p.Kind == KindMoE && b.EPRanks > 1
}

// shapeTokens returns b's decode sequences and prefill tokens after
// checking that no count is negative.
func shapeTokens(b BatchShape) (n, prefill int) {
	if b.PrefillTokens < 0 || b.PrefillContextProduct < 0 || b.DecodeSeqs < 0 ||
		b.DecodeContextTokens < 0 || b.EPRanks < 0 || b.EPTotalTokens < 0 {
		panic(fmt.Sprintf("sim: negative count in batch shape %+v", b))
	}
	return b.DecodeSeqs, b.PrefillTokens
}

// msToDuration converts a modelled time in milliseconds to a Duration,
// rounded to the nanosecond.
func msToDuration(ms float64) time.Duration {
	return time.Duration(math.Round(ms * float64(time.Millisecond)))
}
