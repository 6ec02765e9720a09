//go:build llamacpp

package llamacpp_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dpnode/dpnode/engine"
	"github.com/dpnode/dpnode/engine/gguf"
	"github.com/dpnode/dpnode/engine/llamacpp"
	"github.com/dpnode/dpnode/engine/llamacpp/llamacpptest"
)

func workerConfig(t *testing.T) llamacpp.WorkerConfig {
	return llamacpp.WorkerConfig{Binary: llamacpptest.Worker(t), Logger: slog.New(slog.DiscardHandler)}
}

func newTokenizer(t *testing.T, model string) *llamacpp.Tokenizer {
	return llamacpptest.Tokenizer(t, model)
}

// TestTokenizerMatchesLlamaCppVectors tokenizes llama.cpp's own test
// texts through the worker and compares with its expected ids, for Llama
// 3's BPE, Qwen 2's BPE and Llama 2's SentencePiece.
func TestTokenizerMatchesLlamaCppVectors(t *testing.T) {
	for _, name := range []string{"llama-bpe", "qwen2", "llama-spm"} {
		t.Run(name, func(t *testing.T) {
			path := llamacpptest.Vocab(t, name)
			inp, err := os.ReadFile(path + ".inp")
			if err != nil {
				t.Fatal(err)
			}
			out, err := os.ReadFile(path + ".out")
			if err != nil {
				t.Fatal(err)
			}
			texts := strings.Split(strings.TrimSuffix(string(inp), "\n__ggml_vocab_test__\n"), "\n__ggml_vocab_test__\n")
			want := strings.Split(strings.TrimSuffix(string(out), "\n"), "\n")
			if len(texts) != len(want) || len(texts) < 20 {
				t.Fatalf("%d texts and %d expected lines", len(texts), len(want))
			}
			tok := newTokenizer(t, path)
			for i, text := range texts {
				ids, err := tok.Encode(text, false)
				if err != nil {
					t.Fatal(err)
				}
				var wantIDs []uint32
				for _, f := range strings.Fields(want[i]) {
					n, _ := strconv.Atoi(f)
					wantIDs = append(wantIDs, uint32(n))
				}
				if !slices.Equal(ids, wantIDs) {
					t.Fatalf("text %d %q: got %v, want %v", i, text, ids, wantIDs)
				}
				// What the API's check before tokenizing relies on: no
				// token stands for more than MaxTokenBytes of text.
				if per := tok.MaxTokenBytes(); per <= 0 || len(text) > len(ids)*per {
					t.Fatalf("text %d: %d bytes in %d tokens, more than MaxTokenBytes %d each", i, len(text), len(ids), per)
				}
				if name != "llama-spm" && tok.Decode(ids) != text {
					// Byte-level BPE round-trips exactly; SentencePiece
					// adds a leading space.
					t.Fatalf("text %d %q decodes back as %q", i, text, tok.Decode(ids))
				}
			}
		})
	}
}

// TestTokenizerAddsBOSForCompletions checks the special tokens: a
// completion's prompt gets Llama 3's BOS, and special tokens written as
// text are read as themselves.
func TestTokenizerAddsBOSForCompletions(t *testing.T) {
	tok := newTokenizer(t, llamacpptest.Model(t))
	ids, err := tok.Encode("Hello world", true)
	if err != nil || !slices.Equal(ids, []uint32{128000, 9906, 1917}) {
		t.Fatalf("Hello world with BOS: %v %v", ids, err)
	}
	ids, err = tok.Encode("<|start_header_id|>user<|end_header_id|>", false)
	if err != nil || !slices.Equal(ids, []uint32{128006, 882, 128007}) {
		t.Fatalf("special tokens as text: %v %v", ids, err)
	}
	if got := tok.Decode([]uint32{128009, 9906}); got != "Hello" {
		t.Fatalf("an end-of-turn token decodes to %q; special tokens show nothing", got)
	}
}

// TestTokenizerComesBackAfterItsWorkerDies kills the tokenizer's worker:
// the next call starts another.
func TestTokenizerComesBackAfterItsWorkerDies(t *testing.T) {
	tok := newTokenizer(t, llamacpptest.Model(t))
	pid := tok.Pid()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	ids, err := tok.Encode("Hello world", false)
	if err != nil || !slices.Equal(ids, []uint32{9906, 1917}) {
		t.Fatalf("after a kill: %v %v", ids, err)
	}
	if tok.Pid() == pid {
		t.Fatal("the same worker answered")
	}
}

