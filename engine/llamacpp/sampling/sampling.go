// Package sampling draws tokens from rows of logits on the host, for the
// llama.cpp engine's worker, in vLLM V1's order: banned tokens and logit
// bias, then the penalties, then greedy, or temperature then min-p then
// top-k then top-p then a seeded draw.
//
// A row costs time linear in the vocabulary: one vectorized pass for
// greedy; two (the maximum, then every token's weight) for a draw; top-k
// and top-p find their candidates among the largest logits without
// sorting the vocabulary. Nothing is allocated per row. A draw is a
// function of the logits and the seed alone, the same bits on every
// x86-64, so that a request moved to another rank continues exactly.
//
// It links no library: its C is compiled with the package.
package sampling

/*
#cgo CFLAGS: -O3
#cgo LDFLAGS: -lm
#include "sample.h"
*/
import "C"

import (
	"sync"
	"unsafe"
)

// Params say how one token is drawn.
type Params struct {
	// Temperature of 0 or less is greedy: the first of the largest logits.
	Temperature float32
	// TopK keeps the k most likely tokens; 0 or less keeps all.
	TopK int32
	// TopP keeps the fewest most likely tokens whose probability reaches
	// it (at least one); 0, or 1 and more, keeps all.
	TopP float32
	// Seed makes the draw.
	Seed uint64
	// Banned tokens are never drawn (their logits are set to -inf).
	Banned []int32
	// LogitBias is added to its tokens' logits first.
	LogitBias []Bias
	// Presence, Frequency and Repetition are vLLM's penalties, over
	// History: a token of the output loses Frequency for each time it was
	// drawn and Presence once; a token of the prompt or the output has its
	// logit divided by Repetition when positive, multiplied when not. 0, 0
	// and 0 or 1 are off.
	Presence, Frequency, Repetition float32
	// History is what the penalties count; it must be set when one is on.
	History *History
	// MinP, after the temperature, leaves out the tokens less likely than
	// MinP times the most likely one; 0 is off.
	MinP float32
	// Logprobs asks for the drawn token's log-probability and the
	// TopLogprobs most likely tokens' (Sampler.Logprobs), which the worker
	// returns: a row that asks needs its logits on the host.
	Logprobs    bool
	TopLogprobs int
	// Constraint, when not nil, is the request's grammar: only a token it
	// allows is drawn.
	Constraint Constraint
}

// Constraint says which tokens may come next, for a grammar (structured
// output). The sampler asks about the token it drew first, and masks the
// row only when that token is not allowed: a draw of the unconstrained
// row, kept when allowed and otherwise drawn again from the masked row,
// is a draw from the masked row, and one token is far cheaper to check
// than the vocabulary.
type Constraint interface {
	// Allows reports whether token may come next.
	Allows(token int32) bool
	// Mask writes -inf over the logits of every token that may not come
	// next, and returns how many may.
	Mask(logits []float32) int
	// End is the token that ends the output when no token of the row may
	// come next (the grammar is done, but the request's bans leave only
	// tokens it forbids).
	End() int32
}

// WritesLogits reports whether Sample writes over the row: banned tokens,
// a bias, penalties or min-p.
func (p *Params) WritesLogits() bool {
	return len(p.Banned) > 0 || len(p.LogitBias) > 0 || p.Penalized() || (p.MinP > 0 && p.Temperature > 0) || p.Constraint != nil
}

// Bias is one token's logit bias.
type Bias struct {
	Token int32
	Value float32
}

// Penalized reports whether a penalty is on.
func (p *Params) Penalized() bool {
	return p.Presence != 0 || p.Frequency != 0 || (p.Repetition != 0 && p.Repetition != 1)
}

// NeedsLogits reports whether the row needs its logits on the host: all
// but a plain greedy row, which a device can take the argmax of.
func (p *Params) NeedsLogits() bool {
	return p.Temperature > 0 || len(p.Banned) > 0 || len(p.LogitBias) > 0 || p.Penalized() || p.Logprobs || p.Constraint != nil
}

