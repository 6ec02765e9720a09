//go:build llamacpp

package llamacpp_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dpnode/dpnode/engine"
	"github.com/dpnode/dpnode/engine/llamacpp"
	"github.com/dpnode/dpnode/engine/llamacpp/llamacpptest"
)

// These benchmarks drive a worker step by step with batches made by hand,
// on the benchmark model (llamacpptest.BenchModel) with an F16 KV cache,
// as the engine's goals in docs/BENCHMARKS.md state them:
//
//	make llamacpp && DPNODE_LLAMACPP_SRC=.llamacpp/src go test -tags llamacpp \
//	  -run '^$' -bench 'Prefill|HostCost' -benchtime 20x ./engine/llamacpp/

func benchExecutor(b *testing.B, maxSeqs, threads int) *llamacpp.Executor {
	return benchExecutorGreedy(b, maxSeqs, threads, "auto")
}

// benchExecutorGreedy starts it with greedy rows sampled in the graph
// ("on"), on the host ("off"), or where the worker chooses ("auto").
func benchExecutorGreedy(b *testing.B, maxSeqs, threads int, greedyInGraph string) *llamacpp.Executor {
	return benchExecutorKV(b, maxSeqs, threads, greedyInGraph, 1<<30)
}

// benchExecutorKV starts it with kvBytes of KV cache.
func benchExecutorKV(b *testing.B, maxSeqs, threads int, greedyInGraph string, kvBytes uint64) *llamacpp.Executor {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cfg := engine.SchedulerConfig{MaxNumSeqs: maxSeqs, MaxNumBatchedTokens: 2048, BlockSize: 16, MaxModelLen: 4096}
	e, err := llamacpp.NewExecutor(ctx, llamacpp.ExecutorConfig{
		Worker: llamacpp.WorkerConfig{Binary: llamacpptest.Worker(b), Logger: slog.New(slog.DiscardHandler)},
		Model:  llamacpptest.BenchModel(b), KVCacheBytes: kvBytes, Scheduler: cfg, Threads: threads, KVCacheDtype: "f16",
		GreedyInGraph: greedyInGraph})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { e.Close() })
	return e
}

func randomTokens(rng *rand.Rand, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32(1000 + rng.IntN(100000))
	}
	return out
}

func execute(b *testing.B, e *llamacpp.Executor, batch *engine.Batch) engine.StepResult {
	b.Helper()
	res, err := e.Execute(context.Background(), batch)
	if err != nil {
		b.Fatal(err)
	}
	return res
}

// fill computes n tokens of history into each of seqs, one chunk of at
// most 2,048 tokens a step, sampling nothing.
func fill(b *testing.B, e *llamacpp.Executor, rng *rand.Rand, seqs []int32, n int) {
	b.Helper()
	for _, seq := range seqs {
		for pos := 0; pos < n; pos += 2048 {
			k := min(2048, n-pos)
			execute(b, e, &engine.Batch{Requests: []engine.ScheduledRequest{{Seq: seq, NumComputed: pos, NumNewTokens: k,
				Tokens: randomTokens(rng, k), SampleIndex: -1, Sampling: &engine.SamplingParams{}}}})
		}
	}
}

// BenchmarkPrefillBesideHeldSequences times a step that prefills a
// 2,048-token chunk of a new sequence (and samples its next token), with
// nothing else in the KV cache, and with 24 other sequences holding 1,000
// tokens each that are not in the step. A layout whose cost follows each
// sequence's own length makes the two the same.
func BenchmarkPrefillBesideHeldSequences(b *testing.B) {
	for _, held := range []int{0, 24} {
		b.Run(fmt.Sprintf("held=%d", held), func(b *testing.B) {
			e := benchExecutor(b, 32, 1)
			rng := rand.New(rand.NewPCG(1, 2))
			var seqs []int32
			for s := range held {
				seqs = append(seqs, int32(s))
			}
			fill(b, e, rng, seqs, 1000)
			chunk := randomTokens(rng, 2048)
			seq := int32(held)
			var model time.Duration
			b.ResetTimer()
			for i := range b.N {
				batch := &engine.Batch{Requests: []engine.ScheduledRequest{{ID: "new", Seq: seq, NumNewTokens: len(chunk), Tokens: chunk,
					SampleIndex: 0, Sampling: &engine.SamplingParams{}}}}
				if i > 0 {
					batch.SeqOps = []engine.SeqOp{{Kind: engine.SeqRemove, Dst: seq, P0: 0, P1: -1}}
				}
				model += execute(b, e, batch).Phases.Model
			}
			b.ReportMetric(float64(model.Microseconds())/1000/float64(b.N), "decode-ms/op")
		})
	}
}

