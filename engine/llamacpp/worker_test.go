package llamacpp

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/dpnode/dpnode/engine"
	"github.com/dpnode/dpnode/engine/gguf"
	dpnodev1 "github.com/dpnode/dpnode/proto/dpnode/v1"
)

// fakeWorkerEnv makes the test binary a stand-in worker: the process
// plumbing (socket pair, frames, deaths, restarts) is tested without
// llama.cpp, which only the tagged tests have.
const fakeWorkerEnv = "DPNODE_TEST_FAKE_WORKER"

func TestMain(m *testing.M) {
	if os.Getenv(fakeWorkerEnv) != "" {
		os.Exit(fakeWorker())
	}
	goleak.VerifyTestMain(m)
}

// fakeWorker answers as a worker of a model whose vocabulary is "w0" to
// "w99" and whose every sampled token is its sequence's id plus its
// position. A model path of "fail" fails the load; "die-on-step" dies at
// the first step, saying why on stderr; "hold-load:DIR" holds the load,
// while DIR/hold exists, until DIR/release does.
func fakeWorker() int {
	conn, err := net.FileConn(os.NewFile(3, "socket"))
	if err != nil {
		return 2
	}
	var path string
	for {
		req := &dpnodev1.WorkerRequest{}
		if err := ReadFrame(conn, req); err != nil {
			return 0
		}
		rep := &dpnodev1.WorkerReply{Id: req.Id}
		switch b := req.Body.(type) {
		case *dpnodev1.WorkerRequest_Load:
			path = b.Load.Path
			if dir, ok := strings.CutPrefix(path, "hold-load:"); ok {
				if _, err := os.Stat(filepath.Join(dir, "hold")); err == nil {
					waitForFile(filepath.Join(dir, "release"))
				}
			}
			if path == "fail" {
				rep.Body = &dpnodev1.WorkerReply_Error{Error: &dpnodev1.WorkerError{Message: "loading fail: unknown model architecture: 'martian'"}}
				_ = WriteFrame(conn, rep)
				return 1
			}
			rep.Body = &dpnodev1.WorkerReply_Ready{Ready: &dpnodev1.ModelReady{Architecture: "llama", ContextLength: 4096, VocabSize: 100,
				KvCells: 8192, Sequences: b.Load.Sequences, StreamCells: b.Load.StreamCells, MaxBatchTokens: b.Load.MaxBatchTokens, EogTokenIds: []uint32{98, 99}}}
		case *dpnodev1.WorkerRequest_Step:
			if path == "die-on-step" {
				fmt.Fprintln(os.Stderr, "GGML_ASSERT failed: boom")
				return 3
			}
			done := &dpnodev1.StepDone{}
			for _, s := range b.Step.Sequences {
				done.ComputedTokens += uint32(max(len(s.Tokens), 1))
				if s.Sample != nil {
					done.Tokens = append(done.Tokens, uint32(s.Seq)+uint32(s.Pos))
				}
			}
			rep.Body = &dpnodev1.WorkerReply_Step{Step: done}
		case *dpnodev1.WorkerRequest_Tokenize:
			var ids []uint32
			for _, w := range strings.Fields(b.Tokenize.Text) {
				var id uint32
				fmt.Sscanf(w, "w%d", &id)
				ids = append(ids, id)
			}
			rep.Body = &dpnodev1.WorkerReply_Tokens{Tokens: &dpnodev1.TokenIds{Ids: ids}}
		case *dpnodev1.WorkerRequest_CheckGrammar:
			// "wait-for:PATH" holds the worker until PATH exists.
			if file, ok := strings.CutPrefix(b.CheckGrammar.Gbnf, "wait-for:"); ok {
				waitForFile(file)
			}
		case *dpnodev1.WorkerRequest_Vocabulary:
			v := &dpnodev1.Vocabulary{}
			for i := range 100 {
				v.Offsets = append(v.Offsets, uint32(len(v.Pieces)))
				v.Pieces = append(v.Pieces, fmt.Sprintf(" w%d", i)...)
			}
			v.Offsets = append(v.Offsets, uint32(len(v.Pieces)))
			rep.Body = &dpnodev1.WorkerReply_Vocabulary{Vocabulary: v}
		}
		if err := WriteFrame(conn, rep); err != nil {
			return 0
		}
	}
}