// TestBadModelFilesAreClearErrors checks that a node refuses what it
// cannot serve, naming the file and the problem, before serving.
func TestBadModelFilesAreClearErrors(t *testing.T) {
	dir := t.TempDir()
	good, err := os.ReadFile(llamacpptest.Model(t))
	if err != nil {
		t.Fatal(err)
	}
	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	cases := []struct {
		name, path, want string
	}{
		{"missing", filepath.Join(dir, "nope.gguf"), "no such file"},
		{"not gguf", write("text.gguf", []byte("this is not a model\n")), "not a GGUF file"},
		{"truncated", write("cut.gguf", good[:len(good)/2]), "truncated"},
		{"vocabulary only", llamacpptest.Vocab(t, "llama-bpe"), "no weights"},
	}
	for _, c := range cases {
		_, err := llamacpp.InspectModel(c.path)
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), c.path) {
			t.Errorf("%s: %v; want an error naming %s and saying %q", c.name, err, c.path, c.want)
		}
	}

	// An architecture llama.cpp does not know passes the header checks;
	// the worker refuses it with llama.cpp's own words.
	g, err := gguf.Read(bytes.NewReader(good), int64(len(good)))
	if err != nil {
		t.Fatal(err)
	}
	var kv []gguf.KV
	for _, e := range g.KV {
		e.Key = strings.Replace(e.Key, "llama.", "martian.", 1)
		if e.Key == "general.architecture" {
			e.Value = "martian"
		}
		kv = append(kv, e)
	}
	var buf bytes.Buffer
	if err := gguf.Write(&buf, kv, []gguf.Tensor{{Name: "token_embd.weight", Dims: []uint64{4}, Data: make([]float32, 4)}}); err != nil {
		t.Fatal(err)
	}
	martian := write("martian.gguf", buf.Bytes())
	if _, err := llamacpp.InspectModel(martian); err != nil {
		t.Fatalf("the header of an unknown architecture: %v", err)
	}
	cfg := engine.SchedulerConfig{MaxNumSeqs: 4, MaxNumBatchedTokens: 64, BlockSize: 16, MaxModelLen: 256}
	_, err = llamacpp.NewExecutor(context.Background(), llamacpp.ExecutorConfig{Worker: workerConfig(t), Model: martian, KVCacheBytes: 1 << 20, Scheduler: cfg, Threads: 1, KVCacheDtype: "f32"})
	if err == nil || !strings.Contains(err.Error(), "martian") || !strings.Contains(err.Error(), "architecture") {
		t.Fatalf("an unknown architecture: %v", err)
	}
}

func newExecutor(t *testing.T, cfg engine.SchedulerConfig) *llamacpp.Executor {
	t.Helper()
	return newExecutorGreedy(t, cfg, "")
}

