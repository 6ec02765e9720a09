package engine

import (
	"fmt"
	"slices"
	"testing"
)

// streamModel is a deliberately simple model of llama.cpp's KV cache with
// a stream per sequence: a stream holds the KV of positions 0, 1, ... of
// its sequence, up to its capacity. It carries out a step's SeqOps and
// tokens as llama.cpp would and checks what llama.cpp checks (a copy is
// of a whole stream; positions continue the sequence; the stream has
// room), and what only a real model would show: that a sequence's cells
// hold the KV of exactly its request's tokens. A cell's KV is modelled by
// a hash chained over every token up to its position.
type streamModel struct {
	cells   int
	streams [][]uint64
	// last is the token each sequence last sampled.
	last map[int32]uint32
	// computed counts the tokens decoded, as a worker counts them;
	// copies counts whole-stream copies.
	computed, copies int
}

func newStreamModel(streams, cells int) *streamModel {
	return &streamModel{cells: cells, streams: make([][]uint64, streams), last: map[int32]uint32{}}
}

func chainKV(prev uint64, tok uint32) uint64 {
	x := (prev ^ uint64(tok)) * 0x9E3779B97F4A7C15
	return x ^ x>>31
}

func (m *streamModel) apply(t tester, op SeqOp) {
	t.Helper()
	switch op.Kind {
	case SeqCopy:
		if op.P0 > 0 || op.P1 > 0 || op.Src == op.Dst {
			t.Fatalf("copy %+v: llama.cpp copies only whole streams, to another stream", op)
		}
		m.streams[op.Dst] = slices.Clone(m.streams[op.Src])
		delete(m.last, op.Dst)
		m.copies++
	case SeqRemove:
		st := m.streams[op.Dst]
		if op.P1 >= 0 && int(op.P1) < len(st) {
			t.Fatalf("remove %+v: a hole in the middle of stream %d (%d positions)", op, op.Dst, len(st))
		}
		m.streams[op.Dst] = st[:min(len(st), int(op.P0))]
		if op.P0 == 0 {
			delete(m.last, op.Dst)
		}
	default:
		t.Fatalf("unknown op %+v", op)
	}
}

// step carries out a batch for requests whose full tokens (prompt, then
// output so far) tokensOf gives, and samples with testToken.
func (m *streamModel) step(t tester, b *Batch, tokensOf func(id string) []uint32) StepResult {
	t.Helper()
	for _, op := range b.SeqOps {
		m.apply(t, op)
	}
	res := StepResult{Tokens: make([]uint32, len(b.Requests))}
	seen := map[int32]bool{}
	for i, r := range b.Requests {
		if seen[r.Seq] {
			t.Fatalf("step %d: stream %d twice in one step", b.Step, r.Seq)
		}
		seen[r.Seq] = true
		all := tokensOf(r.ID)
		st := m.streams[r.Seq]
		if len(st) != r.NumComputed {
			t.Fatalf("step %d: %s in stream %d: %d positions hold KV, but %d tokens are computed", b.Step, r.ID, r.Seq, len(st), r.NumComputed)
		}
		var kv uint64
		for p := 0; p < r.NumComputed; p++ {
			kv = chainKV(kv, all[p])
			if st[p] != kv {
				t.Fatalf("step %d: %s in stream %d: the KV at position %d is not that of its tokens", b.Step, r.ID, r.Seq, p)
			}
		}
		toks := r.Tokens
		if toks == nil {
			last, ok := m.last[r.Seq]
			if !ok || r.NumNewTokens != 1 {
				t.Fatalf("step %d: %s sends no tokens, but stream %d sampled none to continue from", b.Step, r.ID, r.Seq)
			}
			toks = []uint32{last}
		}
		if len(toks) != r.NumNewTokens || !slices.Equal(toks, all[r.NumComputed:r.NumComputed+r.NumNewTokens]) {
			t.Fatalf("step %d: %s computes tokens %v, want %v", b.Step, r.ID, toks, all[r.NumComputed:r.NumComputed+r.NumNewTokens])
		}
		if len(st)+len(toks) > m.cells {
			t.Fatalf("step %d: stream %d holds %d and needs %d more, capacity %d", b.Step, r.Seq, len(st), len(toks), m.cells)
		}
		for _, tok := range toks {
			kv = chainKV(kv, tok)
			st = append(st, kv)
		}
		m.streams[r.Seq] = st
		m.computed += len(toks)
		if r.SampleIndex >= 0 {
			res.Tokens[i] = testToken(r.PromptHash, r.SampleIndex)
			m.last[r.Seq] = res.Tokens[i]
		}
	}
	return res
}

