package engine

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"
	"unsafe"

	"pgregory.net/rapid"
)

const testEOS = 2

// tester is what both *testing.T and *rapid.T provide.
type tester interface {
	Helper()
	Fatal(args ...any)
	Fatalf(format string, args ...any)
}

// testToken is a deterministic sampler: token i of a request depends only
// on its prompt hash and i, never EOS.
func testToken(promptHash uint64, i int) uint32 {
	x := promptHash ^ uint64(i)*0x9E3779B97F4A7C15
	x ^= x >> 29
	return 100 + uint32(x%1000)
}

// runStep schedules, samples with testToken (or eosAt, when the index
// matches), and applies the result.
func runStep(t tester, s *Scheduler, eosAt map[string]int) (*Batch, []Output) {
	t.Helper()
	b := s.Schedule()
	res := StepResult{Tokens: make([]uint32, len(b.Requests))}
	for i, r := range b.Requests {
		if r.SampleIndex >= 0 {
			res.Tokens[i] = testToken(r.PromptHash, r.SampleIndex)
			if at, ok := eosAt[r.ID]; ok && at == r.SampleIndex {
				res.Tokens[i] = testEOS
			}
		}
	}
	outs := s.Update(b, res)
	checkKVInvariants(t, s)
	return b, outs
}

// checkKVInvariants checks the KV space against the requests, and the
// queues against the requests.
func checkKVInvariants(t tester, s *Scheduler) {
	t.Helper()
	switch kv := s.kv.(type) {
	case *kvCache:
		checkBlockInvariants(t, s, kv)
	case *streamKV:
		checkStreamInvariants(t, s, kv)
	}
	if got := len(s.waiting) + len(s.running); got != len(s.requests) {
		t.Fatalf("%d waiting + %d running, but %d requests", len(s.waiting), len(s.running), len(s.requests))
	}
}

// checkBlockInvariants verifies that block references match what requests
// hold and that the free queue holds exactly the unreferenced blocks.
func checkBlockInvariants(t tester, s *Scheduler, kv *kvCache) {
	t.Helper()
	refs := make([]int32, kv.numBlocks())
	for _, r := range s.requests {
		for _, id := range r.blocks {
			refs[id]++
		}
	}
	free := 0
	for id := kv.head; id != noBlock; id = kv.blocks[id].next {
		free++
		if refs[id] != 0 {
			t.Fatalf("block %d is in the free queue with %d references", id, refs[id])
		}
	}
	if free != kv.numFree {
		t.Fatalf("free queue holds %d blocks, count says %d", free, kv.numFree)
	}
	for id := range kv.blocks {
		b := &kv.blocks[id]
		if b.refCount != refs[id] {
			t.Fatalf("block %d: refCount %d, requests hold %d", id, b.refCount, refs[id])
		}
		if b.free != (refs[id] == 0) {
			t.Fatalf("block %d: free=%v with %d references", id, b.free, refs[id])
		}
	}
	for h, id := range kv.byHash {
		if b := &kv.blocks[id]; !b.cached || b.hash.Key() != h {
			t.Fatalf("hash index points at block %d which does not hold that hash", id)
		}
	}
}

func testConfig() SchedulerConfig {
	return SchedulerConfig{
		MaxNumSeqs:          8,
		MaxNumBatchedTokens: 64,
		BlockSize:           4,
		NumBlocks:           64,
		MaxModelLen:         128,
		EnablePrefixCaching: true,
		EOSTokenIDs:         []uint32{testEOS},
	}
}