// History is the tokens a sequence's penalties count: its prompt's, and
// its output's with how many times each was drawn.
//
// Concurrency: not safe for concurrent use; a row's draw is its sequence's.
type History struct {
	prompt map[int32]struct{}
	output map[int32]int32
}

// NewHistory returns the history of a request with prompt and the output
// drawn so far (wherever it was drawn).
func NewHistory(prompt, output []uint32) *History {
	h := &History{prompt: make(map[int32]struct{}, len(prompt)), output: make(map[int32]int32, len(output))}
	for _, t := range prompt {
		h.prompt[int32(t)] = struct{}{}
	}
	for _, t := range output {
		h.output[int32(t)]++
	}
	return h
}

// Add counts a token drawn.
func (h *History) Add(token int32) { h.output[token]++ }

// penalize applies p's penalties to the tokens of h, in vLLM's order:
// repetition, then frequency and presence. Each token is changed once,
// whatever the order of the maps.
func (h *History) penalize(logits []float32, p *Params) {
	if h == nil {
		return
	}
	n := int32(len(logits))
	if rep := p.Repetition; rep > 0 && rep != 1 {
		repeat := func(t int32) {
			if t < n {
				if l := logits[t]; l > 0 {
					logits[t] = l / rep
				} else {
					logits[t] = l * rep
				}
			}
		}
		for t := range h.prompt {
			repeat(t)
		}
		for t := range h.output {
			if _, inPrompt := h.prompt[t]; !inPrompt {
				repeat(t)
			}
		}
	}
	if p.Frequency != 0 || p.Presence != 0 {
		for t, c := range h.output {
			if t < n {
				logits[t] -= p.Frequency*float32(c) + p.Presence
			}
		}
	}
}

// Sampler holds the scratch of one row's draw. It is not safe for
// concurrent use; Rows gives each goroutine its own.
type Sampler struct {
	n       int
	scratch []float32
	keys    []uint64
	// kept is Keep's copy of a row; adjusted is a constrained draw's copy
	// of the row before it.
	kept, adjusted []float32
}

// Keep returns a copy of logits, valid until the next Keep: a row's raw
// logits, kept while Sample writes over the row.
func (s *Sampler) Keep(logits []float32) []float32 {
	s.kept = append(s.kept[:0], logits...)
	return s.kept
}

// NewSampler returns a sampler for rows of nVocab logits.
func NewSampler(nVocab int) *Sampler {
	return &Sampler{n: nVocab, scratch: make([]float32, C.dpn_scratch_floats(C.int32_t(nVocab))), keys: make([]uint64, 2*nVocab)}
}

// Sample draws a token from logits, which must hold the sampler's nVocab
// values; it writes over them: -inf over the banned ones, and the bias and
// penalties where they apply. With a constraint, the token is one it
// allows.
func (s *Sampler) Sample(logits []float32, p *Params) int32 {
	if len(logits) != s.n {
		panic("sampling: a row of the wrong vocabulary size")
	}
	// Sparse: the bias's tokens and the history's. Banned tokens stay
	// banned (-inf plus a bias is -inf); min-p is the C code's.
	for _, b := range p.LogitBias {
		if int(b.Token) < len(logits) {
			logits[b.Token] += b.Value
		}
	}
	if p.Penalized() {
		p.History.penalize(logits, p)
	}
	if p.Constraint == nil {
		return s.draw(logits, p, p.Seed, p.Banned)
	}
	s.adjusted = append(s.adjusted[:0], logits...)
	if tok := s.draw(logits, p, p.Seed, p.Banned); p.Constraint.Allows(tok) {
		return tok
	}
	// The second draw is independent of the first: its seed is another.
	seed := p.Seed ^ 0x9e3779b97f4a7c15
	copy(logits, s.adjusted)
	if p.Constraint.Mask(logits) > 0 {
		if tok := s.draw(logits, p, seed, p.Banned); p.Constraint.Allows(tok) {
			return tok
		}
		// Only banned tokens are allowed: the grammar is done, and the
		// request bans its end (min_tokens).
	}
	return p.Constraint.End()
}