// checkStreamInvariants checks the streams against the running requests
// and the prefix index against the streams.
func checkStreamInvariants(t tester, s *Scheduler, kv *streamKV) {
	t.Helper()
	owners := 0
	for i := range kv.streams {
		st := &kv.streams[i]
		if st.req != nil {
			owners++
			if st.req.seq != int32(i) || st.req.gone {
				t.Fatalf("stream %d holds %s, which is gone or holds stream %d", i, st.req.id, st.req.seq)
			}
		}
		if len(st.blocks)*kv.blockSize > st.used {
			t.Fatalf("stream %d: %d full blocks in %d positions", i, len(st.blocks), st.used)
		}
		if st.req == nil && len(st.blocks) == 0 && st.used != 0 {
			t.Fatalf("free stream %d holds %d positions", i, st.used)
		}
		if i < kv.running && len(kv.streams) > kv.running && st.req == nil && (st.used != 0 || len(st.blocks) != 0) {
			t.Fatalf("running stream %d holds %d positions and %d blocks without a request", i, st.used, len(st.blocks))
		}
		if i >= kv.running && st.req != nil {
			t.Fatalf("kept stream %d (of %d running) runs %s", i, kv.running, st.req.id)
		}
	}
	if owners != len(s.running) {
		t.Fatalf("%d streams hold requests, %d run", owners, len(s.running))
	}
	for _, r := range s.running {
		if r.seq == noSeq || kv.streams[r.seq].req != r {
			t.Fatalf("running %s does not hold its stream %d", r.id, r.seq)
		}
	}
	for key, st := range kv.byHash {
		if !slices.ContainsFunc(kv.streams[st].blocks, func(h BlockHash) bool { return h.Key() == key }) {
			t.Fatalf("the prefix index finds a block in stream %d, which does not hold it", st)
		}
	}
}

// copiesMade counts the stream copies m made and those kv has yet to send
// (a request's release is carried out with the next step).
func copiesMade(m *streamModel, kv *streamKV) int {
	n := m.copies
	for _, op := range kv.ops {
		if op.Kind == SeqCopy {
			n++
		}
	}
	return n
}

func streamConfig(streams, maxSeqs int) SchedulerConfig {
	cfg := testConfig()
	cfg.MaxNumSeqs, cfg.SequenceSlots, cfg.StreamCells = maxSeqs, streams, cfg.MaxModelLen
	cfg.NumBlocks = streams * cfg.StreamCells / cfg.BlockSize
	return cfg
}

// serveWithStreams serves one request alone to its end with the stream
// model as executor, adding its tokens to out.
func serveWithStreams(t *testing.T, s *Scheduler, m *streamModel, id string, p []uint32, maxTokens int, out map[string][]uint32) {
	t.Helper()
	if err := s.Add(NewRequest{ID: id, Prompt: p, Sampling: SamplingParams{MaxTokens: maxTokens, IgnoreEOS: true}}); err != nil {
		t.Fatal(err)
	}
	tokensOf := func(string) []uint32 { return slices.Concat(p, out[id]) }
	for s.HasWork() {
		b := s.Schedule()
		for _, o := range s.Update(b, m.step(t, b, tokensOf)) {
			out[o.ID] = append(out[o.ID], o.NewTokens...)
		}
		checkKVInvariants(t, s)
	}
}

// TestPrefixHitComputesOnlyTheRest checks with the stream model that a
// second request sharing a long prefix with a finished one computes only
// its own tokens: the prefix's KV is reused, not recomputed.
func TestPrefixHitComputesOnlyTheRest(t *testing.T) {
	cfg := streamConfig(8, 4)
	s := newTestScheduler(t, cfg)
	m := newStreamModel(cfg.SequenceSlots, cfg.StreamCells)
	shared := prompt(1, 40)
	prompts := map[string][]uint32{"a": slices.Concat(shared, []uint32{7, 8, 9}), "b": slices.Concat(shared, []uint32{5, 6})}
	out := map[string][]uint32{}
	serveWithStreams(t, s, m, "a", prompts["a"], 3, out)
	before := m.computed
	serveWithStreams(t, s, m, "b", prompts["b"], 3, out)
	// b's prompt is 42 tokens; the 40 shared ones are 10 full blocks.
	if got, want := m.computed-before, 42-40+2; got != want {
		t.Fatalf("the second request computed %d tokens, want %d (its 2 own prompt tokens and 2 decodes)", got, want)
	}
	if st := s.Stats(); st.PrefixHits != 40 {
		t.Fatalf("prefix hits %d, want 40", st.PrefixHits)
	}
	// a's stream went to the kept region, b's came from there, and b's
	// went there too: b's last block is not a's, so a's stays.
	kv := s.kv.(*streamKV)
	if n := copiesMade(m, kv); n != 3 {
		t.Fatalf("%d stream copies, want 3", n)
	}
	for _, p := range prompts {
		if _, n := kv.lookup(&Request{prompt: slices.Concat(p, []uint32{1}), seq: noSeq}); n != 10 {
			t.Fatalf("a finished prompt's prefix: %d blocks found, want 10", n)
		}
	}
}