func newTestScheduler(t tester, cfg SchedulerConfig) *Scheduler {
	t.Helper()
	s, err := NewScheduler(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func prompt(seed, n int) []uint32 {
	p := make([]uint32, n)
	for i := range p {
		p[i] = uint32(1000 + seed*7919 + i)
	}
	return p
}

// drain steps until the scheduler is empty and returns each request's
// tokens and finish reason.
func drain(t tester, s *Scheduler, eosAt map[string]int) (map[string][]uint32, map[string]FinishReason) {
	t.Helper()
	tokens := map[string][]uint32{}
	finish := map[string]FinishReason{}
	for steps := 0; s.HasWork(); steps++ {
		if steps > 10000 {
			t.Fatal("the scheduler did not finish its requests in 10000 steps")
		}
		_, outs := runStep(t, s, eosAt)
		for _, o := range outs {
			tokens[o.ID] = append(tokens[o.ID], o.NewTokens...)
			if o.Finish != NotFinished {
				finish[o.ID] = o.Finish
			}
		}
	}
	return tokens, finish
}

func TestContinuousBatchingFinishesAtMaxTokens(t *testing.T) {
	s := newTestScheduler(t, testConfig())
	for i := range 3 {
		if err := s.Add(NewRequest{ID: fmt.Sprint("r", i), Prompt: prompt(i, 10), Sampling: SamplingParams{MaxTokens: 5}}); err != nil {
			t.Fatal(err)
		}
	}
	b, outs := runStep(t, s, nil)
	if len(b.Requests) != 3 || b.NumPrefillTokens != 30 || b.NumDecodeSeqs != 0 {
		t.Fatalf("first step: %d requests, %d prefill tokens, %d decodes; want all three prefilled together", len(b.Requests), b.NumPrefillTokens, b.NumDecodeSeqs)
	}
	if len(outs) != 3 || !outs[0].First {
		t.Fatalf("first step produced %d outputs, want one first token per request", len(outs))
	}
	b, _ = runStep(t, s, nil)
	if b.NumDecodeSeqs != 3 || b.NumPrefillTokens != 0 || b.DecodeContextTokens != 33 {
		t.Fatalf("second step: %d decodes over %d context tokens, %d prefill; want 3 decodes over 33", b.NumDecodeSeqs, b.DecodeContextTokens, b.NumPrefillTokens)
	}
	tokens, finish := drain(t, s, nil)
	for i := range 3 {
		id := fmt.Sprint("r", i)
		if len(tokens[id]) != 3 || finish[id] != FinishedLength {
			t.Fatalf("%s: %d more tokens, finish %v; want 3 more and length", id, len(tokens[id]), finish[id])
		}
	}
	if st := s.Stats(); st.KVUsage != 0 || st.NumRunning != 0 || st.NumWaiting != 0 {
		t.Fatalf("after all finished: %+v; want an empty engine", st)
	}
}

func TestChunkedPrefillSamplesOnlyOnTheLastChunk(t *testing.T) {
	cfg := testConfig()
	cfg.MaxNumBatchedTokens = 32
	s := newTestScheduler(t, cfg)
	if err := s.Add(NewRequest{ID: "long", Prompt: prompt(1, 100), Sampling: SamplingParams{MaxTokens: 2}}); err != nil {
		t.Fatal(err)
	}
	var chunks []int
	for range 4 {
		b, outs := runStep(t, s, nil)
		r := b.Requests[0]
		chunks = append(chunks, r.NumNewTokens)
		if last := len(chunks) == 4; (r.SampleIndex == 0) != last || (len(outs) == 1) != last {
			t.Fatalf("chunk %d: sample index %d and %d outputs; only the last chunk samples", len(chunks), r.SampleIndex, len(outs))
		}
	}
	if want := []int{32, 32, 32, 4}; !slices.Equal(chunks, want) {
		t.Fatalf("chunks %v, want %v", chunks, want)
	}
}

func TestMaxNumSeqsAndBudgetBoundAStep(t *testing.T) {
	cfg := testConfig()
	cfg.MaxNumSeqs = 2
	s := newTestScheduler(t, cfg)
	for i := range 5 {
		if err := s.Add(NewRequest{ID: fmt.Sprint(i), Prompt: prompt(i, 8), Sampling: SamplingParams{MaxTokens: 3}}); err != nil {
			t.Fatal(err)
		}
	}
	b, _ := runStep(t, s, nil)
	if st := s.Stats(); len(b.Requests) != 2 || st.NumRunning != 2 || st.NumWaiting != 3 {
		t.Fatalf("%d scheduled, stats %+v; want 2 running and 3 waiting", len(b.Requests), st)
	}
	_, finish := drain(t, s, nil)
	if len(finish) != 5 {
		t.Fatalf("%d requests finished, want 5", len(finish))
	}
}

// TestQueueTimeIsTheWaitForTheFirstStep reads a clock the test moves: a
// request admitted at once waited nothing, one that waited for a seat
// waited until the step that admitted it, and only first outputs say.
func TestQueueTimeIsTheWaitForTheFirstStep(t *testing.T) {
	cfg := testConfig()
	cfg.MaxNumSeqs = 1
	s := newTestScheduler(t, cfg)
	now := time.Unix(1000, 0)
	s.now = func() time.Time { return now }
	for i := range 2 {
		if err := s.Add(NewRequest{ID: fmt.Sprint("r", i), Prompt: prompt(i, 8), Sampling: SamplingParams{MaxTokens: 2}}); err != nil {
			t.Fatal(err)
		}
	}
	queued := map[string][]time.Duration{}
	for steps := 0; s.HasWork(); steps++ {
		if steps > 100 {
			t.Fatal("the requests did not finish in 100 steps")
		}
		_, outs := runStep(t, s, nil)
		for _, o := range outs {
			queued[o.ID] = append(queued[o.ID], o.Queued)
		}
		now = now.Add(10 * time.Millisecond)
	}
	// r0 runs the first two steps; r1 is admitted at the third.
	want := map[string][]time.Duration{"r0": {0, 0}, "r1": {20 * time.Millisecond, 0}}
	if !maps.EqualFunc(queued, want, slices.Equal) {
		t.Fatalf("queue times by output %v, want %v", queued, want)
	}
}

func TestPrefixCacheHitsSharedPrefix(t *testing.T) {
	s := newTestScheduler(t, testConfig())
	shared := prompt(3, 16)
	if err := s.Add(NewRequest{ID: "a", Prompt: append(slices.Clone(shared), 1, 2, 3), Sampling: SamplingParams{MaxTokens: 1}}); err != nil {
		t.Fatal(err)
	}
	drain(t, s, nil)
	if err := s.Add(NewRequest{ID: "b", Prompt: append(slices.Clone(shared), 9, 9), Sampling: SamplingParams{MaxTokens: 1}}); err != nil {
		t.Fatal(err)
	}
	b, outs := runStep(t, s, nil)
	if b.Requests[0].NumComputed != 16 || b.Requests[0].NumNewTokens != 2 || outs[0].NumCachedTokens != 16 {
		t.Fatalf("b computed %d from cache and %d new, reported %d cached; want 16 and 2", b.Requests[0].NumComputed, b.Requests[0].NumNewTokens, outs[0].NumCachedTokens)
	}
	// The same prompt again leaves its last token to compute: the step
	// that computes it samples the first output.
	if err := s.Add(NewRequest{ID: "c", Prompt: shared, Sampling: SamplingParams{MaxTokens: 1}}); err != nil {
		t.Fatal(err)
	}
	b, _ = runStep(t, s, nil)
	if b.Requests[0].NumComputed != 12 || b.Requests[0].NumNewTokens != 4 {
		t.Fatalf("identical prompt: %d cached, %d new; want 12 and 4", b.Requests[0].NumComputed, b.Requests[0].NumNewTokens)
	}
	if st := s.Stats(); st.PrefixHits != 28 || st.PrefixQueries != 19+18+16 {
		t.Fatalf("prefix stats %d hits of %d queries; want 28 of 53", st.PrefixHits, st.PrefixQueries)
	}
}

func TestPrefixCachingOffFindsNothing(t *testing.T) {
	cfg := testConfig()
	cfg.EnablePrefixCaching = false
	s := newTestScheduler(t, cfg)
	for _, id := range []string{"a", "b"} {
		if err := s.Add(NewRequest{ID: id, Prompt: prompt(1, 20), Sampling: SamplingParams{MaxTokens: 1}}); err != nil {
			t.Fatal(err)
		}
		b, _ := runStep(t, s, nil)
		if b.Requests[0].NumComputed != 0 {
			t.Fatalf("%s found %d cached tokens with prefix caching off", id, b.Requests[0].NumComputed)
		}
	}
}

func TestPreemptionByRecomputeKeepsTokensExact(t *testing.T) {
	// 12 blocks of 4 tokens: four requests of 8 prompt tokens that grow to
	// 24 cannot all stay resident.
	cfg := testConfig()
	cfg.NumBlocks = 12
	cfg.MaxModelLen = 40
	small := newTestScheduler(t, cfg)
	big := newTestScheduler(t, testConfig())
	for _, s := range []*Scheduler{small, big} {
		for i := range 4 {
			if err := s.Add(NewRequest{ID: fmt.Sprint(i), Prompt: prompt(i, 8), Sampling: SamplingParams{MaxTokens: 16}}); err != nil {
				t.Fatal(err)
			}
		}
	}
	got, gotFinish := drain(t, small, nil)
	want, _ := drain(t, big, nil)
	if small.Stats().NumPreemptions == 0 {
		t.Fatal("no preemption with a KV cache too small for the load")
	}
	for id, w := range want {
		if !slices.Equal(got[id], w) || gotFinish[id] != FinishedLength {
			t.Fatalf("request %s after preemption: %v (%v), want %v", id, got[id], gotFinish[id], w)
		}
	}
}

func TestAbortFreesBlocksAlsoMidStep(t *testing.T) {
	s := newTestScheduler(t, testConfig())
	for _, id := range []string{"a", "b"} {
		if err := s.Add(NewRequest{ID: id, Prompt: prompt(len(id), 30), Sampling: SamplingParams{MaxTokens: 10}}); err != nil {
			t.Fatal(err)
		}
	}
	runStep(t, s, nil)
	used := s.Stats().KVUsage
	s.Abort("a", "unknown")
	if after := s.Stats().KVUsage; after >= used {
		t.Fatalf("KV usage %v after abort, was %v", after, used)
	}
	b := s.Schedule()
	s.Abort("b")
	outs := s.Update(b, StepResult{Tokens: make([]uint32, len(b.Requests))})
	checkKVInvariants(t, s)
	if len(outs) != 0 || s.HasWork() || s.Stats().KVUsage != 0 {
		t.Fatalf("abort during a step: %d outputs, work left %v, usage %v", len(outs), s.HasWork(), s.Stats().KVUsage)
	}
}

func TestStopConditions(t *testing.T) {
	cases := []struct {
		name   string
		params SamplingParams
		eosAt  int
		want   int
		finish FinishReason
	}{
		{"eos stops", SamplingParams{MaxTokens: 10}, 3, 4, FinishedStop},
		{"min tokens defer eos", SamplingParams{MaxTokens: 10, MinTokens: 6}, 3, 10, FinishedLength},
		{"ignore eos", SamplingParams{MaxTokens: 7, IgnoreEOS: true}, 3, 7, FinishedLength},
		{"stop token", SamplingParams{MaxTokens: 10, StopTokenIDs: []uint32{testToken(PromptHash(prompt(4, 5), nil), 1)}}, -1, 2, FinishedStop},
		{"stop token among the most allowed", SamplingParams{MaxTokens: 10, StopTokenIDs: append(prompt(1<<20, MaxStopTokenIDs-1), testToken(PromptHash(prompt(4, 5), nil), 1))}, -1, 2, FinishedStop},
		{"context length", SamplingParams{}, -1, 128 - 5, FinishedLength},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := newTestScheduler(t, testConfig())
			if err := s.Add(NewRequest{ID: "r", Prompt: prompt(4, 5), Sampling: tc.params}); err != nil {
				t.Fatal(err)
			}
			tokens, finish := drain(t, s, map[string]int{"r": tc.eosAt})
			if len(tokens["r"]) != tc.want || finish["r"] != tc.finish {
				t.Fatalf("%d tokens, finish %v; want %d, %v", len(tokens["r"]), finish["r"], tc.want, tc.finish)
			}
		})
	}
}