// BenchmarkPrefillBySequenceCount times a step that prefills 800 tokens
// of a new sequence, with nothing else in the KV cache, in a context made
// for 16 sequences (a node with --max-num-seqs 16 and no prefix cache) and
// for 256 (the same node with its prefix cache: the streams past the
// running ones keep prefixes), on 2 GiB of KV. Nothing else differs: the
// difference is what llama.cpp's sequence count costs a step. It reports
// the worker's CPU time per step besides the model's wall time, which a
// shared machine moves more.
func BenchmarkPrefillBySequenceCount(b *testing.B) {
	const prompt = 800
	for _, seqs := range []int{16, 256} {
		b.Run(fmt.Sprintf("sequences=%d", seqs), func(b *testing.B) {
			e := benchExecutorKV(b, seqs, 1, "auto", 2<<30)
			rng := rand.New(rand.NewPCG(7, 8))
			step := func() time.Duration {
				return execute(b, e, &engine.Batch{SeqOps: []engine.SeqOp{{Kind: engine.SeqRemove, Dst: 0, P0: 0, P1: -1}},
					Requests: []engine.ScheduledRequest{{ID: "p", Seq: 0, NumNewTokens: prompt, Tokens: randomTokens(rng, prompt),
						SampleIndex: 0, Sampling: &engine.SamplingParams{}}}}).Phases.Model
			}
			// The first steps allocate what later ones reuse.
			step()
			step()
			var model time.Duration
			cpu := workerCPU(b, e.Pid())
			b.ResetTimer()
			for range b.N {
				model += step()
			}
			cpu = workerCPU(b, e.Pid()) - cpu
			b.ReportMetric(float64(model.Microseconds())/1000/float64(b.N), "model-ms/step")
			b.ReportMetric(float64(cpu.Microseconds())/1000/float64(b.N), "worker-cpu-ms/step")
		})
	}
}

// BenchmarkKeptSaveAndRestore times the prefix cache's moves on a node
// with it: a running sequence of 1,000 tokens saved to a kept slot in host
// memory (what a finished request's KV takes), and a kept slot restored
// into a running sequence (a hit), each a step of its own with nothing to
// compute. Eight slots take turns, so their memory is reused, as it is
// once a rank has kept as many prefixes as it has slots.
func BenchmarkKeptSaveAndRestore(b *testing.B) {
	const maxRunning, slots = 16, 8
	cfg := engine.SchedulerConfig{MaxNumSeqs: maxRunning, MaxNumBatchedTokens: 2048, BlockSize: 16, MaxModelLen: 4096, EnablePrefixCaching: true}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	e, err := llamacpp.NewExecutor(ctx, llamacpp.ExecutorConfig{
		Worker: llamacpp.WorkerConfig{Binary: llamacpptest.Worker(b), Logger: slog.New(slog.DiscardHandler)},
		Model:  llamacpptest.BenchModel(b), KVCacheBytes: 2 << 30, Scheduler: cfg, Threads: 1, KVCacheDtype: "f16"})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { e.Close() })
	if n := e.Limits().SequenceSlots; n < maxRunning+slots {
		b.Fatalf("%d sequence slots, want at least %d", n, maxRunning+slots)
	}
	fill(b, e, rand.New(rand.NewPCG(9, 10)), []int32{0}, 1000)
	kvOps := func(op engine.SeqOp) time.Duration {
		return execute(b, e, &engine.Batch{SeqOps: []engine.SeqOp{op}}).Phases.KVOps
	}
	for i := range slots {
		kvOps(engine.SeqOp{Kind: engine.SeqCopy, Src: 0, Dst: int32(maxRunning + i), P0: -1, P1: -1})
	}
	var save, restore time.Duration
	b.ResetTimer()
	for i := range b.N {
		slot := int32(maxRunning + i%slots)
		save += kvOps(engine.SeqOp{Kind: engine.SeqCopy, Src: 0, Dst: slot, P0: -1, P1: -1})
		restore += kvOps(engine.SeqOp{Kind: engine.SeqCopy, Src: slot, Dst: 1, P0: -1, P1: -1})
	}
	b.ReportMetric(float64(save.Microseconds())/1000/float64(b.N), "save-ms")
	b.ReportMetric(float64(restore.Microseconds())/1000/float64(b.N), "restore-ms")
}

// workerCPU is the CPU time process pid has used, user and system, from
// /proc (in clock ticks of 10 ms, Linux's USER_HZ).
func workerCPU(b *testing.B, pid int) time.Duration {
	b.Helper()
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Fatal(err)
	}
	// The fields after the command, which may hold spaces, in brackets:
	// state is the first, utime the 12th and stime the 13th.
	f := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
	if len(f) < 13 {
		b.Fatalf("/proc/%d/stat has %d fields after the command", pid, len(f))
	}
	var ticks int64
	for _, v := range f[11:13] {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			b.Fatal(err)
		}
		ticks += n
	}
	return time.Duration(ticks) * 10 * time.Millisecond
}