// TestConversationReplacesItsKeptTurn: a request that continues a finished
// one (its prompt is the first's prompt and output, and more) gets the
// first's KV from its kept stream, and when it finishes its own KV
// replaces the first's there: the cache keeps the conversation once.
func TestConversationReplacesItsKeptTurn(t *testing.T) {
	cfg := streamConfig(4, 2)
	s := newTestScheduler(t, cfg)
	m := newStreamModel(cfg.SequenceSlots, cfg.StreamCells)
	out := map[string][]uint32{}
	first := prompt(3, 21)
	serveWithStreams(t, s, m, "turn1", first, 12, out)
	kv := s.kv.(*streamKV)
	seq := slices.IndexFunc(kv.streams, func(st kvStream) bool { return len(st.blocks) > 0 })
	if seq < kv.running {
		t.Fatalf("turn1's KV is kept in stream %d, one of the %d running streams", seq, kv.running)
	}
	before := m.computed
	second := slices.Concat(first, out["turn1"], prompt(4, 6))
	serveWithStreams(t, s, m, "turn2", second, 2, out)
	// 21 + 12 tokens, of which the last sampled was never computed: 32
	// computed, 8 full blocks.
	if got, want := m.computed-before, len(second)-32+1; got != want {
		t.Fatalf("the second turn computed %d tokens, want %d", got, want)
	}
	// 21 + 12 + 6 + 1 computed: 10 blocks.
	for i := range kv.streams {
		if n := len(kv.streams[i].blocks); i == seq && n != 10 || i != seq && n != 0 {
			t.Fatalf("stream %d holds %d blocks after the second turn; want the conversation's 10 in stream %d only", i, n, seq)
		}
	}
}

// TestPrefixHitCopiesARunningStream: a request arriving while another with
// the same prefix runs gets the prefix from the running stream, by a copy
// when the hit is at least 1/copyRatio of what that stream holds, and
// computes it again otherwise.
func TestPrefixHitCopiesARunningStream(t *testing.T) {
	for _, ratio := range []int{1, 2} {
		t.Run(fmt.Sprint("copyRatio=", ratio), func(t *testing.T) { testPrefixHitCopiesARunningStream(t, ratio) })
	}
}

func testPrefixHitCopiesARunningStream(t *testing.T, ratio int) {
	cfg := streamConfig(4, 4)
	s := newTestScheduler(t, cfg)
	s.kv.(*streamKV).copyRatio = ratio
	m := newStreamModel(cfg.SequenceSlots, cfg.StreamCells)
	shared := prompt(5, 32)
	prompts := map[string][]uint32{"a": slices.Concat(shared, []uint32{1}), "b": slices.Concat(shared, []uint32{2, 3})}
	out := map[string][]uint32{}
	tokensOf := func(id string) []uint32 { return slices.Concat(prompts[id], out[id]) }
	step := func() {
		b := s.Schedule()
		for _, o := range s.Update(b, m.step(t, b, tokensOf)) {
			out[o.ID] = append(out[o.ID], o.NewTokens...)
		}
		checkKVInvariants(t, s)
	}
	for _, id := range []string{"a", "b"} {
		if err := s.Add(NewRequest{ID: id, Prompt: prompts[id], Sampling: SamplingParams{MaxTokens: 4, IgnoreEOS: true}}); err != nil {
			t.Fatal(err)
		}
		step()
	}
	for s.HasWork() {
		step()
	}
	// When b arrives, a's stream holds its 33 prompt tokens; the hit is 32.
	if ratio == 1 {
		if hits := s.Stats().PrefixHits; hits != 0 || m.copies != 0 || m.computed != 33+3+34+3 {
			t.Fatalf("a hit of less than what its stream holds: %d hits, %d copies, %d computed; want none, none, 73", hits, m.copies, m.computed)
		}
		return
	}
	if hits := s.Stats().PrefixHits; hits != 32 || m.copies != 1 {
		t.Fatalf("prefix hits %d with %d copies, want 32 with 1", hits, m.copies)
	}
	if m.computed != 33+3+2+3 {
		t.Fatalf("computed %d tokens, want a's 33 and 3 decodes, b's own 2 and 3 decodes", m.computed)
	}
}