func TestMigratedRequestContinuesAfterItsTokens(t *testing.T) {
	s := newTestScheduler(t, testConfig())
	p := prompt(9, 6)
	h := PromptHash(p, nil)
	done := []uint32{testToken(h, 0), testToken(h, 1), testToken(h, 2)}
	if err := s.Add(NewRequest{ID: "m", Prompt: p, Output: done, Sampling: SamplingParams{MaxTokens: 5}}); err != nil {
		t.Fatal(err)
	}
	b, _ := runStep(t, s, nil)
	if r := b.Requests[0]; r.NumNewTokens != 9 || r.SampleIndex != 3 || r.Decode {
		t.Fatalf("migrated request's first step: %+v; want a 9-token prefill sampling index 3", r)
	}
	tokens, finish := drain(t, s, nil)
	if len(tokens["m"]) != 1 || finish["m"] != FinishedLength {
		t.Fatalf("after the first step: %d more tokens, %v; want one more and length", len(tokens["m"]), finish["m"])
	}
}

func TestAddRefusesWhatCannotBeServed(t *testing.T) {
	cfg := testConfig()
	cfg.VocabSize = 1 << 16
	s := newTestScheduler(t, cfg)
	if err := s.Add(NewRequest{ID: "dup", Prompt: prompt(1, 4)}); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		req  NewRequest
		want error
	}{
		{NewRequest{ID: "empty"}, ErrEmptyPrompt},
		{NewRequest{ID: "dup", Prompt: prompt(1, 4)}, ErrDuplicateID},
		{NewRequest{ID: "long", Prompt: prompt(1, 128)}, ErrTooLong},
		{NewRequest{ID: "stops", Prompt: prompt(1, 4), Sampling: SamplingParams{StopTokenIDs: prompt(1, MaxStopTokenIDs+1)}}, ErrTooManyStops},
		{NewRequest{ID: "vocab", Prompt: []uint32{1, 2, 1 << 16}}, ErrBadToken},
		{NewRequest{ID: "vocab-out", Prompt: prompt(1, 4), Output: []uint32{1<<16 + 5}}, ErrBadToken},
		{NewRequest{ID: "vocab-stop", Prompt: prompt(1, 4), Sampling: SamplingParams{StopTokenIDs: []uint32{1 << 20}}}, ErrBadToken},
	}
	for _, tc := range cases {
		if err := s.Add(tc.req); !errors.Is(err, tc.want) {
			t.Errorf("Add(%s) = %v, want %v", tc.req.ID, err, tc.want)
		}
	}
}

