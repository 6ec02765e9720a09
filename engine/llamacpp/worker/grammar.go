//go:build llamacpp

package worker

/*
#include <stdlib.h>
#include <math.h>
#include "llama.h"

static struct llama_sampler * dpn_grammar(const struct llama_vocab * v, const char * g) {
	return llama_sampler_init_grammar(v, g, "root");
}

// dpn_grammar_allows reports whether the grammar allows token t next.
static int dpn_grammar_allows(struct llama_sampler * s, int32_t t) {
	llama_token_data d = { t, 0.0f, 0.0f };
	llama_token_data_array a = { &d, 1, -1, false };
	llama_sampler_apply(s, &a);
	return d.logit != -INFINITY;
}

// dpn_grammar_mask writes -inf over the logits of the tokens the grammar
// does not allow next, and returns how many it allows. Tokens already at
// -inf are not asked about. scratch holds n token data.
static int32_t dpn_grammar_mask(struct llama_sampler * s, float * logits, int32_t n, llama_token_data * scratch) {
	size_t m = 0;
	for (int32_t i = 0; i < n; i++) {
		if (logits[i] != -INFINITY) {
			scratch[m].id = i;
			scratch[m].logit = logits[i];
			scratch[m].p = 0.0f;
			m++;
		}
	}
	llama_token_data_array a = { scratch, m, -1, false };
	llama_sampler_apply(s, &a);
	for (int32_t i = 0; i < n; i++) {
		logits[i] = -INFINITY;
	}
	int32_t allowed = 0;
	for (size_t j = 0; j < m; j++) {
		if (scratch[j].logit != -INFINITY) {
			logits[scratch[j].id] = scratch[j].logit;
			allowed++;
		}
	}
	return allowed;
}
*/
import "C"

import (
	"fmt"
	"unsafe"

	"github.com/dpnode/dpnode/engine/llamacpp/sampling"
)

// grammar is one sequence's grammar state (llama.cpp's grammar sampler),
// for structured output: the tokens it allows next. It implements
// sampling.Constraint.
//
// Concurrency: a row's draw is its sequence's, so one goroutine uses a
// grammar at a time; grammars of different sequences run concurrently
// (llama.cpp's grammar reads the vocabulary only).
type grammar struct {
	s *C.struct_llama_sampler
	// end is the model's first end-of-generation token.
	end     int32
	scratch []C.llama_token_data
}

var _ sampling.Constraint = (*grammar)(nil)

// newGrammar parses gbnf (its start rule is root) for m's vocabulary, and
// replays output, the tokens the request already drew under it. A token
// the grammar does not allow is an error, never llama.cpp's abort.
func newGrammar(m *model, gbnf string, output []uint32, end int32) (*grammar, error) {
	cg := C.CString(gbnf)
	defer C.free(unsafe.Pointer(cg))
	s := C.dpn_grammar(m.vocab, cg)
	if s == nil {
		return nil, withLastError("llama.cpp could not parse the grammar")
	}
	g := &grammar{s: s, end: end}
	for i, t := range output {
		if !g.Allows(int32(t)) {
			g.free()
			return nil, fmt.Errorf("output token %d (%d of %d) is not allowed by the request's grammar", t, i, len(output))
		}
		g.accept(int32(t))
	}
	return g, nil
}

// Allows reports whether token may come next.
func (g *grammar) Allows(token int32) bool { return C.dpn_grammar_allows(g.s, C.int32_t(token)) != 0 }

// Mask writes -inf over the tokens that may not come next.
func (g *grammar) Mask(logits []float32) int {
	if len(g.scratch) < len(logits) {
		g.scratch = make([]C.llama_token_data, len(logits))
	}
	return int(C.dpn_grammar_mask(g.s, (*C.float)(unsafe.Pointer(&logits[0])), C.int32_t(len(logits)), &g.scratch[0]))
}

// End is the model's end-of-generation token.
func (g *grammar) End() int32 { return g.end }

// accept advances the grammar over token, which Allows must have allowed:
// llama.cpp aborts the process on any other.
func (g *grammar) accept(token int32) { C.llama_sampler_accept(g.s, C.llama_token(token)) }

func (g *grammar) free() {
	if g != nil && g.s != nil {
		C.llama_sampler_free(g.s)
		g.s = nil
	}
}

// checkGrammar reports whether llama.cpp parses gbnf for m's vocabulary:
// the vocabulary worker's check before a request is admitted.
func checkGrammar(m *model, gbnf string) error {
	g, err := newGrammar(m, gbnf, nil, 0)
	if err != nil {
		return err
	}
	g.free()
	return nil
}
