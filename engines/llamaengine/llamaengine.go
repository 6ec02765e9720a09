// Package llamaengine registers the llama.cpp engine (--engine llamacpp):
// a GGUF model in a llama.cpp worker process per rank, whose every step
// dpnode's scheduler decides.
package llamaengine

import (
	"context"
	"fmt"
	"math"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/dpnode/dpnode/engine"
	"github.com/dpnode/dpnode/engine/llamacpp"
	"github.com/dpnode/dpnode/engine/registry"
	"github.com/dpnode/dpnode/gpu"
)

// Engine is the llama.cpp engine.
var Engine = registry.Engine{
	Name:        "llamacpp",
	Summary:     "a GGUF model in llama.cpp, a worker process per rank",
	NewOptions:  func() registry.Options { return DefaultOptions() },
	ModelSuffix: ".gguf",
}

// Options are the llama.cpp engine's flags.
type Options struct {
	// Threads is the CPU threads each rank computes with; 0 shares the
	// machine's cores among the local ranks.
	Threads int
	// KVCacheMemory is each rank's KV cache budget, in bytes with an
	// optional unit (4GiB, 512MB); empty: from GPUMemoryUtilization on a
	// GPU, DefaultCPUKVCache on CPU.
	KVCacheMemory string
	// GPUMemoryUtilization is the share of a GPU's memory a rank may use,
	// weights and KV together (vLLM's --gpu-memory-utilization).
	GPUMemoryUtilization float64
	// KVCacheDtype is the KV cache's element type: auto (the model's:
	// float32 for an F32 model, else float16), float16 or float32.
	KVCacheDtype string
	// GreedyInGraph says where greedy rows' argmax is taken: auto (in the
	// graph when the model runs on a GPU), on (in the graph, on a CPU by
	// dpnode's op) or off.
	GreedyInGraph string
}

// DefaultOptions are the llama.cpp engine's defaults.
func DefaultOptions() *Options {
	return &Options{GPUMemoryUtilization: 0.9, KVCacheDtype: "auto", GreedyInGraph: "auto"}
}

func (o *Options) AddFlags(fs *pflag.FlagSet) {
	fs.IntVar(&o.Threads, "threads", o.Threads, "llamacpp: CPU threads per rank (default: the cores shared among the local ranks)")
	fs.StringVar(&o.KVCacheMemory, "kv-cache-memory-bytes", o.KVCacheMemory, "llamacpp: KV cache per rank, as 4GiB, 512MB or bytes (default: from --gpu-memory-utilization on GPUs, 4GiB on CPU)")
	fs.Float64Var(&o.GPUMemoryUtilization, "gpu-memory-utilization", o.GPUMemoryUtilization, "llamacpp: share of each GPU's memory a rank uses for weights and KV cache")
	fs.StringVar(&o.GreedyInGraph, "greedy-in-graph", o.GreedyInGraph, "llamacpp: take greedy requests' argmax inside llama.cpp's graph, so that their logits are not copied out: auto (when the model runs on a GPU), on (also on a CPU, by dpnode's op) or off")
	fs.StringVar(&o.KVCacheDtype, "kv-cache-dtype", o.KVCacheDtype, "llamacpp: KV cache element type: auto (the model's: float32 for an F32 model, else float16), float16 or float32")
}

// DefaultCPUKVCache is a rank's KV cache on CPU when
// --kv-cache-memory-bytes is not given: vLLM's CPU backend's default.
const DefaultCPUKVCache = 4 << 30

// gpuReserve is what a GPU rank keeps out of its memory budget for
// llama.cpp's compute buffers and CUDA's own context.
const gpuReserve = 1 << 30

// startTimeout bounds a model's load: minutes for a large model read from
// a slow disk.
const startTimeout = 10 * time.Minute

// defaults are the scheduler's defaults for llama.cpp: vLLM's sequences
// per step, and a step budget of 2,048 tokens, which keeps a long prefill
// chunk from stalling decodes for long on a CPU.
var defaults = engine.SchedulerConfig{MaxNumSeqs: 256, MaxNumBatchedTokens: 2048, BlockSize: 16}