// BenchmarkHostCostPerRow times decode steps of 64 sequences that each
// sample a token, greedy or at temperature 1, and reports the worker's
// time on the step outside llama_decode per sampled row: with a
// 128,256-token vocabulary, sampling dominates it. "graph" runs greedy
// rows' argmax in llama.cpp's graph (what a GPU rank does by default),
// which moves their cost into the decode: compare decode-ms/step too.
func BenchmarkHostCostPerRow(b *testing.B) {
	const rows, history = 64, 16
	for _, threads := range []int{1, 2} {
		for _, mode := range []struct {
			name  string
			temp  float32
			graph string
		}{{"temperature=0", 0, "off"}, {"temperature=0/graph", 0, "on"}, {"temperature=1", 1, "off"}} {
			temp := mode.temp
			b.Run(fmt.Sprintf("threads=%d/%s", threads, mode.name), func(b *testing.B) {
				e := benchExecutorGreedy(b, rows, threads, mode.graph)
				rng := rand.New(rand.NewPCG(3, 4))
				seed := int64(7)
				sp := &engine.SamplingParams{Temperature: temp, Seed: &seed}
				// The first step computes each sequence's history and
				// samples its first token; each step after it decodes
				// the token sampled last.
				start := &engine.Batch{}
				decode := &engine.Batch{}
				for s := range rows {
					start.Requests = append(start.Requests, engine.ScheduledRequest{ID: fmt.Sprint(s), Seq: int32(s), NumNewTokens: history,
						Tokens: randomTokens(rng, history), SampleIndex: 0, Sampling: sp})
					decode.Requests = append(decode.Requests, engine.ScheduledRequest{ID: fmt.Sprint(s), Seq: int32(s), NumComputed: history,
						NumNewTokens: 1, SampleIndex: 1, Decode: true, Sampling: sp})
				}
				execute(b, e, start)
				var host, sample, model time.Duration
				b.ResetTimer()
				for range b.N {
					res := execute(b, e, decode)
					host += res.Duration - res.Phases.Model
					sample += res.Phases.Sample
					model += res.Phases.Model
					b.StopTimer()
					for i := range decode.Requests {
						r := &decode.Requests[i]
						r.NumComputed++
						r.SampleIndex++
						if r.NumComputed >= 4000 {
							b.Fatal("more steps than a sequence holds; use a smaller -benchtime")
						}
					}
					b.StartTimer()
				}
				b.ReportMetric(float64(host.Nanoseconds())/1000/float64(b.N*rows), "host-us/row")
				b.ReportMetric(float64(sample.Nanoseconds())/1000/float64(b.N*rows), "sample-us/row")
				b.ReportMetric(float64(model.Microseconds())/1000/float64(b.N), "decode-ms/step")
			})
		}
	}
}

// BenchmarkStreamCopy times a step that copies a sequence's whole stream
// (1,000 tokens of history) into another before computing one token of
// the copy: what a prefix hit on another request's stream costs.
func BenchmarkStreamCopy(b *testing.B) {
	e := benchExecutor(b, 32, 1)
	rng := rand.New(rand.NewPCG(5, 6))
	fill(b, e, rng, []int32{0}, 1000)
	var model, ops time.Duration
	b.ResetTimer()
	for range b.N {
		res := execute(b, e, &engine.Batch{
			SeqOps: []engine.SeqOp{{Kind: engine.SeqCopy, Src: 0, Dst: 1, P0: -1, P1: -1}, {Kind: engine.SeqRemove, Dst: 1, P0: 992, P1: -1}},
			Requests: []engine.ScheduledRequest{{ID: "hit", Seq: 1, NumComputed: 992, NumNewTokens: 1, Tokens: randomTokens(rng, 1),
				SampleIndex: 0, Sampling: &engine.SamplingParams{}}}})
		model += res.Phases.Model
		ops += res.Phases.KVOps
	}
	b.ReportMetric(float64(model.Microseconds())/1000/float64(b.N), "decode-ms/op")
	b.ReportMetric(float64(ops.Microseconds())/1000/float64(b.N), "ops-ms/op")
}

// BenchmarkCopiesInAStep times a one-token decode step that also copies
// 0, 1 or 4 streams of 1,000 tokens to empty ones: what copying finished
// requests to kept streams adds to the step after they finish.
func BenchmarkCopiesInAStep(b *testing.B) {
	for _, copies := range []int{0, 1, 4} {
		b.Run(fmt.Sprintf("copies=%d", copies), func(b *testing.B) {
			e := benchExecutor(b, 32, 1)
			rng := rand.New(rand.NewPCG(5, 6))
			fill(b, e, rng, []int32{0, 1, 2, 3}, 1000)
			var model time.Duration
			b.ResetTimer()
			for range b.N {
				var ops []engine.SeqOp
				for c := range copies {
					ops = append(ops, engine.SeqOp{Kind: engine.SeqCopy, Src: int32(c), Dst: int32(8 + c), P0: -1, P1: -1})
				}
				res := execute(b, e, &engine.Batch{SeqOps: ops, Requests: []engine.ScheduledRequest{{ID: "d", Seq: 0,
					NumComputed: 1000, NumNewTokens: 1, Tokens: randomTokens(rng, 1), SampleIndex: 0, Sampling: &engine.SamplingParams{}}}})
				model += res.Phases.Model
				// Take the token out again: every step decodes at position 1,000.
				execute(b, e, &engine.Batch{SeqOps: []engine.SeqOp{{Kind: engine.SeqRemove, Dst: 0, P0: 1000, P1: -1}}})
			}
			b.ReportMetric(float64(model.Microseconds())/1000/float64(b.N), "decode-ms/step")
		})
	}
}
