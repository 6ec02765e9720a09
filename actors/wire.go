package actors

import (
	"github.com/dpnode/dpnode/engine"
	dpnodev1 "github.com/dpnode/dpnode/proto/dpnode/v1"
)

// The conversions between the engine's types and the wire's: the engine
// package knows nothing of protobuf; what crosses between actors (and
// nodes) is the wire's.

func samplingFromWire(s *dpnodev1.SamplingParams) engine.SamplingParams {
	if s == nil {
		return engine.SamplingParams{}
	}
	return engine.SamplingParams{
		MaxTokens:    int(s.MaxTokens),
		MinTokens:    int(s.MinTokens),
		Temperature:  s.Temperature,
		TopP:         s.TopP,
		TopK:         int(s.TopK),
		Seed:         s.Seed,
		IgnoreEOS:    s.IgnoreEos,
		StopTokenIDs: s.StopTokenIds,

		PresencePenalty:   s.PresencePenalty,
		FrequencyPenalty:  s.FrequencyPenalty,
		RepetitionPenalty: s.RepetitionPenalty,
		MinP:              s.MinP,
		LogitBias:         s.LogitBias,
		Logprobs:          s.Logprobs,
		TopLogprobs:       int(s.TopLogprobs),
		PromptLogprobs:    s.PromptLogprobs,
		PromptRanks:       s.PromptRanks,
		Grammar:           s.Grammar,
	}
}

func samplingToWire(s engine.SamplingParams) *dpnodev1.SamplingParams {
	return &dpnodev1.SamplingParams{
		MaxTokens:    uint32(s.MaxTokens),
		MinTokens:    uint32(s.MinTokens),
		Temperature:  s.Temperature,
		TopP:         s.TopP,
		TopK:         int32(s.TopK),
		Seed:         s.Seed,
		IgnoreEos:    s.IgnoreEOS,
		StopTokenIds: s.StopTokenIDs,

		PresencePenalty:   s.PresencePenalty,
		FrequencyPenalty:  s.FrequencyPenalty,
		RepetitionPenalty: s.RepetitionPenalty,
		MinP:              s.MinP,
		LogitBias:         s.LogitBias,
		Logprobs:          s.Logprobs,
		TopLogprobs:       int32(s.TopLogprobs),
		PromptLogprobs:    s.PromptLogprobs,
		PromptRanks:       s.PromptRanks,
		Grammar:           s.Grammar,
	}
}

// finishToWire and finishFromWire convert a finish reason; the engine's
// values are the wire's.
func finishToWire(f engine.FinishReason) dpnodev1.FinishReason { return dpnodev1.FinishReason(f) }

func finishFromWire(f dpnodev1.FinishReason) engine.FinishReason { return engine.FinishReason(f) }

// logprobsToWire and logprobsFromWire convert tokens' log-probabilities;
// nil stays nil.
func logprobsToWire(lps []*engine.TokenLogprobs) []*dpnodev1.TokenLogprobs {
	return mapPtrs(lps, func(lp *engine.TokenLogprobs) *dpnodev1.TokenLogprobs {
		return &dpnodev1.TokenLogprobs{Logprob: lp.Logprob, TopTokenIds: lp.TopTokenIds, TopLogprobs: lp.TopLogprobs, Rank: lp.Rank}
	})
}

func logprobsFromWire(lps []*dpnodev1.TokenLogprobs) []*engine.TokenLogprobs {
	return mapPtrs(lps, func(lp *dpnodev1.TokenLogprobs) *engine.TokenLogprobs {
		return &engine.TokenLogprobs{Logprob: lp.Logprob, TopTokenIds: lp.TopTokenIds, TopLogprobs: lp.TopLogprobs, Rank: lp.Rank}
	})
}

// mapPtrs converts each element of xs with f; a nil slice, and nil
// elements, stay nil.
func mapPtrs[A, B any](xs []*A, f func(*A) *B) []*B {
	if xs == nil {
		return nil
	}
	out := make([]*B, len(xs))
	for i, x := range xs {
		if x != nil {
			out[i] = f(x)
		}
	}
	return out
}