func fakeConfig(t *testing.T) WorkerConfig {
	t.Setenv(fakeWorkerEnv, "1")
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return WorkerConfig{Binary: exe, Logger: slog.New(slog.DiscardHandler)}
}

var testScheduler = engine.SchedulerConfig{MaxNumSeqs: 4, MaxNumBatchedTokens: 64, BlockSize: 16, MaxModelLen: 256}

func TestExecutorSpeaksToItsWorker(t *testing.T) {
	e, err := NewExecutor(context.Background(), ExecutorConfig{Worker: fakeConfig(t), Model: "m.gguf", Scheduler: testScheduler, KVCacheDtype: "f32"})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if l := e.Limits(); l.NumBlocks != 8192/16 || l.SequenceSlots != 4 || l.MaxModelLen != 4096 || !slices.Equal(l.EOSTokenIDs, []uint32{98, 99}) {
		t.Fatalf("limits %+v", l)
	}
	seed := int64(7)
	b := &engine.Batch{
		SeqOps: []engine.SeqOp{{Kind: engine.SeqCopy, Src: 1, Dst: 2, P0: 0, P1: 16}, {Kind: engine.SeqRemove, Dst: 3, P0: 0, P1: -1}},
		Requests: []engine.ScheduledRequest{
			{ID: "a", Seq: 2, NumComputed: 16, NumNewTokens: 3, Tokens: []uint32{5, 6, 7}, SampleIndex: 0, Sampling: &engine.SamplingParams{MinTokens: 2, StopTokenIDs: []uint32{50}}},
			{ID: "b", Seq: 0, NumComputed: 0, NumNewTokens: 8, Tokens: make([]uint32, 8), SampleIndex: -1, Sampling: &engine.SamplingParams{}},
			{ID: "c", Seq: 1, NumComputed: 40, NumNewTokens: 1, SampleIndex: 3, Sampling: &engine.SamplingParams{Seed: &seed}},
		},
	}
	res, err := e.Execute(context.Background(), b)
	if err != nil {
		t.Fatal(err)
	}
	// Sampled tokens come back to the requests that sampled; the chunk
	// of b samples nothing.
	if !slices.Equal(res.Tokens, []uint32{2 + 16, 0, 1 + 40}) || res.ComputedTokens != 3+8+1 {
		t.Fatalf("result %+v", res)
	}
	// Before min_tokens the end tokens and the stop tokens are banned.
	p := e.sampleParams(&b.Requests[0])
	if !slices.Equal(p.BannedTokenIds, []uint32{98, 99, 50}) {
		t.Fatalf("banned %v", p.BannedTokenIds)
	}
	if q := e.sampleParams(&b.Requests[2]); q.BannedTokenIds != nil || q.Seed != SampleSeed(7, 3) {
		t.Fatalf("sampling of c: %+v", q)
	}
	// A top_k past int32 keeps every token; it does not wrap to 1.
	huge := b.Requests[2]
	huge.Sampling = &engine.SamplingParams{TopK: 1<<32 + 1}
	if q := e.sampleParams(&huge); q.TopK != math.MaxInt32 {
		t.Fatalf("top_k %d went to the worker as %d", huge.Sampling.TopK, q.TopK)
	}
}

// TestSampleSeedsFollowTheRequest checks what makes sampling continue
// exactly after a move: the seed is a function of the request's seed (or
// its id) and the index, and nothing else.
func TestSampleSeedsFollowTheRequest(t *testing.T) {
	e := &Executor{ready: &dpnodev1.ModelReady{}}
	seen := map[uint64]bool{}
	for i := range 1000 {
		r := engine.ScheduledRequest{ID: "req-1", SampleIndex: i, Sampling: &engine.SamplingParams{}}
		s := e.sampleParams(&r).Seed
		if seen[s] {
			t.Fatalf("index %d repeats a seed", i)
		}
		seen[s] = true
		r2 := engine.ScheduledRequest{ID: "req-1", SampleIndex: i, Sampling: &engine.SamplingParams{}, Seq: 7, NumComputed: 99}
		if e.sampleParams(&r2).Seed != s {
			t.Fatal("the seed depends on where the request runs")
		}
	}
	a := e.sampleParams(&engine.ScheduledRequest{ID: "req-2", SampleIndex: 0, Sampling: &engine.SamplingParams{}}).Seed
	if seen[a] {
		t.Fatal("two requests without seeds share a seed")
	}
}