// Plan checks the flags against the model file, before any worker
// starts.
func (o *Options) Plan(n registry.Node) (*registry.Plan, error) {
	switch {
	case n.Model == "":
		return nil, fmt.Errorf("--engine llamacpp needs --model, a GGUF file")
	case n.ExpertParallel:
		return nil, fmt.Errorf("--enable-expert-parallel is not available with --engine llamacpp: llama.cpp has no expert-parallel API (each rank holds the whole model)")
	case o.Threads < 0:
		return nil, fmt.Errorf("--threads must not be negative, got %d", o.Threads)
	case !(o.GPUMemoryUtilization > 0 && o.GPUMemoryUtilization <= 1):
		return nil, fmt.Errorf("--gpu-memory-utilization must be in (0, 1], got %v", o.GPUMemoryUtilization)
	}
	vocab, err := InspectVocabulary("--model", n.Model, n.ChatTemplate)
	if err != nil {
		return nil, err
	}
	info := vocab.Info
	if n.MaxModelLen > info.ContextLength {
		return nil, fmt.Errorf("--max-model-len %d is longer than the context of %s, %d tokens", n.MaxModelLen, n.Model, info.ContextLength)
	}
	var kvDtype string
	switch o.KVCacheDtype {
	case "auto":
		kvDtype = "f16"
		if info.F32 {
			kvDtype = "f32"
		}
	case "float16":
		kvDtype = "f16"
	case "float32":
		kvDtype = "f32"
	default:
		return nil, fmt.Errorf("--kv-cache-dtype must be auto, float16 or float32, got %q", o.KVCacheDtype)
	}
	switch o.GreedyInGraph {
	case "auto", "on", "off":
	default:
		return nil, fmt.Errorf("--greedy-in-graph must be auto, on or off, got %q", o.GreedyInGraph)
	}
	var kvBytes uint64
	if o.KVCacheMemory != "" {
		if kvBytes, err = ParseBytes(o.KVCacheMemory); err != nil {
			return nil, fmt.Errorf("--kv-cache-memory-bytes: %v", err)
		}
	}
	if n.MaxNumSeqs > llamacpp.MaxSequences {
		return nil, fmt.Errorf("--max-num-seqs %d is more than llama.cpp's %d sequences", n.MaxNumSeqs, llamacpp.MaxSequences)
	}
	sc := defaults
	sc.MaxNumSeqs = min(orDefault(n.MaxNumSeqs, sc.MaxNumSeqs), llamacpp.MaxSequences)
	sc.MaxNumBatchedTokens = orDefault(n.MaxNumBatchedTokens, sc.MaxNumBatchedTokens)
	sc.MaxModelLen = orDefault(n.MaxModelLen, info.ContextLength)
	sc.EnablePrefixCaching = n.PrefixCaching
	// Until a worker says how many streams its memory holds: one per
	// running sequence, each of the max model length.
	sc.SequenceSlots, sc.StreamCells = sc.MaxNumSeqs, sc.MaxModelLen
	sc.NumBlocks = sc.SequenceSlots * ((sc.MaxModelLen + sc.BlockSize - 1) / sc.BlockSize)
	if err := sc.Validate(); err != nil {
		return nil, err
	}
	p := &registry.Plan{
		Served: n.Model,
		// What identifies a GGUF model wherever its file lies.
		Profile:      fmt.Sprintf("%s, %d-token vocabulary, %d bytes", info.Architecture, info.VocabSize, info.Bytes),
		Scheduler:    sc,
		Capabilities: llamacpp.Capabilities,
	}
	opts := *o
	p.Open = func(ctx context.Context, s registry.Start) (*registry.Opened, error) {
		return opts.open(ctx, s, n, vocab, sc, kvBytes, kvDtype)
	}
	return p, nil
}