// draw runs the C draw over a row whose bias and penalties are applied.
func (s *Sampler) draw(logits []float32, p *Params, seed uint64, bannedTokens []int32) int32 {
	var banned *C.int32_t
	if len(bannedTokens) > 0 {
		banned = (*C.int32_t)(unsafe.Pointer(&bannedTokens[0]))
	}
	return int32(C.dpn_sample((*C.float)(unsafe.Pointer(&logits[0])), C.int32_t(s.n), C.float(p.Temperature), C.int32_t(p.TopK),
		C.float(p.TopP), C.float(p.MinP), C.uint64_t(seed), banned, C.int32_t(len(bannedTokens)),
		(*C.float)(unsafe.Pointer(&s.scratch[0])), (*C.uint64_t)(unsafe.Pointer(&s.keys[0]))))
}

// GreedyFunc is the C function int32_t (*)(const float *logits, int32_t
// n) that draws a greedy row as Sample does (nothing banned, no bias, no
// penalties; it only reads the row): for C code that takes argmaxes
// elsewhere, such as inside llama.cpp's graph, and must choose as the
// host does.
func GreedyFunc() unsafe.Pointer { return unsafe.Pointer(C.dpn_greedy) }

// Logprobs returns the log-probability of every token of logits under
// the model's raw distribution, as a logit less the returned lse, and
// writes the k most likely tokens (at most len(top)) with their
// log-probabilities to top, returning how many it wrote. It reads logits
// only: call it before Sample, which writes over them.
func (s *Sampler) Logprobs(logits []float32, top []Logprob) (lse float32, n int) {
	if len(logits) != s.n {
		panic("sampling: a row of the wrong vocabulary size")
	}
	lse = float32(C.dpn_logsumexp((*C.float)(unsafe.Pointer(&logits[0])), C.int32_t(s.n)))
	if len(top) == 0 {
		return lse, 0
	}
	var ids [MaxTopLogprobs]int32
	var values [MaxTopLogprobs]float32
	k := min(len(top), MaxTopLogprobs)
	n = int(C.dpn_top((*C.float)(unsafe.Pointer(&logits[0])), C.int32_t(s.n), C.int32_t(k),
		(*C.int32_t)(unsafe.Pointer(&ids[0])), (*C.float)(unsafe.Pointer(&values[0])),
		(*C.float)(unsafe.Pointer(&s.scratch[0])), (*C.uint64_t)(unsafe.Pointer(&s.keys[0]))))
	for j := range n {
		top[j] = Logprob{Token: ids[j], Logprob: values[j] - lse}
	}
	return lse, n
}

// Rank is token's place among logits by value, from 1 for the largest: 1
// more than the tokens whose logits are larger.
func Rank(logits []float32, token int32) int {
	x, above := logits[token], 0
	for _, v := range logits {
		if v > x {
			above++
		}
	}
	return above + 1
}

// Logprob is a token's log-probability.
type Logprob struct {
	Token   int32
	Logprob float32
}

// MaxTopLogprobs is the most top tokens Logprobs finds, OpenAI's limit.
const MaxTopLogprobs = 20

// Pool samples the rows of a step on several goroutines.
type Pool struct {
	samplers []*Sampler
}

// NewPool returns a pool of threads samplers for rows of nVocab logits.
func NewPool(nVocab, threads int) *Pool {
	p := &Pool{}
	for range max(threads, 1) {
		p.samplers = append(p.samplers, NewSampler(nVocab))
	}
	return p
}

// Rows calls draw for each row in [0, n), spread over the pool's
// samplers: rows i, i+t, i+2t... on the i-th of t goroutines. draw must
// be safe to call concurrently for different rows.
func (p *Pool) Rows(n int, draw func(row int, s *Sampler)) {
	t := min(len(p.samplers), n)
	if t <= 1 {
		for row := range n {
			draw(row, p.samplers[0])
		}
		return
	}
	var wg sync.WaitGroup
	for g := 1; g < t; g++ {
		wg.Go(func() {
			for row := g; row < n; row += t {
				draw(row, p.samplers[g])
			}
		})
	}
	for row := 0; row < n; row += t {
		draw(row, p.samplers[0])
	}
	wg.Wait()
}