func TestWorkerDeathsAreNoticedAndExplained(t *testing.T) {
	cfg := fakeConfig(t)
	_, err := NewExecutor(context.Background(), ExecutorConfig{Worker: cfg, Model: "fail", Scheduler: testScheduler})
	if err == nil || !strings.Contains(err.Error(), "unknown model architecture: 'martian'") {
		t.Fatalf("a failed load: %v", err)
	}

	e, err := NewExecutor(context.Background(), ExecutorConfig{Worker: cfg, Model: "die-on-step", Scheduler: testScheduler})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	_, err = e.Execute(context.Background(), &engine.Batch{Requests: []engine.ScheduledRequest{{ID: "x", Seq: 0, NumNewTokens: 1, Tokens: []uint32{1}, SampleIndex: -1}}})
	if err == nil || !strings.Contains(err.Error(), "exit status 3") || !strings.Contains(err.Error(), "GGML_ASSERT failed: boom") {
		t.Fatalf("a worker that died in a step: %v", err)
	}
	select {
	case <-e.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("Done was not closed")
	}

	e2, err := NewExecutor(context.Background(), ExecutorConfig{Worker: cfg, Model: "m.gguf", Scheduler: testScheduler})
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(e2.Pid(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case <-e2.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("an idle worker's death went unnoticed")
	}
	if err := e2.Err(); err == nil || !strings.Contains(err.Error(), "killed") {
		t.Fatalf("a killed worker: %v", err)
	}
	e2.Close()

	// Close kills a live worker and waits for it.
	e3, err := NewExecutor(context.Background(), ExecutorConfig{Worker: cfg, Model: "m.gguf", Scheduler: testScheduler})
	if err != nil {
		t.Fatal(err)
	}
	pid := e3.Pid()
	e3.Close()
	if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Fatalf("after Close the worker is still there: %v", err)
	}
}