func TestConfigValidate(t *testing.T) {
	bad := []func(*SchedulerConfig){
		func(c *SchedulerConfig) { c.MaxNumSeqs = 0 },
		func(c *SchedulerConfig) { c.MaxNumBatchedTokens = 4 },
		func(c *SchedulerConfig) { c.BlockSize = 0 },
		func(c *SchedulerConfig) { c.NumBlocks = 3 },
		func(c *SchedulerConfig) { c.MaxModelLen = 1 },
	}
	for i, mutate := range bad {
		cfg := testConfig()
		mutate(&cfg)
		if err := cfg.Validate(); err == nil {
			t.Errorf("case %d: %+v validated", i, cfg)
		}
	}
	if err := DefaultSchedulerConfig().Validate(); err != nil {
		t.Fatal(err)
	}
}

// TestSchedulerProperties drives the scheduler with random requests, aborts
// and steps over a small KV cache and checks it against a simple model:
// every request that is not aborted finishes with exactly its tokens, in
// order, and the block accounting holds after every operation.
// TestSchedulerProperties runs random requests with shared prefixes,
// aborts and preemptions (small KV caches), with and without placing KV
// by sequence. With sequences the executor is the cell model, which also
// checks that every step's KV is its request's.
func TestSchedulerProperties(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		cfg := SchedulerConfig{
			MaxNumSeqs:          rapid.IntRange(1, 6).Draw(t, "maxSeqs"),
			BlockSize:           rapid.SampledFrom([]int{1, 4, 16}).Draw(t, "blockSize"),
			MaxModelLen:         64,
			EnablePrefixCaching: rapid.Bool().Draw(t, "prefixCaching"),
			EOSTokenIDs:         []uint32{testEOS},
		}
		cfg.MaxNumBatchedTokens = rapid.IntRange(cfg.MaxNumSeqs, 96).Draw(t, "budget")
		cfg.NumBlocks = rapid.IntRange(ceilDiv(cfg.MaxModelLen, cfg.BlockSize), 3*ceilDiv(cfg.MaxModelLen, cfg.BlockSize)).Draw(t, "blocks")
		var cells *streamModel
		if rapid.Bool().Draw(t, "bySequence") {
			// Few streams beyond the running ones, so that kept streams
			// are evicted often.
			cfg.SequenceSlots = cfg.MaxNumSeqs + rapid.IntRange(0, 3).Draw(t, "keptSlots")
			cfg.StreamCells = cfg.MaxModelLen + rapid.IntRange(0, 8).Draw(t, "spareCells")
			cells = newStreamModel(cfg.SequenceSlots, cfg.StreamCells)
		}
		s := newTestScheduler(t, cfg)
		if cells != nil {
			// Hits copied, or computed again.
			s.kv.(*streamKV).copyRatio = rapid.SampledFrom([]int{0, 1 << 20}).Draw(t, "copyRatio")
		}

		type expect struct {
			prompt  []uint32
			max     int
			aborted bool
		}
		want := map[string]*expect{}
		got := map[string][]uint32{}
		finished := map[string]bool{}
		tokensOf := func(id string) []uint32 { return slices.Concat(want[id].prompt, got[id]) }
		var ids []string
		n := rapid.IntRange(1, 60).Draw(t, "ops")
		for op := 0; op < n || s.HasWork(); op++ {
			if op > 5000 {
				t.Fatal("requests did not finish")
			}
			switch k := rapid.IntRange(0, 9).Draw(t, "op"); {
			case op < n && k < 3:
				id := fmt.Sprint("r", len(ids))
				// Prompts share prefixes: a few families, random lengths.
				p := prompt(rapid.IntRange(0, 2).Draw(t, "family"), rapid.IntRange(1, 40).Draw(t, "promptLen"))
				mx := rapid.IntRange(1, cfg.MaxModelLen-1-len(p)).Draw(t, "maxTokens")
				if err := s.Add(NewRequest{ID: id, Prompt: p, Sampling: SamplingParams{MaxTokens: mx, IgnoreEOS: true}}); err != nil {
					t.Fatal(err)
				}
				ids = append(ids, id)
				want[id] = &expect{prompt: p, max: mx}
			case op < n && k == 3 && len(ids) > 0:
				id := rapid.SampledFrom(ids).Draw(t, "abort")
				s.Abort(id)
				if !finished[id] {
					want[id].aborted = true
				}
			default:
				if !s.HasWork() {
					continue
				}
				var outs []Output
				if cells != nil {
					b := s.Schedule()
					// A client may go while its request's step runs.
					if len(b.Requests) > 0 && rapid.IntRange(0, 9).Draw(t, "abortMidStep") == 0 {
						id := b.Requests[rapid.IntRange(0, len(b.Requests)-1).Draw(t, "abortWhich")].ID
						s.Abort(id)
						if !finished[id] {
							want[id].aborted = true
						}
					}
					outs = s.Update(b, cells.step(t, b, tokensOf))
				} else {
					_, outs = runStep(t, s, nil)
				}
				for _, o := range outs {
					if finished[o.ID] {
						t.Fatalf("%s produced output after finishing", o.ID)
					}
					got[o.ID] = append(got[o.ID], o.NewTokens...)
					if o.Finish != NotFinished {
						finished[o.ID] = true
					}
				}
			}
			checkKVInvariants(t, s)
		}
		for id, w := range want {
			h := PromptHash(w.prompt, nil)
			for i, tok := range got[id] {
				if tok != testToken(h, i) {
					t.Fatalf("%s token %d is %d, want %d", id, i, tok, testToken(h, i))
				}
			}
			if !w.aborted && (len(got[id]) != w.max || !finished[id]) {
				t.Fatalf("%s: %d tokens (finished %v), want %d", id, len(got[id]), finished[id], w.max)
			}
		}
		if s.Stats().KVUsage != 0 {
			t.Fatalf("KV usage %v with no requests left", s.Stats().KVUsage)
		}
	})
}