// newExecutorGreedy starts it with greedy rows sampled where says
// (ExecutorConfig.GreedyInGraph).
func newExecutorGreedy(t *testing.T, cfg engine.SchedulerConfig, where string) *llamacpp.Executor {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	e, err := llamacpp.NewExecutor(ctx, llamacpp.ExecutorConfig{Worker: workerConfig(t), Model: llamacpptest.Model(t), KVCacheBytes: 64 << 20,
		Scheduler: cfg, Threads: 1, KVCacheDtype: "f32", GreedyInGraph: where})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

// run serves requests on a scheduler and the executor until they finish,
// and returns their tokens.
func run(t *testing.T, s *engine.Scheduler, e *llamacpp.Executor) map[string][]uint32 {
	t.Helper()
	out := map[string][]uint32{}
	steps(t, s, e, func(o engine.Output) { out[o.ID] = append(out[o.ID], o.NewTokens...) })
	return out
}

// steps runs the scheduler's requests to their end, handing each output to
// f.
func steps(t *testing.T, s *engine.Scheduler, e *llamacpp.Executor, f func(engine.Output)) {
	t.Helper()
	for n := 0; s.HasWork(); n++ {
		if n > 5000 {
			t.Fatal("the requests did not finish")
		}
		step(t, s, e, f)
	}
}

// step runs one step of the scheduler's, handing each output to f.
func step(t *testing.T, s *engine.Scheduler, e *llamacpp.Executor, f func(engine.Output)) {
	t.Helper()
	b := s.Schedule()
	res, err := e.Execute(context.Background(), b)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range s.Update(b, res) {
		f(o)
	}
}

func schedulerFor(t *testing.T, e *llamacpp.Executor, cfg engine.SchedulerConfig) *engine.Scheduler {
	t.Helper()
	cfg, err := cfg.WithLimits(e.Limits())
	if err != nil {
		t.Fatal(err)
	}
	s, err := engine.NewScheduler(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestSharedPrefixIsComputedOnce serves a request with a 2,000-token
// prompt, then another that shares it: the worker computes only the
// second's own tokens, and the prefix cache counts the hit.
func TestSharedPrefixIsComputedOnce(t *testing.T) {
	cfg := engine.SchedulerConfig{MaxNumSeqs: 8, MaxNumBatchedTokens: 512, BlockSize: 16, MaxModelLen: 4096, EnablePrefixCaching: true}
	e := newExecutor(t, cfg)
	s := schedulerFor(t, e, cfg)
	prefix := make([]uint32, 2000)
	for i := range prefix {
		prefix[i] = uint32(1000 + i*7%5000)
	}
	greedy := engine.SamplingParams{MaxTokens: 8, IgnoreEOS: true}
	add := func(id string, own ...uint32) {
		if err := s.Add(engine.NewRequest{ID: id, Prompt: slices.Concat(prefix, own), Sampling: greedy}); err != nil {
			t.Fatal(err)
		}
	}
	add("first", 11, 12, 13)
	first := run(t, s, e)["first"]
	before := s.Stats().ComputedTokens
	add("second", 21, 22)
	second := run(t, s, e)["second"]
	computed := s.Stats().ComputedTokens - before
	// 2,000 tokens are 125 full blocks: the second computes its last 2
	// prompt tokens and its 7 decodes (the 8th token needs no compute).
	if computed != 2+7 {
		t.Fatalf("the second request computed %d tokens, want 9", computed)
	}
	if hits := s.Stats().PrefixHits; hits != 2000 {
		t.Fatalf("prefix cache hits %d, want 2000", hits)
	}
	// The shared KV is the same KV: the second's greedy continuation is
	// llama.cpp's own.
	ref := llamacpptest.Greedy(t, llamacpptest.Model(t), "f32", 8, [][]uint32{slices.Concat(prefix, []uint32{11, 12, 13}), slices.Concat(prefix, []uint32{21, 22})})
	if !slices.Equal(first, ref[0]) || !slices.Equal(second, ref[1]) {
		t.Fatalf("after a prefix hit:\n first %v\n  want %v\nsecond %v\n  want %v", first, ref[0], second, ref[1])
	}
}

// TestKeptPrefixesComeBackFromHostMemory: with the prefix cache, the
// streams past the running requests are kept in host memory, as
// llama.cpp's per-sequence state, not in its context. A finished request's
// KV is saved there, and a later request that shares its prefix gets it
// restored into its own stream: it computes only its own tokens, and its
// greedy continuation is what llama.cpp computes from the whole prompt.
// The restored prefix serves twice, and the saved copy of a request that
// took a prefix from it replaces it (a conversation's next turn).
func TestKeptPrefixesComeBackFromHostMemory(t *testing.T) {
	cfg := engine.SchedulerConfig{MaxNumSeqs: 2, MaxNumBatchedTokens: 512, BlockSize: 16, MaxModelLen: 2048, EnablePrefixCaching: true}
	e := newExecutor(t, cfg)
	if slots := e.Limits().SequenceSlots; slots <= cfg.MaxNumSeqs {
		t.Fatalf("%d sequence slots for %d running requests: nothing is kept", slots, cfg.MaxNumSeqs)
	}
	s := schedulerFor(t, e, cfg)
	prefix := make([]uint32, 800)
	for i := range prefix {
		prefix[i] = uint32(2000 + i*13%7000)
	}
	greedy := engine.SamplingParams{MaxTokens: 6, IgnoreEOS: true}
	var prompts [][]uint32
	var got [][]uint32
	serve := func(id string, prompt []uint32) (computed uint64) {
		t.Helper()
		before := s.Stats().ComputedTokens
		if err := s.Add(engine.NewRequest{ID: id, Prompt: prompt, Sampling: greedy}); err != nil {
			t.Fatal(err)
		}
		got = append(got, run(t, s, e)[id])
		prompts = append(prompts, prompt)
		return s.Stats().ComputedTokens - before
	}
	serve("first", slices.Concat(prefix, []uint32{11, 12, 13}))
	// 800 tokens are 50 full blocks: each later request computes its own
	// tokens past them and 5 decodes.
	if n := serve("second", slices.Concat(prefix, []uint32{21, 22, 23, 24})); n != 4+5 {
		t.Fatalf("the second request computed %d tokens, want 9: the kept prefix was not restored", n)
	}
	if n := serve("third", slices.Concat(prefix, []uint32{31})); n != 1+5 {
		t.Fatalf("the third request computed %d tokens, want 6", n)
	}
	ref := llamacpptest.Greedy(t, llamacpptest.Model(t), "f32", 6, prompts)
	for i := range prompts {
		if !slices.Equal(got[i], ref[i]) {
			t.Fatalf("request %d after a restored prefix:\n got %v\nwant %v", i, got[i], ref[i])
		}
	}
}

// TestRequestsTakeTurnsInASmallKVCache runs more requests than the KV
// cache holds at once: its memory holds one stream, so they take turns on
// it, each reusing the KV cells the one before gave back, and every
// request still ends as llama.cpp alone would end it.
func TestRequestsTakeTurnsInASmallKVCache(t *testing.T) {
	cfg := engine.SchedulerConfig{MaxNumSeqs: 8, MaxNumBatchedTokens: 256, BlockSize: 16, MaxModelLen: 512, EnablePrefixCaching: true}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// 640 cells of 512 bytes (F32): one stream of the max length.
	e, err := llamacpp.NewExecutor(ctx, llamacpp.ExecutorConfig{Worker: workerConfig(t), Model: llamacpptest.Model(t), KVCacheBytes: 640 * 512,
		Scheduler: cfg, Threads: 1, KVCacheDtype: "f32"})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	s := schedulerFor(t, e, cfg)
	if n := s.Config().MaxNumSeqs; n != 1 {
		t.Fatalf("%d sequences at once in a KV cache of one stream", n)
	}
	var prompts [][]uint32
	for i := range 8 {
		p := make([]uint32, 150)
		for j := range p {
			p[j] = uint32(500 + (i*131+j*17)%9000)
		}
		prompts = append(prompts, p)
		if err := s.Add(engine.NewRequest{ID: fmt.Sprint(i), Prompt: p, Sampling: engine.SamplingParams{MaxTokens: 48, IgnoreEOS: true}}); err != nil {
			t.Fatal(err)
		}
	}
	out := run(t, s, e)
	ref := llamacpptest.Greedy(t, llamacpptest.Model(t), "f32", 48, prompts)
	for i := range prompts {
		if !slices.Equal(out[fmt.Sprint(i)], ref[i]) {
			t.Fatalf("request %d:\n got %v\nwant %v", i, out[fmt.Sprint(i)], ref[i])
		}
	}
}

// TestSeededSamplingContinuesAnywhere samples with a seed, then restarts
// the request from its first half on a fresh worker, as a migration does:
// the second half is the same.
func TestSeededSamplingContinuesAnywhere(t *testing.T) {
	cfg := engine.SchedulerConfig{MaxNumSeqs: 4, MaxNumBatchedTokens: 256, BlockSize: 16, MaxModelLen: 512, EnablePrefixCaching: true}
	seed := int64(42)
	sp := engine.SamplingParams{MaxTokens: 40, IgnoreEOS: true, Temperature: 0.9, TopP: 0.95, TopK: 50, Seed: &seed}
	prompt := []uint32{128000, 9906, 1917, 11, 420, 374, 264, 1296}
	e1 := newExecutor(t, cfg)
	s1 := schedulerFor(t, e1, cfg)
	if err := s1.Add(engine.NewRequest{ID: "a", Prompt: prompt, Sampling: sp}); err != nil {
		t.Fatal(err)
	}
	whole := run(t, s1, e1)["a"]
	e2 := newExecutor(t, cfg)
	s2 := schedulerFor(t, e2, cfg)
	if err := s2.Add(engine.NewRequest{ID: "a", Prompt: prompt, Output: whole[:17], Sampling: sp}); err != nil {
		t.Fatal(err)
	}
	rest := run(t, s2, e2)["a"]
	if !slices.Equal(slices.Concat(whole[:17], rest), whole) {
		t.Fatalf("seeded sampling moved:\n whole %v\nresumed %v + %v", whole, whole[:17], rest)
	}
	// A different seed draws differently: the seed is used.
	other := int64(43)
	sp.Seed = &other
	if err := s2.Add(engine.NewRequest{ID: "b", Prompt: prompt, Sampling: sp}); err != nil {
		t.Fatal(err)
	}
	if slices.Equal(run(t, s2, e2)["b"], whole) {
		t.Fatal("seeds 42 and 43 drew the same 40 tokens")
	}
}

// TestMinTokensKeepsEndTokensFromBeingSampled asks for min_tokens with a
// stop token the model would pick early, and checks that it is not picked
// before min_tokens: it is masked, as vLLM masks it, rather than sampled
// and ignored.
func TestMinTokensKeepsEndTokensFromBeingSampled(t *testing.T) {
	cfg := engine.SchedulerConfig{MaxNumSeqs: 4, MaxNumBatchedTokens: 256, BlockSize: 16, MaxModelLen: 512, EnablePrefixCaching: true}
	e := newExecutor(t, cfg)
	s := schedulerFor(t, e, cfg)
	prompt := []uint32{128000, 9906, 1917}
	if err := s.Add(engine.NewRequest{ID: "free", Prompt: prompt, Sampling: engine.SamplingParams{MaxTokens: 6, IgnoreEOS: true}}); err != nil {
		t.Fatal(err)
	}
	free := run(t, s, e)["free"]
	// The model's greedy third token is a stop token: it would end the
	// request at 3 tokens, but min_tokens 5 keeps it from being drawn.
	stop := free[2]
	sp := engine.SamplingParams{MaxTokens: 6, MinTokens: 5, StopTokenIDs: []uint32{stop}}
	if err := s.Add(engine.NewRequest{ID: "min", Prompt: prompt, Sampling: sp}); err != nil {
		t.Fatal(err)
	}
	got := run(t, s, e)["min"]
	if i := slices.Index(got, stop); i >= 0 && i < 5 {
		t.Fatalf("the stop token came at %d, before min_tokens 5: %v (free run %v)", i, got, free)
	}
	if len(got) < 5 || !slices.Equal(got[:2], free[:2]) {
		t.Fatalf("with min_tokens: %v (free run %v)", got, free)
	}
}

// TestKilledWorkerIsNoticed kills an idle worker: its executor says it is
// gone, with the signal.
func TestKilledWorkerIsNoticed(t *testing.T) {
	cfg := engine.SchedulerConfig{MaxNumSeqs: 4, MaxNumBatchedTokens: 64, BlockSize: 16, MaxModelLen: 256}
	e := newExecutor(t, cfg)
	if err := syscall.Kill(e.Pid(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case <-e.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the executor did not notice its worker's death")
	}
	if err := e.Err(); err == nil || !strings.Contains(err.Error(), "killed") {
		t.Fatalf("the worker's death: %v", err)
	}
	_, err := e.Execute(context.Background(), &engine.Batch{})
	if err == nil || errors.Is(err, context.Canceled) {
		t.Fatalf("a step on a dead worker: %v", err)
	}
}

// TestGreedyInTheGraphMatchesTheHost samples greedy requests inside
// llama.cpp's graph (as a GPU rank does by default), with a seeded sampled
// request joining them after ten steps: that one needs its logits on the
// host, so the worker takes the graph's samplers off, and puts them back
// after 256 steps of greedy rows only, in the middle of the long request.
// Every greedy request ends as llama.cpp's own greedy decode, and the
// sampled one as it does on a worker that samples everything on the host.
func TestGreedyInTheGraphMatchesTheHost(t *testing.T) {
	cfg := engine.SchedulerConfig{MaxNumSeqs: 8, MaxNumBatchedTokens: 256, BlockSize: 16, MaxModelLen: 512, EnablePrefixCaching: true}
	inGraph, host := newExecutorGreedy(t, cfg, "on"), newExecutorGreedy(t, cfg, "off")
	if !inGraph.Ready().GreedyInGraph || host.Ready().GreedyInGraph {
		t.Fatalf("greedy in the graph: %v with on, %v with off", inGraph.Ready().GreedyInGraph, host.Ready().GreedyInGraph)
	}
	seed := int64(9)
	sampled := engine.SamplingParams{MaxTokens: 30, IgnoreEOS: true, Temperature: 0.8, Seed: &seed}
	// The first request outlasts the sampled one by more than 256 steps.
	lengths := []int{400, 40, 40, 90}
	var prompts [][]uint32
	for i := range lengths {
		p := make([]uint32, 20+i*13)
		for j := range p {
			p[j] = uint32(700 + (i*211+j*29)%9000)
		}
		prompts = append(prompts, p)
	}
	serve := func(e *llamacpp.Executor) map[string][]uint32 {
		s := schedulerFor(t, e, cfg)
		for i, p := range prompts {
			if err := s.Add(engine.NewRequest{ID: fmt.Sprint(i), Prompt: p, Sampling: engine.SamplingParams{MaxTokens: lengths[i], IgnoreEOS: true}}); err != nil {
				t.Fatal(err)
			}
		}
		out := map[string][]uint32{}
		for range 10 {
			step(t, s, e, func(o engine.Output) { out[o.ID] = append(out[o.ID], o.NewTokens...) })
		}
		if err := s.Add(engine.NewRequest{ID: "sampled", Prompt: prompts[2], Sampling: sampled}); err != nil {
			t.Fatal(err)
		}
		for id, toks := range run(t, s, e) {
			out[id] = append(out[id], toks...)
		}
		return out
	}
	got, want := serve(inGraph), serve(host)
	for i, p := range prompts {
		ref := llamacpptest.Greedy(t, llamacpptest.Model(t), "f32", lengths[i], [][]uint32{p})[0]
		if !slices.Equal(got[fmt.Sprint(i)], ref) {
			t.Fatalf("greedy request %d sampled in the graph:\n got %v\nwant %v", i, got[fmt.Sprint(i)], ref)
		}
	}
	if len(got["sampled"]) != sampled.MaxTokens || !slices.Equal(got["sampled"], want["sampled"]) {
		t.Fatalf("the seeded request beside greedy ones in the graph:\n got %v\nwant %v (on the host)", got["sampled"], want["sampled"])
	}
}

// TestGapsBetweenDecodingStreamsAreFilledWithoutHarm decodes sequences in
// streams 0, 2, 5, 16 and 27 while streams 1 and 12 keep a prompt and the
// others are empty. The worker puts a token in each stream of a gap, so
// that llama.cpp computes the step in fewer passes, and takes it out
// after: in gaps of up to 8 streams (1; 3 and 4) and in wider gaps of
// empty streams (17 to 26), not in a wide gap with a prompt in it (6 to
// 15). The decodes end as llama.cpp's own greedy decode, and streams 1
// and 12 then go on from their prompts as if nothing had been put in them.
func TestGapsBetweenDecodingStreamsAreFilledWithoutHarm(t *testing.T) {
	cfg := engine.SchedulerConfig{MaxNumSeqs: 32, MaxNumBatchedTokens: 256, BlockSize: 16, MaxModelLen: 512}
	e := newExecutor(t, cfg)
	const steps = 12
	seqs := []int32{1, 12, 0, 2, 5, 16, 27}
	held, decoding := []int{0, 1}, []int{2, 3, 4, 5, 6}
	prompts := make([][]uint32, len(seqs))
	for i := range seqs {
		prompts[i] = make([]uint32, 10+3*i)
		for j := range prompts[i] {
			prompts[i][j] = uint32(900 + (i*307+j*41)%9000)
		}
	}
	greedy := &engine.SamplingParams{}
	out := make([][]uint32, len(seqs))
	exec := func(reqs []engine.ScheduledRequest, which []int) {
		t.Helper()
		res, err := e.Execute(context.Background(), &engine.Batch{Requests: reqs})
		if err != nil {
			t.Fatal(err)
		}
		for k, i := range which {
			out[i] = append(out[i], res.Tokens[k])
		}
	}
	prefill := func(i int) engine.ScheduledRequest {
		return engine.ScheduledRequest{ID: fmt.Sprint(i), Seq: seqs[i], NumNewTokens: len(prompts[i]), Tokens: prompts[i], SampleIndex: 0, Sampling: greedy}
	}
	decode := func(i int) engine.ScheduledRequest {
		return engine.ScheduledRequest{ID: fmt.Sprint(i), Seq: seqs[i], NumComputed: len(prompts[i]) + len(out[i]) - 1, NumNewTokens: 1,
			SampleIndex: len(out[i]), Decode: true, Sampling: greedy}
	}
	batch := func(which []int, req func(int) engine.ScheduledRequest) []engine.ScheduledRequest {
		var reqs []engine.ScheduledRequest
		for _, i := range which {
			reqs = append(reqs, req(i))
		}
		return reqs
	}
	exec(batch(held, prefill), held)
	exec(batch(decoding, prefill), decoding)
	for range steps - 1 {
		exec(batch(decoding, decode), decoding)
	}
	// Streams 1 and 12 held their prompts (and a sampled token not yet
	// computed) through the fills; now they decode.
	for range steps - 1 {
		exec(batch(held, decode), held)
	}
	// Each of the first decode steps filled streams 1, 3, 4 and 17 to 26;
	// the last ones, 2 to 11, are wider than maxFillGap but hold a prompt.
	if got, want := e.GapTokens(), uint64(13*(steps-1)); got != want {
		t.Fatalf("%d tokens filled gaps, want %d", got, want)
	}
	ref := llamacpptest.Greedy(t, llamacpptest.Model(t), "f32", steps, prompts)
	for i := range seqs {
		if !slices.Equal(out[i], ref[i]) {
			t.Fatalf("stream %d:\n got %v\nwant %v", seqs[i], out[i], ref[i])
		}
	}
}

// TestGrammarConstrainsTheOutput serves requests under a grammar, greedy
// and sampled: the random-weight model's text matches it and ends with the
// model's end token once the grammar is done. A request restarted from
// its first half on a fresh worker, as a migration restarts it, rebuilds
// its grammar from the tokens it has and ends the same.
func TestGrammarConstrainsTheOutput(t *testing.T) {
	const gbnf = `root ::= "{\"id\": " [1-9] [0-9]{0,2} ", \"ok\": " ("true" | "false") "}"`
	match := regexp.MustCompile(`^\{"id": [1-9][0-9]{0,2}, "ok": (true|false)\}$`)
	cfg := engine.SchedulerConfig{MaxNumSeqs: 4, MaxNumBatchedTokens: 256, BlockSize: 16, MaxModelLen: 512, EnablePrefixCaching: true}
	tok := newTokenizer(t, llamacpptest.Model(t))
	if err := tok.CheckGrammar(gbnf); err != nil {
		t.Fatal(err)
	}
	e := newExecutor(t, cfg)
	s := schedulerFor(t, e, cfg)
	prompt := []uint32{128000, 9906, 1917, 11, 420, 374, 264, 1296}
	seed := int64(7)
	params := map[string]engine.SamplingParams{
		"greedy":  {MaxTokens: 64, Grammar: gbnf},
		"sampled": {MaxTokens: 64, Grammar: gbnf, Temperature: 1, Seed: &seed},
		"top-k":   {MaxTokens: 64, Grammar: gbnf, Temperature: 0.8, TopK: 5, TopP: 0.9, Seed: &seed},
	}
	for id, sp := range params {
		if err := s.Add(engine.NewRequest{ID: id, Prompt: prompt, Sampling: sp}); err != nil {
			t.Fatal(err)
		}
	}
	out := run(t, s, e)
	eog := e.Ready().EogTokenIds
	for id := range params {
		got := out[id]
		if len(got) == 0 || !slices.Contains(eog, got[len(got)-1]) {
			t.Fatalf("%s did not end with an end token: %v", id, got)
		}
		if text := tok.Decode(got[:len(got)-1]); !match.MatchString(text) {
			t.Fatalf("%s: %q does not match the grammar", id, text)
		}
	}
	whole := out["sampled"]
	e2 := newExecutor(t, cfg)
	s2 := schedulerFor(t, e2, cfg)
	half := len(whole) / 2
	if err := s2.Add(engine.NewRequest{ID: "sampled", Prompt: prompt, Output: whole[:half], Sampling: params["sampled"]}); err != nil {
		t.Fatal(err)
	}
	if rest := run(t, s2, e2)["sampled"]; !slices.Equal(slices.Concat(whole[:half], rest), whole) {
		t.Fatalf("a constrained request moved:\n whole %v\nresumed %v + %v", whole, whole[:half], rest)
	}
}

// TestBadGrammarsAreRefusedByTheVocabularyWorker checks grammars where a
// request's would be checked, before admission: llama.cpp's parser says
// what is wrong, and the worker lives on.
func TestBadGrammarsAreRefusedByTheVocabularyWorker(t *testing.T) {
	tok := newTokenizer(t, llamacpptest.Model(t))
	for _, bad := range []string{
		`root ::= "unterminated`,
		`root ::= missing-rule`,
		`root ::= root "a"`,
		`other ::= "no root"`,
	} {
		if err := tok.CheckGrammar(bad); !errors.Is(err, engine.ErrBadGrammar) {
			t.Errorf("%q: %v, want ErrBadGrammar", bad, err)
		}
	}
	if err := tok.CheckGrammar(`root ::= [a-z]+`); err != nil {
		t.Fatalf("a good grammar after bad ones: %v", err)
	}
}

// TestPromptLogprobsBesideGreedyInTheGraph: a prompt's log-probabilities
// over several chunks (steps with many outputs of one sequence and no
// sampled row) while greedy requests decode with their argmax in the
// graph. llama.cpp's backend sampling takes one output a sequence, so the
// worker takes the graph's samplers off for those steps too; every
// figure and token is the host's.
func TestPromptLogprobsBesideGreedyInTheGraph(t *testing.T) {
	cfg := engine.SchedulerConfig{MaxNumSeqs: 4, MaxNumBatchedTokens: 256, BlockSize: 16, MaxModelLen: 512}
	long := make([]uint32, 3*engine.PromptLogprobsChunk+10)
	for i := range long {
		long[i] = uint32(800 + i*53%7000)
	}
	serve := func(where string) (map[string][]uint32, []*engine.TokenLogprobs) {
		e := newExecutorGreedy(t, cfg, where)
		if e.Ready().GreedyInGraph != (where == "on") {
			t.Fatalf("greedy in the graph with %s: %v", where, e.Ready().GreedyInGraph)
		}
		s := schedulerFor(t, e, cfg)
		for i := range 2 {
			p := []uint32{uint32(300 + i), 4000, uint32(77 + 9*i), 1200}
			if err := s.Add(engine.NewRequest{ID: fmt.Sprint(i), Prompt: p, Sampling: engine.SamplingParams{MaxTokens: 40, IgnoreEOS: true}}); err != nil {
				t.Fatal(err)
			}
		}
		out := map[string][]uint32{}
		var lps []*engine.TokenLogprobs
		sp := engine.SamplingParams{MaxTokens: 1, IgnoreEOS: true, PromptLogprobs: true, TopLogprobs: 1}
		added := false
		for s.HasWork() || !added {
			if !added && len(out["0"]) >= 3 {
				// The greedy ones are decoding in the graph by now.
				if err := s.Add(engine.NewRequest{ID: "echo", Prompt: long, Sampling: sp}); err != nil {
					t.Fatal(err)
				}
				added = true
			}
			step(t, s, e, func(o engine.Output) {
				out[o.ID] = append(out[o.ID], o.NewTokens...)
				lps = append(lps, o.PromptLogprobs...)
			})
		}
		return out, lps
	}
	got, gotLps := serve("on")
	want, wantLps := serve("off")
	if len(gotLps) != len(long)-1 || len(wantLps) != len(long)-1 {
		t.Fatalf("%d and %d prompt log-probabilities, want %d", len(gotLps), len(wantLps), len(long)-1)
	}
	for i := range gotLps {
		if math.Abs(float64(gotLps[i].Logprob-wantLps[i].Logprob)) > 1e-4 {
			t.Fatalf("prompt token %d: %v with greedy rows in the graph, %v on the host", i+1, gotLps[i].Logprob, wantLps[i].Logprob)
		}
	}
	for id, toks := range want {
		if !slices.Equal(got[id], toks) {
			t.Fatalf("request %s: %v with greedy rows in the graph, %v on the host", id, got[id], toks)
		}
	}
}

// TestPromptRanksOnlyWhenAsked: a prompt's log-probabilities come with
// each token's rank when the request asks for ranks (vLLM's
// prompt_logprobs) and without it otherwise (echo with logprobs, which
// reports none): the rank is a second pass over each row.
func TestPromptRanksOnlyWhenAsked(t *testing.T) {
	cfg := engine.SchedulerConfig{MaxNumSeqs: 4, MaxNumBatchedTokens: 256, BlockSize: 16, MaxModelLen: 512}
	e := newExecutor(t, cfg)
	s := schedulerFor(t, e, cfg)
	prompt := make([]uint32, 40)
	for i := range prompt {
		prompt[i] = uint32(500 + i*37%3000)
	}
	for _, id := range []string{"ranks", "plain"} {
		sp := engine.SamplingParams{MaxTokens: 1, IgnoreEOS: true, PromptLogprobs: true, TopLogprobs: 2, PromptRanks: id == "ranks"}
		if err := s.Add(engine.NewRequest{ID: id, Prompt: prompt, Sampling: sp}); err != nil {
			t.Fatal(err)
		}
	}
	got := map[string][]*engine.TokenLogprobs{}
	steps(t, s, e, func(o engine.Output) { got[o.ID] = append(got[o.ID], o.PromptLogprobs...) })
	ranked, plain := got["ranks"], got["plain"]
	if len(ranked) != len(prompt)-1 || len(plain) != len(prompt)-1 {
		t.Fatalf("%d and %d prompt log-probabilities, want %d each", len(ranked), len(plain), len(prompt)-1)
	}
	for i := range ranked {
		if ranked[i].Rank < 1 || plain[i].Rank != 0 || math.Abs(float64(ranked[i].Logprob-plain[i].Logprob)) > 1e-4 {
			t.Fatalf("token %d: rank %d asked, %d not asked; log-probabilities %v and %v", i+1, ranked[i].Rank, plain[i].Rank, ranked[i].Logprob, plain[i].Logprob)
		}
	}
}
