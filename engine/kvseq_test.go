package engine

import (
	"fmt"
	"slices"
	"testing"
)

// cellModel is a deliberately simple model of llama.cpp's KV cache: cells
// that each hold one position of KV and belong to a set of sequences. It
// carries out a step's SeqOps and tokens as llama.cpp would, and checks
// what llama.cpp checks (positions continue the sequence, cells suffice)
// and what only a real model would show: that a sequence's cells hold the
// KV of exactly its request's tokens. A cell's KV is modelled by a hash
// chained over every token up to its position.
type cellModel struct {
	capacity int
	cells    map[int]*modelCell
	nextID   int
	// last is the token each sequence last sampled.
	last map[int32]uint32
	// computed counts the tokens decoded, as a worker counts them.
	computed int
}

type modelCell struct {
	pos  int32
	kv   uint64
	seqs map[int32]bool
}

func newCellModel(capacity int) *cellModel {
	return &cellModel{capacity: capacity, cells: map[int]*modelCell{}, last: map[int32]uint32{}}
}

func chainKV(prev uint64, tok uint32) uint64 {
	x := (prev ^ uint64(tok)) * 0x9E3779B97F4A7C15
	return x ^ x>>31
}

// seqCells returns seq's cells by position.
func (m *cellModel) seqCells(seq int32) map[int32]*modelCell {
	out := map[int32]*modelCell{}
	for _, c := range m.cells {
		if c.seqs[seq] {
			out[c.pos] = c
		}
	}
	return out
}

func (m *cellModel) apply(t tester, op SeqOp) {
	t.Helper()
	p1 := op.P1
	if p1 < 0 {
		p1 = 1 << 30
	}
	switch op.Kind {
	case SeqCopy:
		dst := m.seqCells(op.Dst)
		for _, c := range m.cells {
			if c.seqs[op.Src] && c.pos >= op.P0 && c.pos < p1 {
				if dst[c.pos] != nil {
					t.Fatalf("copy %+v: sequence %d already has position %d", op, op.Dst, c.pos)
				}
				c.seqs[op.Dst] = true
			}
		}
	case SeqRemove:
		for id, c := range m.cells {
			if c.pos >= op.P0 && c.pos < p1 {
				delete(c.seqs, op.Dst)
				if len(c.seqs) == 0 {
					delete(m.cells, id)
				}
			}
		}
	default:
		t.Fatalf("unknown op %+v", op)
	}
}

// step carries out a batch for requests whose full tokens (prompt, then
// output so far) tokensOf gives, and samples with testToken. Before and
// after computing, it checks that the cells in use fit in the blocks that
// are held or cached.
func (m *cellModel) step(t tester, s *Scheduler, b *Batch, tokensOf func(id string) []uint32) StepResult {
	t.Helper()
	for _, op := range b.SeqOps {
		m.apply(t, op)
	}
	m.checkFits(t, s)
	defer m.checkFits(t, s)
	res := StepResult{Tokens: make([]uint32, len(b.Requests))}
	for i, r := range b.Requests {
		all := tokensOf(r.ID)
		cells := m.seqCells(r.Seq)
		if len(cells) != r.NumComputed {
			t.Fatalf("step %d: %s in sequence %d has %d cells, but %d tokens are computed", b.Step, r.ID, r.Seq, len(cells), r.NumComputed)
		}
		var kv uint64
		for p := 0; p < r.NumComputed; p++ {
			kv = chainKV(kv, all[p])
			c := cells[int32(p)]
			if c == nil || c.kv != kv {
				t.Fatalf("step %d: %s in sequence %d: the KV at position %d is not that of its tokens", b.Step, r.ID, r.Seq, p)
			}
		}
		toks := r.Tokens
		if toks == nil {
			last, ok := m.last[r.Seq]
			if !ok || r.NumNewTokens != 1 {
				t.Fatalf("step %d: %s sends no tokens, but sequence %d sampled none to continue from", b.Step, r.ID, r.Seq)
			}
			toks = []uint32{last}
		}
		if len(toks) != r.NumNewTokens || !slices.Equal(toks, all[r.NumComputed:r.NumComputed+r.NumNewTokens]) {
			t.Fatalf("step %d: %s computes tokens %v, want %v", b.Step, r.ID, toks, all[r.NumComputed:r.NumComputed+r.NumNewTokens])
		}
		if len(m.cells)+len(toks) > m.capacity {
			t.Fatalf("step %d: %d cells in use and %d more needed, capacity %d", b.Step, len(m.cells), len(toks), m.capacity)
		}
		for j, tok := range toks {
			kv = chainKV(kv, tok)
			m.nextID++
			m.cells[m.nextID] = &modelCell{pos: int32(r.NumComputed + j), kv: kv, seqs: map[int32]bool{r.Seq: true}}
		}
		m.computed += len(toks)
		if r.SampleIndex >= 0 {
			res.Tokens[i] = testToken(r.PromptHash, r.SampleIndex)
			m.last[r.Seq] = res.Tokens[i]
		}
	}
	return res
}

