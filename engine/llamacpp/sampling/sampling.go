// Package sampling draws tokens from rows of logits on the host, for the
// llama.cpp engine's worker: greedy, or temperature then top-k then top-p
// then a seeded draw, as vLLM orders them.
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
}

// Sampler holds the scratch of one row's draw. It is not safe for
// concurrent use; Rows gives each goroutine its own.
type Sampler struct {
	n       int
	scratch []float32
	keys    []uint64
}

// NewSampler returns a sampler for rows of nVocab logits.
func NewSampler(nVocab int) *Sampler {
	return &Sampler{n: nVocab, scratch: make([]float32, C.dpn_scratch_floats(C.int32_t(nVocab))), keys: make([]uint64, 2*nVocab)}
}

// Sample draws a token from logits, which must hold the sampler's nVocab
// values; it writes -inf over the banned ones.
func (s *Sampler) Sample(logits []float32, p *Params) int32 {
	if len(logits) != s.n {
		panic("sampling: a row of the wrong vocabulary size")
	}
	var banned *C.int32_t
	if len(p.Banned) > 0 {
		banned = (*C.int32_t)(unsafe.Pointer(&p.Banned[0]))
	}
	return int32(C.dpn_sample((*C.float)(unsafe.Pointer(&logits[0])), C.int32_t(s.n), C.float(p.Temperature), C.int32_t(p.TopK),
		C.float(p.TopP), C.uint64_t(p.Seed), banned, C.int32_t(len(p.Banned)),
		(*C.float)(unsafe.Pointer(&s.scratch[0])), (*C.uint64_t)(unsafe.Pointer(&s.keys[0]))))
}

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