// waitForFile returns once file exists.
func waitForFile(file string) {
	for {
		if _, err := os.Stat(file); err == nil {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestSlowWorkerStartIsNoBadGrammar: a grammar's check that has to start
// its worker first has its whole time once the worker runs. Before, the
// start counted against the grammar: on a busy machine a worker that took
// seconds to load its vocabulary made a good grammar a 400, "llama.cpp
// took more than 5s to parse it".
func TestSlowWorkerStartIsNoBadGrammar(t *testing.T) {
	dir := t.TempDir()
	tok, err := NewTokenizer(context.Background(), fakeConfig(t), "hold-load:"+dir, TokenizerConfig{Workers: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer tok.Close()
	tok.grammarTimeout = 100 * time.Millisecond
	if err := os.WriteFile(filepath.Join(dir, "hold"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(tok.Pid(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// The next worker's load ends well after the grammar's timeout.
	release := time.AfterFunc(5*tok.grammarTimeout, func() { _ = os.WriteFile(filepath.Join(dir, "release"), nil, 0o600) })
	defer release.Stop()
	if err := tok.CheckGrammar("root ::= \"a\""); err != nil {
		t.Fatalf("a good grammar whose worker started slowly: %v", err)
	}
}

func TestTokenizerRestartsItsWorker(t *testing.T) {
	tok, err := NewTokenizer(context.Background(), fakeConfig(t), "m.gguf", TokenizerConfig{Workers: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer tok.Close()
	ids, err := tok.Encode("w3 w14 w15", false)
	if err != nil || !slices.Equal(ids, []uint32{3, 14, 15}) {
		t.Fatalf("encode: %v %v", ids, err)
	}
	if got := tok.Decode([]uint32{3, 14, 200}); got != " w3 w14" {
		t.Fatalf("decode %q (an id past the vocabulary decodes to nothing)", got)
	}
	pid := tok.Pid()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if ids, err := tok.Encode("w9", false); err != nil || !slices.Equal(ids, []uint32{9}) || tok.Pid() == pid {
		t.Fatalf("after its worker was killed: %v %v", ids, err)
	}
}

// TestTokenizerQueueIsBounded: with every worker of the pool busy, a
// call waits for one, however long, and then has its whole timeout; a
// call that would make the text waiting pass the queue's bound is refused
// at once as busy, not failed as a tokenizer that is down.
func TestTokenizerQueueIsBounded(t *testing.T) {
	tok, err := NewTokenizer(context.Background(), fakeConfig(t), "m.gguf", TokenizerConfig{Workers: 2, QueueBytes: 1000})
	if err != nil {
		t.Fatal(err)
	}
	defer tok.Close()
	tok.timeout = 500 * time.Millisecond
	release := filepath.Join(t.TempDir(), "release")
	held := make(chan error, 2)
	for range 2 {
		go func() { held <- tok.CheckGrammar("wait-for:" + release) }()
	}
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("not within 10s: %s", what)
			}
		}
	}
	waitFor("both workers held", func() bool { return len(tok.free) == 0 })
	type result struct {
		ids []uint32
		err error
	}
	queued := make(chan result, 1)
	go func() {
		ids, err := tok.Encode("w1 w2", false)
		queued <- result{ids, err}
	}()
	waitFor("the call queued", func() bool { return tok.queued.Load() == int64(2*len("wait-for:"+release)+len("w1 w2")) })
	if _, err := tok.Encode(strings.Repeat("w7 ", 300), false); !errors.Is(err, engine.ErrTokenizerBusy) || errors.Is(err, ErrTokenizerDown) {
		t.Fatalf("a call past the queue's bound: %v; want busy", err)
	}
	// The queued call waits longer than its timeout, which has not started.
	time.Sleep(3 * tok.timeout)
	if err := os.WriteFile(release, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := <-held; err != nil {
			t.Fatalf("a held call: %v", err)
		}
	}
	if r := <-queued; r.err != nil || !slices.Equal(r.ids, []uint32{1, 2}) {
		t.Fatalf("the queued call: %v %v", r.ids, r.err)
	}
	if n := tok.queued.Load(); n != 0 {
		t.Fatalf("%d bytes still count as queued", n)
	}
}

func TestFindWorkerSaysHowToInstallIt(t *testing.T) {
	t.Setenv(WorkerEnv, "")
	t.Chdir(t.TempDir())
	_, err := FindWorker()
	if !errors.Is(err, ErrNotInstalled) || !strings.Contains(err.Error(), "make llamacpp") {
		t.Fatalf("no worker: %v", err)
	}
	t.Setenv(WorkerEnv, "/nonexistent/worker")
	if _, err := FindWorker(); !errors.Is(err, ErrNotInstalled) || !strings.Contains(err.Error(), "/nonexistent/worker") {
		t.Fatalf("a worker that is not there: %v", err)
	}
}

func TestFramesRoundTripAndRefuseOversize(t *testing.T) {
	var buf bytes.Buffer
	want := &dpnodev1.WorkerRequest{Id: 9, Body: &dpnodev1.WorkerRequest_Tokenize{Tokenize: &dpnodev1.TokenizeText{Text: "héllo", AddSpecial: true}}}
	if err := WriteFrame(&buf, want); err != nil {
		t.Fatal(err)
	}
	got := &dpnodev1.WorkerRequest{}
	if err := ReadFrame(&buf, got); err != nil || got.GetTokenize().GetText() != "héllo" || got.Id != 9 {
		t.Fatalf("read back %v %v", got, err)
	}
	if err := ReadFrame(&buf, got); !errors.Is(err, io.EOF) {
		t.Fatalf("at the end: %v", err)
	}
	if err := ReadFrame(bytes.NewReader([]byte{0xff, 0xff, 0xff, 0x7f}), got); err == nil || !strings.Contains(err.Error(), "limit") {
		t.Fatalf("an oversized frame: %v", err)
	}
	if err := ReadFrame(bytes.NewReader([]byte{9, 0, 0, 0, 1}), got); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("a cut frame: %v", err)
	}
}

// TestTestModelIsWhatLlamaCppReads writes a test model over a small
// vocabulary and reads its header back: the Llama keys llama.cpp needs,
// the tokenizer copied whole, and every tensor of the architecture.
func TestTestModelIsWhatLlamaCppReads(t *testing.T) {
	dir := t.TempDir()
	var tokens []gguf.Value
	for i := range 300 {
		tokens = append(tokens, fmt.Sprintf("t%d", i))
	}
	vocab := filepath.Join(dir, "vocab.gguf")
	f, err := os.Create(vocab)
	if err != nil {
		t.Fatal(err)
	}
	if err := gguf.Write(f, []gguf.KV{
		{Key: "general.architecture", Value: "llama"},
		{Key: "tokenizer.ggml.model", Value: "gpt2"},
		{Key: "tokenizer.ggml.tokens", Value: &gguf.Array{Elem: gguf.TypeString, Values: tokens}},
		{Key: "tokenizer.ggml.bos_token_id", Value: uint32(1)},
		{Key: "tokenizer.ggml.eos_token_id", Value: uint32(2)},
	}, nil); err != nil {
		t.Fatal(err)
	}
	f.Close()
	cfg := DefaultTestModel()
	cfg.Vocab, cfg.ChatTemplate, cfg.ContextLength = vocab, "{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}", 2048
	var a, b bytes.Buffer
	if err := WriteTestModel(&a, cfg); err != nil {
		t.Fatal(err)
	}
	if err := WriteTestModel(&b, cfg); err != nil || !bytes.Equal(a.Bytes(), b.Bytes()) {
		t.Fatal("the same seed wrote different files")
	}
	path := filepath.Join(dir, "model.gguf")
	if err := os.WriteFile(path, a.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	info, err := InspectModel(path)
	if err != nil {
		t.Fatal(err)
	}
	if info.Architecture != "llama" || info.ContextLength != 2048 || info.VocabSize != 300 || !info.F32 ||
		info.BOSToken != "t1" || info.EOSToken != "t2" || info.ChatTemplate != cfg.ChatTemplate {
		t.Fatalf("inspected %+v", info)
	}
	g, err := gguf.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"token_embd.weight", "output.weight", "output_norm.weight", "blk.1.attn_q.weight", "blk.1.ffn_down.weight"} {
		if _, ok := g.Tensor(name); !ok {
			t.Fatalf("no tensor %s", name)
		}
	}
	if k, _ := g.Tensor("blk.0.attn_k.weight"); !slices.Equal(k.Dims, []uint64{64, 32}) {
		t.Fatalf("attn_k dims %v (64 wide, 2 KV heads of 16)", k.Dims)
	}
}

// TestWorkerLogSaysTheLoadAtInfo: of the worker's log, its load progress
// and llama.cpp's count of offloaded layers are the node's info lines;
// the rest stays at debug, and only that is kept for errors.
func TestWorkerLogSaysTheLoadAtInfo(t *testing.T) {
	var out bytes.Buffer
	w := &Worker{log: slog.New(slog.NewTextHandler(&out, nil))}
	done := make(chan struct{})
	w.readLog(strings.NewReader("dpnode-load-progress 40\nload_tensors: offloaded 29/29 layers to GPU\nllama_context: n_ctx = 4096\n"), done)
	<-done
	got := out.String()
	for _, want := range []string{`level=INFO msg="loading the model" progress=40%`, `level=INFO msg="layers offloaded to the GPU" layers=29 of=29`} {
		if !strings.Contains(got, want) {
			t.Errorf("log %q lacks %q", got, want)
		}
	}
	if strings.Contains(got, "n_ctx") {
		t.Errorf("log %q: llama.cpp's other lines are for debug", got)
	}
	if len(w.tail) != 2 || strings.Contains(strings.Join(w.tail, "\n"), "dpnode-load-progress") {
		t.Errorf("kept for errors: %q; want llama.cpp's two lines", w.tail)
	}
}
