// Package llamacpp is the llama.cpp engine's side in dpnode: it starts a
// rank's model worker (a process of its own, cmd/dpnode-llama-worker, that
// holds the model and its KV cache), speaks to it over a socket pair, and
// implements engine.Executor and engine.Tokenizer on top of it. The engine's
// scheduler decides every step; the worker computes it.
//
// Nothing here links llama.cpp: dpnode builds and runs without it, and the
// worker, built with the llamacpp tag, is found at run time (FindWorker).
package llamacpp

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"slices"
	"sync/atomic"
	"time"

	"github.com/dpnode/dpnode/engine"
	dpnodev1 "github.com/dpnode/dpnode/proto/dpnode/v1"
)

// ExecutorConfig starts one rank's executor.
type ExecutorConfig struct {
	Worker WorkerConfig
	// Model is the GGUF file.
	Model string
	// KVCacheBytes is the KV cache's memory budget.
	KVCacheBytes uint64
	// Scheduler is the engine's configuration: its step budget, sequence
	// count and context length size the worker's context.
	Scheduler engine.SchedulerConfig
	// Threads computes on this many CPU threads.
	Threads int
	// GPULayers offloads this many layers (-1: all) to the worker's GPU.
	GPULayers int
	// KVCacheDtype is the KV cache's element type, "f16" or "f32"; with
	// f32 the worker also leaves flash attention off (see LoadModel).
	KVCacheDtype string
	// GreedyInGraph is where greedy rows are sampled: "auto" or "" (in
	// llama.cpp's graph when the model runs on a GPU), "on" (in the graph,
	// on a CPU by dpnode's op) or "off".
	GreedyInGraph string
}

// Executor runs a rank's steps in its model worker.
type Executor struct {
	w      *Worker
	ready  *dpnodev1.ModelReady
	limits engine.Limits
	// gapTokens counts the tokens the worker put between the steps'
	// streams so that llama.cpp computed each step in fewer passes.
	gapTokens atomic.Uint64
	// histories says, per sequence, whose penalty history the worker
	// holds there and which output it draws next: a request that samples
	// anything else is sent its history again. Execute's alone.
	histories map[int32]historyMark
}

// historyMark is the request whose history a worker's sequence holds,
// and the index of the output it draws next.
type historyMark struct {
	id   string
	next int
}

// GapTokens is how many tokens the worker has put in streams between the
// steps' sequences (and taken out after), to compute steps in fewer
// passes.
func (e *Executor) GapTokens() uint64 { return e.gapTokens.Load() }

var (
	_ engine.Executor = (*Executor)(nil)
	_ engine.Limited  = (*Executor)(nil)
	_ engine.Process  = (*Executor)(nil)
)

// MaxSequences is llama.cpp's limit on sequence ids (LLAMA_MAX_SEQ).
const MaxSequences = 256