// TestPrefixHashesAreTheCachesNames checks that a balancer computing
// PrefixHashes from a prompt names blocks as the engine's cache does, for
// each salt, and that salts name the same tokens apart.
func TestPrefixHashesAreTheCachesNames(t *testing.T) {
	prompt := make([]uint32, 16*5+7)
	for i := range prompt {
		prompt[i] = uint32(i*7919) % 1000
	}
	bySalt := map[string][]BlockHash{}
	for _, salt := range []string{"", "tenant-a", "tenant-b"} {
		r := &Request{prompt: prompt, salt: salt}
		r.extendHashes(16, 5)
		if got := PrefixHashes(prompt, 16, salt); !slices.Equal(got, r.blockHashes) {
			t.Fatalf("salt %q: PrefixHashes = %x, the engine's = %x", salt, got, r.blockHashes)
		}
		for other, hs := range bySalt {
			for i := range hs {
				if hs[i] == r.blockHashes[i] {
					t.Fatalf("block %d has the same hash under salts %q and %q", i, other, salt)
				}
			}
		}
		bySalt[salt] = r.blockHashes
	}
}

// TestCacheSaltKeepsTenantsApart: a prompt cached under one salt is a hit
// for that salt only, whether the engine hashes it or is handed the
// hashes its balancer computed.
func TestCacheSaltKeepsTenantsApart(t *testing.T) {
	s := newTestScheduler(t, testConfig())
	p := prompt(5, 40)
	cached := func(id, salt string, given bool) int {
		t.Helper()
		nr := NewRequest{ID: id, Prompt: p, CacheSalt: salt, Sampling: SamplingParams{MaxTokens: 1}}
		if given {
			nr.BlockHashes = PrefixHashes(p, testConfig().BlockSize, salt)
		}
		if err := s.Add(nr); err != nil {
			t.Fatal(err)
		}
		_, outs := runStep(t, s, nil)
		drain(t, s, nil)
		return outs[0].NumCachedTokens
	}
	if n := cached("a1", "a", false); n != 0 {
		t.Fatalf("the first request hit %d cached tokens", n)
	}
	if n := cached("b1", "b", true); n != 0 {
		t.Fatalf("another salt hit %d tokens of the first one's prompt", n)
	}
	if n := cached("none", "", false); n != 0 {
		t.Fatalf("no salt hit %d tokens of a salted prompt", n)
	}
	// An identical prompt leaves its last token to compute.
	bs := testConfig().BlockSize
	want := (len(p) - 1) / bs * bs
	if n := cached("a2", "a", true); n != want {
		t.Fatalf("the same salt hit %d cached tokens, want %d", n, want)
	}
	if n := cached("b2", "b", false); n != want {
		t.Fatalf("the second salt's own prompt hit %d cached tokens, want %d", n, want)
	}
}