func (o Options) open(ctx context.Context, s registry.Start, n registry.Node, vocab *Vocabulary, sc engine.SchedulerConfig,
	kvBytes uint64, kvDtype string) (*registry.Opened, error) {
	info := vocab.Info
	threads := o.Threads
	if threads == 0 {
		threads = max(1, runtime.NumCPU()/max(s.LocalSize, 1))
	}
	op := &registry.Opened{StartTimeout: startTimeout,
		Describe: []any{"model_file", n.Model, "architecture", info.Architecture, "threads_per_rank", threads, "kv_cache_dtype", kvDtype,
			"chat_template", vocab.Template != nil, "max_num_seqs", sc.MaxNumSeqs}}
	if vocab.Template != nil {
		op.Template = vocab.Template
	}
	if s.ServesAPI {
		// The API tokenizes before it picks a rank, so an API node with no
		// ranks of its own needs the model's vocabulary too.
		tok, err := vocab.OpenTokenizer(ctx, s.Logger)
		if err != nil {
			return nil, err
		}
		op.Tokenizer = tok
		op.Close = func() { _ = tok.Close() }
	}
	op.NewCore = func(ctx context.Context, rank int, dev gpu.Device) (engine.Core, error) {
		cfg := llamacpp.ExecutorConfig{
			Worker: llamacpp.WorkerConfig{Binary: vocab.binary, Env: []string{fmt.Sprintf("%s=rank-%d", llamacpp.WorkerRoleEnv, rank)},
				Logger: s.Logger.With("rank", rank, "component", "llama.cpp")},
			Model:         n.Model,
			Scheduler:     sc,
			Threads:       threads,
			KVCacheBytes:  kvBytes,
			KVCacheDtype:  kvDtype,
			GreedyInGraph: o.GreedyInGraph,
		}
		if !dev.Virtual {
			// The rank's model and KV cache go on its GPU, and only there.
			cfg.Worker.Env = append(cfg.Worker.Env, "CUDA_VISIBLE_DEVICES="+dev.UUID)
			cfg.GPULayers = -1
			if cfg.KVCacheBytes == 0 {
				budget := int64(o.GPUMemoryUtilization*float64(dev.MemoryTotalBytes)) - info.Bytes - gpuReserve
				if budget <= 0 {
					return nil, fmt.Errorf("the model (%d MiB) does not fit in %.0f%% of GPU %s's %d MiB with room for a KV cache; raise --gpu-memory-utilization or use a smaller model",
						info.Bytes>>20, 100*o.GPUMemoryUtilization, dev.UUID, dev.MemoryTotalBytes>>20)
				}
				cfg.KVCacheBytes = uint64(budget)
			}
		} else if cfg.KVCacheBytes == 0 {
			cfg.KVCacheBytes = DefaultCPUKVCache
		}
		return llamacpp.NewCore(ctx, cfg, s.Logger.With("rank", rank))
	}
	return op, nil
}

// ParseBytes reads a size: a number of bytes with an optional unit,
// decimal (KB, MB, GB, or k, M, G as vLLM writes them) or binary (KiB,
// MiB, GiB).
func ParseBytes(s string) (uint64, error) {
	units := []struct {
		suffix string
		mult   uint64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40},
		{"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12}, {"k", 1e3}, {"K", 1e3}, {"M", 1e6}, {"G", 1e9}, {"T", 1e12}, {"B", 1}}
	num, mult := strings.TrimSpace(s), uint64(1)
	for _, u := range units {
		if strings.HasSuffix(num, u.suffix) {
			num, mult = strings.TrimSpace(strings.TrimSuffix(num, u.suffix)), u.mult
			break
		}
	}
	v, err := strconv.ParseFloat(num, 64)
	if err != nil || v <= 0 || math.IsInf(v, 0) || v*float64(mult) >= 1<<62 {
		return 0, fmt.Errorf("%q is not a size in bytes (for example 4GiB, 512MB or 1073741824)", s)
	}
	return uint64(v * float64(mult)), nil
}

func orDefault(v, d int) int {
	if v > 0 {
		return v
	}
	return d
}

// Of returns the llama.cpp engine's options among a node's (node.Options'
// Engines).
func Of(all map[string]registry.Options) *Options { return all[Engine.Name].(*Options) }