// NewExecutor starts a worker and loads the model; it returns once the
// model is loaded.
func NewExecutor(ctx context.Context, cfg ExecutorConfig) (*Executor, error) {
	sc := cfg.Scheduler
	// A stream per running sequence and, with the prefix cache, as many
	// more as the KV memory holds: each keeps a finished request's KV for
	// the prefix cache until its stream is needed.
	var greedy dpnodev1.GreedyInGraph
	switch cfg.GreedyInGraph {
	case "", "auto":
	case "on":
		greedy = dpnodev1.GreedyInGraph_GREEDY_IN_GRAPH_ON
	case "off":
		greedy = dpnodev1.GreedyInGraph_GREEDY_IN_GRAPH_OFF
	default:
		return nil, fmt.Errorf("llamacpp: greedy sampling in the graph must be auto, on or off, not %q", cfg.GreedyInGraph)
	}
	// With the prefix cache, the streams past the running requests keep
	// prefixes; they are kept in host memory rather than in llama.cpp's
	// context, whose every step costs more the more sequences it is made
	// for (docs/BENCHMARKS.md, section d).
	seqs, inContext := min(MaxSequences, max(sc.MaxNumSeqs, 1)), 0
	if sc.EnablePrefixCaching {
		seqs, inContext = MaxSequences, seqs
	}
	load := &dpnodev1.LoadModel{
		Path:             cfg.Model,
		KvCacheBytes:     cfg.KVCacheBytes,
		StreamCells:      uint32(sc.MaxModelLen),
		MaxBatchTokens:   uint32(sc.MaxNumBatchedTokens),
		Sequences:        uint32(seqs),
		ContextSequences: uint32(inContext),
		Threads:          int32(cfg.Threads),
		GpuLayers:        int32(cfg.GPULayers),
		KvCacheDtype:     cfg.KVCacheDtype,
		FlashAttention:   cfg.KVCacheDtype != "f32",
		GreedyInGraph:    greedy,
	}
	w, ready, err := StartWorker(ctx, cfg.Worker, load)
	if err != nil {
		return nil, err
	}
	// A KV cache smaller than the step budget (llama.cpp's batch cannot
	// exceed its cells) makes the steps smaller.
	e := &Executor{w: w, ready: ready, limits: engine.Limits{
		NumBlocks:      int(ready.KvCells) / sc.BlockSize,
		SequenceSlots:  int(ready.Sequences),
		StreamCells:    int(ready.StreamCells),
		MaxModelLen:    int(ready.ContextLength),
		MaxBatchTokens: int(ready.MaxBatchTokens),
		EOSTokenIDs:    ready.EogTokenIds,
		VocabSize:      int(ready.VocabSize),
	}}
	if int(ready.StreamCells) < sc.MaxModelLen {
		w.Close()
		return nil, fmt.Errorf("llamacpp: the worker's KV streams hold %d tokens, less than the max model length %d", ready.StreamCells, sc.MaxModelLen)
	}
	w.log.Info("model loaded", "device", ready.Device, "model_bytes", ready.ModelBytes, "kv_cache_cells", ready.KvCells,
		"kv_cache_bytes", uint64(ready.KvCells)*ready.KvBytesPerToken, "sequences", ready.Sequences, "stream_cells", ready.StreamCells)
	if ready.GreedyInGraph {
		w.log.Info("greedy requests take their argmax in llama.cpp's graph: the host does not scan their logits", "device", ready.Device)
	}
	return e, nil
}

// Ready is the worker's account of its model.
func (e *Executor) Ready() *dpnodev1.ModelReady { return e.ready }

// Limits implements engine.Limited.
func (e *Executor) Limits() engine.Limits { return e.limits }

// Done implements engine.Process.
func (e *Executor) Done() <-chan struct{} { return e.w.Done() }

// Err implements engine.Process.
func (e *Executor) Err() error { return e.w.Err() }

// Close implements engine.Process.
func (e *Executor) Close() error { return e.w.Close() }

// Pid is the worker's process id (for chaos tests).
func (e *Executor) Pid() int { return e.w.Pid() }