// checkSeqInvariants checks the sequence table against the blocks.
func checkSeqInvariants(t tester, s *Scheduler) {
	t.Helper()
	tab := s.kv.seqs
	homed := make([]int32, len(tab.live))
	cachedOnly := 0
	for id := range s.kv.blocks {
		b := &s.kv.blocks[id]
		if b.home != noSeq {
			homed[b.home]++
		}
		if b.refCount == 0 && b.home != noSeq {
			cachedOnly++
			if !s.kv.findable(int32(id)) {
				t.Fatalf("free block %d keeps its KV in sequence %d but cannot be found", id, b.home)
			}
		}
	}
	if cachedOnly != tab.cachedOnly {
		t.Fatalf("%d blocks are cached only, count says %d", cachedOnly, tab.cachedOnly)
	}
	live := 0
	for seq := range tab.live {
		if homed[seq] != tab.homed[seq] {
			t.Fatalf("sequence %d homes %d blocks, count says %d", seq, homed[seq], tab.homed[seq])
		}
		if tab.live[seq] {
			live++
		}
	}
	if live != len(s.running) {
		t.Fatalf("%d live sequences for %d running requests", live, len(s.running))
	}
	for _, r := range s.running {
		if r.seq == noSeq || !tab.live[r.seq] {
			t.Fatalf("running %s has no live sequence", r.id)
		}
	}
	for _, seq := range tab.free {
		if tab.live[seq] || tab.homed[seq] != 0 {
			t.Fatalf("free sequence %d is live or homes blocks", seq)
		}
	}
}

// checkFits checks that the cells in use fit in the blocks held or cached,
// once the step's moves are made.
func (m *cellModel) checkFits(t tester, s *Scheduler) {
	t.Helper()
	cached := 0
	for id := range s.kv.blocks {
		if b := &s.kv.blocks[id]; b.refCount == 0 && b.home != noSeq {
			cached++
		}
	}
	held := s.kv.numBlocks() - s.kv.numFree
	if len(m.cells) > (held+cached)*s.cfg.BlockSize {
		t.Fatalf("%d cells in use, more than the %d held and %d cached blocks hold", len(m.cells), held, cached)
	}
}

// serveWithCells serves one request alone to its end with the cell model
// as executor, adding its tokens to out.
func serveWithCells(t *testing.T, s *Scheduler, m *cellModel, id string, p []uint32, maxTokens int, out map[string][]uint32) {
	t.Helper()
	if err := s.Add(NewRequest{ID: id, Prompt: p, Sampling: SamplingParams{MaxTokens: maxTokens, IgnoreEOS: true}}); err != nil {
		t.Fatal(err)
	}
	tokensOf := func(string) []uint32 { return slices.Concat(p, out[id]) }
	for s.HasWork() {
		b := s.Schedule()
		for _, o := range s.Update(b, m.step(t, s, b, tokensOf)) {
			out[o.ID] = append(out[o.ID], o.NewTokens...)
		}
		checkSeqInvariants(t, s)
	}
}