// TestKeptStreamsAreEvictedForNewRequests fills every kept stream with
// finished requests' cached prefixes, then serves more: the least recently
// used kept stream is given up, and its blocks leave the cache.
func TestKeptStreamsAreEvictedForNewRequests(t *testing.T) {
	cfg := streamConfig(5, 2)
	s := newTestScheduler(t, cfg)
	m := newStreamModel(cfg.SequenceSlots, cfg.StreamCells)
	out := map[string][]uint32{}
	for i := range 6 {
		serveWithStreams(t, s, m, fmt.Sprint("r", i), prompt(i, 12), 2, out)
	}
	kv := s.kv.(*streamKV)
	for i := range kv.streams {
		if n := len(kv.streams[i].blocks); i < kv.running && n != 0 || i >= kv.running && n == 0 {
			t.Fatalf("stream %d keeps %d blocks; want streams 2-4 kept, 0-1 free", i, n)
		}
	}
	// The first prompts' blocks went with their streams.
	if _, n := kv.lookup(&Request{prompt: prompt(0, 12), seq: noSeq}); n != 0 {
		t.Fatalf("r0's prefix still found (%d blocks) after its stream was evicted", n)
	}
	if _, n := kv.lookup(&Request{prompt: prompt(5, 12), seq: noSeq}); n != 2 {
		t.Fatalf("r5's prefix: %d blocks found, want 2", n)
	}
}

// TestSharedBlocksStayFindable: a block several streams hold stays
// findable when the stream the index named is evicted.
func TestSharedBlocksStayFindable(t *testing.T) {
	cfg := streamConfig(3, 1)
	s := newTestScheduler(t, cfg)
	m := newStreamModel(cfg.SequenceSlots, cfg.StreamCells)
	out := map[string][]uint32{}
	shared := prompt(7, 16)
	for i := range 5 {
		serveWithStreams(t, s, m, fmt.Sprint("r", i), slices.Concat(shared, prompt(10+i, 9)), 2, out)
	}
	if _, n := s.kv.(*streamKV).lookup(&Request{prompt: slices.Concat(shared, prompt(99, 9)), seq: noSeq}); n != 4 {
		t.Fatalf("the shared prefix: %d blocks found, want 4", n)
	}
}

// TestSharedSystemPromptLeavesKeptConversationsAlone: a new conversation
// that shares only a system prompt (one block) with a kept one computes
// that block again rather than copying the whole kept conversation for
// it, and the conversation's next turn still finds all of its history.
func TestSharedSystemPromptLeavesKeptConversationsAlone(t *testing.T) {
	cfg := streamConfig(4, 2)
	s := newTestScheduler(t, cfg)
	m := newStreamModel(cfg.SequenceSlots, cfg.StreamCells)
	out := map[string][]uint32{}
	system := prompt(7, cfg.BlockSize)
	first := slices.Concat(system, prompt(8, 40))
	serveWithStreams(t, s, m, "a1", first, 6, out)
	kv := s.kv.(*streamKV)
	held := slices.IndexFunc(kv.streams, func(st kvStream) bool { return len(st.blocks) > 0 })
	serveWithStreams(t, s, m, "b", slices.Concat(system, prompt(9, 20)), 3, out)
	if n := len(kv.streams[held].blocks); n < (len(first)+5)/cfg.BlockSize {
		t.Fatalf("the kept conversation's stream holds %d blocks after a request that shares only its system prompt", n)
	}
	before := m.computed
	second := slices.Concat(first, out["a1"], prompt(10, 3))
	serveWithStreams(t, s, m, "a2", second, 2, out)
	// a1 computed its prompt and 5 of its 6 outputs.
	hit := (len(first) + 5) / cfg.BlockSize * cfg.BlockSize
	if got, want := m.computed-before, len(second)-hit+1; got != want {
		t.Fatalf("the conversation's second turn computed %d tokens, want %d", got, want)
	}
	// a1's and b's went to the kept region, a2's came from a1's and went
	// back there.
	if n := copiesMade(m, kv); n != 4 {
		t.Fatalf("%d stream copies, want 4", n)
	}
	if n := len(kv.streams[held].blocks); n != (len(second)+1)/cfg.BlockSize {
		t.Fatalf("the kept conversation's stream holds %d blocks after its second turn", n)
	}
}