// Execute implements engine.Executor: the step's KV moves and every
// request's tokens go to the worker as one step, which it computes in one
// decode.
func (e *Executor) Execute(ctx context.Context, b *engine.Batch) (engine.StepResult, error) {
	step, err := e.stepOf(b)
	if err != nil {
		return engine.StepResult{}, err
	}
	rep, err := e.w.Call(ctx, &dpnodev1.WorkerRequest{Body: &dpnodev1.WorkerRequest_Step{Step: step}})
	if err != nil {
		return engine.StepResult{}, err
	}
	done := rep.GetStep()
	if done == nil {
		return engine.StepResult{}, fmt.Errorf("llamacpp: the worker answered a step with %T", rep.Body)
	}
	e.gapTokens.Add(uint64(done.GapTokens))
	res := engine.StepResult{Tokens: make([]uint32, len(b.Requests)), Duration: time.Duration(done.ComputeNanos), ComputedTokens: int(done.ComputedTokens),
		Phases: engine.StepPhases{KVOps: time.Duration(done.KvOpsNanos), Model: time.Duration(done.DecodeNanos), Sample: time.Duration(done.SampleNanos)}}
	for _, pl := range done.PromptLogprobs {
		if res.PromptLogprobs == nil {
			res.PromptLogprobs = make([][]*engine.TokenLogprobs, len(b.Requests))
		}
		i := slices.IndexFunc(b.Requests, func(r engine.ScheduledRequest) bool { return r.Seq == pl.Seq })
		if i < 0 {
			return engine.StepResult{}, fmt.Errorf("llamacpp: the worker gave prompt log-probabilities of sequence %d, not in the step", pl.Seq)
		}
		res.PromptLogprobs[i] = make([]*engine.TokenLogprobs, len(pl.Logprobs))
		for j, lp := range pl.Logprobs {
			res.PromptLogprobs[i][j] = logprobs(lp)
		}
	}
	k := 0
	for i := range b.Requests {
		if b.Requests[i].SampleIndex < 0 {
			continue
		}
		if k >= len(done.Tokens) {
			return engine.StepResult{}, fmt.Errorf("llamacpp: the worker sampled %d tokens for a step that samples more", len(done.Tokens))
		}
		res.Tokens[i] = done.Tokens[k]
		if len(done.Logprobs) > 0 {
			if k >= len(done.Logprobs) {
				return engine.StepResult{}, fmt.Errorf("llamacpp: the worker gave %d log-probabilities for %d tokens", len(done.Logprobs), len(done.Tokens))
			}
			if res.Logprobs == nil {
				res.Logprobs = make([]*engine.TokenLogprobs, len(b.Requests))
			}
			res.Logprobs[i] = logprobs(done.Logprobs[k])
		}
		k++
	}
	return res, nil
}

// stepOf is the worker's step for b: its KV moves, and each request's
// tokens, prompt log-probability targets and draw.
func (e *Executor) stepOf(b *engine.Batch) (*dpnodev1.ExecuteStep, error) {
	step := &dpnodev1.ExecuteStep{Ops: make([]*dpnodev1.KVOp, 0, len(b.SeqOps)), Sequences: make([]*dpnodev1.StepSequence, 0, len(b.Requests))}
	for _, op := range b.SeqOps {
		switch op.Kind {
		case engine.SeqCopy:
			step.Ops = append(step.Ops, &dpnodev1.KVOp{Op: &dpnodev1.KVOp_Copy{Copy: &dpnodev1.KVCopy{Src: op.Src, Dst: op.Dst, P0: op.P0, P1: op.P1}}})
		case engine.SeqRemove:
			step.Ops = append(step.Ops, &dpnodev1.KVOp{Op: &dpnodev1.KVOp_Remove{Remove: &dpnodev1.KVRemove{Seq: op.Dst, P0: op.P0, P1: op.P1}}})
		}
	}
	for i := range b.Requests {
		r := &b.Requests[i]
		if r.Seq < 0 {
			return nil, errors.New("llamacpp: a step without KV sequences; the scheduler needs sequence slots")
		}
		s := &dpnodev1.StepSequence{Seq: r.Seq, Pos: int32(r.NumComputed), Tokens: r.Tokens}
		if r.Sampling != nil && r.Sampling.PromptLogprobs && r.Prompt != nil {
			// Each prompt token of the step but the prompt's last is
			// followed by a prompt token, whose log-probability it gives.
			from, to := r.NumComputed+1, min(r.NumComputed+r.NumNewTokens, len(r.Prompt)-1)+1
			if from < to {
				s.PromptLogprobTargets, s.PromptTopLogprobs, s.PromptRanks = r.Prompt[from:to], int32(r.Sampling.TopLogprobs), r.Sampling.PromptRanks
			}
		}
		if r.SampleIndex >= 0 {
			s.Sample = e.sampleParams(r)
			// The penalties count the request's tokens, and a grammar's
			// state follows them: where the worker's sequence may not
			// hold them, they go with the step.
			if sp := r.Sampling; sp.NeedsHistory() {
				if h := e.history(r); h != nil {
					if !sp.Penalized() {
						h.Prompt = nil
					}
					s.Sample.History, s.Sample.Grammar = h, sp.Grammar
				}
			}
		}
		step.Sequences = append(step.Sequences, s)
	}
	return step, nil
}