// TestPrefixHitComputesOnlyTheRest checks with the cell model that a
// second request sharing a long prefix with a finished one computes only
// its own tokens: the prefix's KV is shared, not recomputed.
func TestPrefixHitComputesOnlyTheRest(t *testing.T) {
	cfg := testConfig()
	cfg.SequenceSlots = cfg.MaxNumSeqs
	s := newTestScheduler(t, cfg)
	m := newCellModel(cfg.NumBlocks * cfg.BlockSize)
	shared := prompt(1, 40)
	prompts := map[string][]uint32{"a": slices.Concat(shared, []uint32{7, 8, 9}), "b": slices.Concat(shared, []uint32{5, 6})}
	out := map[string][]uint32{}
	serveWithCells(t, s, m, "a", prompts["a"], 3, out)
	before := m.computed
	serveWithCells(t, s, m, "b", prompts["b"], 3, out)
	// b's prompt is 42 tokens; the 40 shared ones are 10 full blocks.
	if got, want := m.computed-before, 42-40+2; got != want {
		t.Fatalf("the second request computed %d tokens, want %d (its 2 own prompt tokens and 2 decodes)", got, want)
	}
	if st := s.Stats(); st.PrefixHits != 40 {
		t.Fatalf("prefix hits %d, want 40", st.PrefixHits)
	}
}

// TestKeptSequencesAreEvictedForNewRequests fills every sequence id with
// finished requests' cached prefixes, then admits more: the least recently
// read kept sequence gives up its id, and its blocks leave the cache.
func TestKeptSequencesAreEvictedForNewRequests(t *testing.T) {
	cfg := testConfig()
	cfg.MaxNumSeqs, cfg.SequenceSlots = 2, 3
	s := newTestScheduler(t, cfg)
	m := newCellModel(cfg.NumBlocks * cfg.BlockSize)
	out := map[string][]uint32{}
	for i := range 6 {
		serveWithCells(t, s, m, fmt.Sprint("r", i), prompt(i, 12), 2, out)
	}
	kept := 0
	for seq := range s.kv.seqs.live {
		if s.kv.seqs.homed[seq] > 0 {
			kept++
		}
	}
	if kept != 3 {
		t.Fatalf("%d sequences keep cached blocks, want all 3", kept)
	}
	// The first prompts' blocks went with their sequences.
	if prefix := s.kv.computedPrefix(&Request{prompt: prompt(0, 12), seq: noSeq}); len(prefix) != 0 {
		t.Fatalf("r0's prefix still found (%d blocks) after its sequence was evicted", len(prefix))
	}
	if prefix := s.kv.computedPrefix(&Request{prompt: prompt(5, 12), seq: noSeq}); len(prefix) != 2 {
		t.Fatalf("r5's prefix: %d blocks found, want 2", len(prefix))
	}
}

// TestCachedOnlyCellsAreBounded: in a shared cache every step pays for the
// cells the prefix cache keeps, so they are kept to no more than the
// requests hold, or a step's budget.
func TestCachedOnlyCellsAreBounded(t *testing.T) {
	cfg := testConfig()
	cfg.MaxNumSeqs, cfg.SequenceSlots, cfg.MaxNumBatchedTokens = 2, 8, 16
	s := newTestScheduler(t, cfg)
	m := newCellModel(cfg.NumBlocks * cfg.BlockSize)
	out := map[string][]uint32{}
	for i := range 6 {
		// Each leaves 3 blocks (12 tokens) in the prefix cache alone.
		serveWithCells(t, s, m, fmt.Sprint("r", i), prompt(i, 12), 2, out)
	}
	if err := s.Add(NewRequest{ID: "next", Prompt: prompt(9, 3), Sampling: SamplingParams{MaxTokens: 1, IgnoreEOS: true}}); err != nil {
		t.Fatal(err)
	}
	b := s.Schedule()
	held := s.kv.numBlocks() - s.kv.numFree
	if got, limit := s.kv.seqs.cachedOnly*cfg.BlockSize, max(held*cfg.BlockSize, keptCacheSteps*cfg.MaxNumBatchedTokens); got > limit || got == 0 {
		t.Fatalf("%d tokens of KV kept for the prefix cache alone; want some, at most %d", got, limit)
	}
	// The most recent prompt is still found; the oldest went.
	if prefix := s.kv.computedPrefix(&Request{prompt: prompt(5, 12), seq: noSeq}); len(prefix) != 2 {
		t.Fatalf("the last prompt's prefix: %d blocks found, want 2", len(prefix))
	}
	if prefix := s.kv.computedPrefix(&Request{prompt: prompt(0, 12), seq: noSeq}); len(prefix) != 0 {
		t.Fatalf("the first prompt's prefix is still cached (%d blocks)", len(prefix))
	}
	s.Update(b, m.step(t, s, b, func(string) []uint32 { return prompt(9, 3) }))
	checkSeqInvariants(t, s)
}