// TestIdleStreamsKeepPrefixesWithoutKeptRegion: with no more streams than
// running requests there is no kept region; an idle stream keeps its last
// request's KV, and a hit takes it over in place, with nothing copied.
func TestIdleStreamsKeepPrefixesWithoutKeptRegion(t *testing.T) {
	cfg := streamConfig(2, 2)
	s := newTestScheduler(t, cfg)
	m := newStreamModel(cfg.SequenceSlots, cfg.StreamCells)
	out := map[string][]uint32{}
	shared := prompt(11, 40)
	serveWithStreams(t, s, m, "a", slices.Concat(shared, []uint32{7}), 3, out)
	before := m.computed
	serveWithStreams(t, s, m, "b", slices.Concat(shared, []uint32{5, 6}), 3, out)
	if got, want := m.computed-before, 2+2; got != want {
		t.Fatalf("the second request computed %d tokens, want %d (its 2 own prompt tokens and 2 decodes)", got, want)
	}
	if n := copiesMade(m, s.kv.(*streamKV)); n != 0 {
		t.Fatalf("%d stream copies, want none", n)
	}
}

// TestPromptLogprobsComputeTheWholePromptInChunks: requests that ask for
// their prompt's log-probabilities find nothing in the prefix cache (each
// token's logits are wanted), and a step keeps the logits of at most
// PromptLogprobsChunk of their prompt tokens, however many run at once;
// the engine hands each one its prompt's targets, the tokens after.
func TestPromptLogprobsComputeTheWholePromptInChunks(t *testing.T) {
	cfg := streamConfig(6, 4)
	cfg.MaxNumBatchedTokens = 512
	s := newTestScheduler(t, cfg)
	m := newStreamModel(cfg.SequenceSlots, cfg.StreamCells)
	p := prompt(7, 120)
	prompts := map[string][]uint32{"warm": p, "a": p, "b": p, "c": p}
	out := map[string][]uint32{}
	tokensOf := func(id string) []uint32 { return slices.Concat(prompts[id], out[id]) }
	kept := map[string]int{}
	step := func() {
		b := s.Schedule()
		inStep := 0
		for _, r := range b.Requests {
			if r.Sampling.PromptLogprobs && r.Prompt != nil {
				n := min(r.NumComputed+r.NumNewTokens, len(r.Prompt)-1) - r.NumComputed
				inStep += max(n, 0)
				kept[r.ID] += max(n, 0)
			}
		}
		if inStep > PromptLogprobsChunk {
			t.Fatalf("a step keeps the logits of %d prompt tokens, more than %d", inStep, PromptLogprobsChunk)
		}
		for _, o := range s.Update(b, m.step(t, b, tokensOf)) {
			out[o.ID] = append(out[o.ID], o.NewTokens...)
		}
		checkKVInvariants(t, s)
	}
	// The same prompt without, so that the cache holds it.
	if err := s.Add(NewRequest{ID: "warm", Prompt: p, Sampling: SamplingParams{MaxTokens: 2, IgnoreEOS: true}}); err != nil {
		t.Fatal(err)
	}
	for s.HasWork() {
		step()
	}
	for _, id := range []string{"a", "b", "c"} {
		if err := s.Add(NewRequest{ID: id, Prompt: p, Sampling: SamplingParams{MaxTokens: 2, IgnoreEOS: true, PromptLogprobs: true}}); err != nil {
			t.Fatal(err)
		}
	}
	for s.HasWork() {
		step()
	}
	if hits := s.Stats().PrefixHits; hits != 0 {
		t.Fatalf("%d prompt tokens found in the prefix cache, want none", hits)
	}
	for _, id := range []string{"a", "b", "c"} {
		if kept[id] != len(p)-1 || len(out[id]) != 2 {
			t.Fatalf("%s: the logits of %d prompt tokens kept, %d tokens out; want %d and 2", id, kept[id], len(out[id]), len(p)-1)
		}
	}
}
