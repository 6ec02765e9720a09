package sampling

import (
	"math"
	"slices"
)

// Reference applies p's bans, logit bias, penalties and min-p to logits
// as vLLM V1 states them, densely and in float64 where it can: each
// token's count found by scanning the output, the min-p cut on
// probabilities. It returns new logits, from which Sample with p's
// temperature, top-k, top-p and seed alone draws what Sample with all of
// p draws from logits: the statement the tests hold the sampler to, on
// random rows and on llama.cpp's own. It is slow (a scan of the output per
// token) and only for tests.
func Reference(logits []float32, p Params, prompt, output []int32) []float32 {
	l := slices.Clone(logits)
	for _, b := range p.Banned {
		l[b] = float32(math.Inf(-1))
	}
	for _, b := range p.LogitBias {
		l[b.Token] += b.Value
	}
	for t := range l {
		count := 0
		for _, o := range output {
			if int(o) == t {
				count++
			}
		}
		if p.Repetition > 0 && p.Repetition != 1 && (count > 0 || slices.Contains(prompt, int32(t))) {
			if l[t] > 0 {
				l[t] /= p.Repetition
			} else {
				l[t] *= p.Repetition
			}
		}
		if count > 0 {
			l[t] -= p.Frequency*float32(count) + p.Presence
		}
	}
	if p.MinP > 0 && p.Temperature > 0 {
		top := math.Inf(-1)
		for _, x := range l {
			top = math.Max(top, float64(x))
		}
		for t, x := range l {
			// p(t) / p(top) < min_p
			if math.Exp((float64(x)-top)/float64(p.Temperature)) < float64(p.MinP) {
				l[t] = float32(math.Inf(-1))
			}
		}
	}
	return l
}