// BenchmarkPrefixHashes is what naming a request's blocks costs: a prompt
// of 2,048 tokens is 128 blocks.
func BenchmarkPrefixHashes(b *testing.B) {
	p := prompt(9, 2048)
	for b.Loop() {
		PrefixHashes(p, 16, "")
	}
}

// BenchmarkStopCheck is the per-token cost of a request's stop token ids,
// with none and with the most allowed: the same, since they are a set.
func BenchmarkStopCheck(b *testing.B) {
	for _, n := range []int{0, 1, MaxStopTokenIDs} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			s := newTestScheduler(b, testConfig())
			req := &Request{sampling: SamplingParams{StopTokenIDs: prompt(1<<20, n)}}
			req.stops = newTokenSet(req.sampling.StopTokenIDs)
			for i := 0; b.Loop(); i++ {
				if s.checkStop(req, uint32(i)|1<<31) != NotFinished {
					b.Fatal("stopped")
				}
			}
		})
	}
}

// TestHotRequestFieldsComeFirst holds Request to its layout: the fields
// every step reads or writes end, with sampling.IgnoreEOS, within the
// first 192 bytes (three cache lines). A field added among them fails
// here, not as a slower simulator.
func TestHotRequestFieldsComeFirst(t *testing.T) {
	var r Request
	if end := unsafe.Offsetof(r.sampling) + unsafe.Offsetof(r.sampling.IgnoreEOS) + unsafe.Sizeof(r.sampling.IgnoreEOS); end > 192 {
		t.Fatalf("sampling.IgnoreEOS ends at byte %d of a request, past 192: a field went in among the hot ones", end)
	}
}