// sampleParams says how r's next token is drawn. Its seed is a function
// of the request's seed (or, without one, of its id, which a migrated
// request keeps) and of the token's index, so that a request continues
// exactly as it would have wherever it runs. Before min_tokens, neither
// the model's end tokens nor the request's stop tokens can be drawn, as
// in vLLM.
func (e *Executor) sampleParams(r *engine.ScheduledRequest) *dpnodev1.SampleParams {
	sp := r.Sampling
	// A top_k past int32 keeps every token, as it asks, rather than
	// wrapping around to a small one.
	p := &dpnodev1.SampleParams{Temperature: sp.Temperature, TopP: sp.TopP, TopK: int32(min(sp.TopK, math.MaxInt32))}
	var base uint64
	if sp.Seed != nil {
		base = uint64(*sp.Seed)
	} else {
		h := fnv.New64a()
		h.Write([]byte(r.ID))
		base = h.Sum64()
	}
	p.Seed = SampleSeed(base, r.SampleIndex)
	p.PresencePenalty, p.FrequencyPenalty, p.RepetitionPenalty, p.MinP = sp.PresencePenalty, sp.FrequencyPenalty, sp.RepetitionPenalty, sp.MinP
	p.Logprobs, p.TopLogprobs = sp.Logprobs, int32(sp.TopLogprobs)
	p.Constrained = sp.Grammar != ""
	for t, v := range sp.LogitBias {
		p.LogitBiasTokenIds = append(p.LogitBiasTokenIds, t)
		p.LogitBiasValues = append(p.LogitBiasValues, v)
	}
	if r.SampleIndex < sp.MinTokens {
		p.BannedTokenIds = append(append(p.BannedTokenIds, e.ready.EogTokenIds...), sp.StopTokenIDs...)
	}
	return p
}

// history is r's penalty history for the worker, or nil when the worker's
// sequence already holds it: the sequence drew every output r has, in
// steps for r.
func (e *Executor) history(r *engine.ScheduledRequest) *dpnodev1.PenaltyHistory {
	if e.histories == nil {
		e.histories = map[int32]historyMark{}
	}
	mark := e.histories[r.Seq]
	e.histories[r.Seq] = historyMark{id: r.ID, next: r.SampleIndex + 1}
	if mark.id == r.ID && mark.next == r.SampleIndex && len(r.Output) == r.SampleIndex {
		return nil
	}
	return &dpnodev1.PenaltyHistory{Prompt: r.Prompt, Output: r.Output}
}

// SampleSeed is the seed of the index-th token of a request seeded with
// base: a 64-bit mix of the two.
func SampleSeed(base uint64, index int) uint64 {
	var buf [16]byte
	binary.LittleEndian.PutUint64(buf[:8], base)
	binary.LittleEndian.PutUint64(buf[8:], uint64(index))
	h := fnv.New64a()
	h.Write(buf[:])
	x := h.Sum64()
	x ^= x >> 33
	x *= 0xff51afd7ed558ccd
	x ^= x >> 33
	return x
}

// logprobs is the engine's form of a token's log-probabilities from the
// worker; nil stays nil.
func logprobs(lp *dpnodev1.TokenLogprobs) *engine.TokenLogprobs {
	if lp == nil {
		return nil
	}
	return &engine.TokenLogprobs{Logprob: lp.Logprob, TopTokenIds: lp.TopTokenIds, TopLogprobs: lp.TopLogprobs, Rank: lp.Rank}
}
