package node

import (
	"context"
	"fmt"
	"runtime"
	"time"

	"github.com/dpnode/dpnode/dp"
	"github.com/dpnode/dpnode/engine"
	"github.com/dpnode/dpnode/engine/llamacpp"
	"github.com/dpnode/dpnode/engine/sim"
	"github.com/dpnode/dpnode/gpu"
	httpapi "github.com/dpnode/dpnode/http"
)

// nodeEngine is what a node's engine choice decides: how ranks compute,
// and how the API tokenizes and renders chats.
type nodeEngine struct {
	tokenizer engine.Tokenizer
	// template is nil for a model without a chat template.
	template httpapi.ChatTemplate
	newCore  func(ctx context.Context, rank int, dev gpu.Device) (engine.Core, error)
	// startTimeout bounds the engines' start, model loads included; 0
	// keeps the node's default.
	startTimeout time.Duration
	// simulated is true for the simulated executor.
	simulated bool
	// describe is what the start-up log line says of the engine.
	describe []any
	close    func()
}

// gpuReserve is what a GPU rank keeps out of its memory budget for
// llama.cpp's compute buffers and CUDA's own context.
const gpuReserve = 1 << 30

// llamaCppStartTimeout bounds a model's load: minutes for a large model
// read from a slow disk.
const llamaCppStartTimeout = 10 * time.Minute

func (p *plan) newEngine(o Options, inv gpu.Inventory, topo dp.Topology) (*nodeEngine, error) {
	if p.model == nil {
		tok := sim.NewTokenizer(0)
		return &nodeEngine{
			simulated: true,
			tokenizer: tok,
			template:  httpapi.Llama3Template{},
			newCore: func(context.Context, int, gpu.Device) (engine.Core, error) {
				return sim.NewCore(p.scheduler, sim.ExecutorConfig{Profile: p.profile, Tokenizer: tok, Clock: engine.RealClock{}, TimeScale: o.SimTimeScale})
			},
			describe: []any{"sim_profile", p.profile.Name, "sim_time_scale", o.SimTimeScale},
			close:    func() {},
		}, nil
	}
	binary, err := llamacpp.FindWorker()
	if err != nil {
		return nil, err
	}
	threads := o.Threads
	if threads == 0 {
		threads = max(1, runtime.NumCPU()/max(topo.LocalSize, 1))
	}
	e := &nodeEngine{startTimeout: llamaCppStartTimeout, close: func() {}}
	if p.template != nil {
		e.template = p.template
	}
	if topo.ServesAPI() {
		// The API tokenizes before it picks a rank, so an API node with no
		// ranks of its own needs the model's vocabulary too.
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		tok, err := llamacpp.NewTokenizer(ctx, llamacpp.WorkerConfig{Binary: binary, Env: []string{llamacpp.WorkerRoleEnv + "=tokenizer"},
			Logger: o.Logger.With("component", "tokenizer")}, p.model.Path, llamacpp.TokenizerConfig{})
		if err != nil {
			return nil, fmt.Errorf("cluster: the tokenizer of %s: %w", p.model.Path, err)
		}
		e.tokenizer = tok
		e.close = func() { _ = tok.Close() }
	}
	e.newCore = func(ctx context.Context, rank int, dev gpu.Device) (engine.Core, error) {
		cfg := llamacpp.ExecutorConfig{
			Worker: llamacpp.WorkerConfig{Binary: binary, Env: []string{fmt.Sprintf("%s=rank-%d", llamacpp.WorkerRoleEnv, rank)},
				Logger: o.Logger.With("rank", rank, "component", "llama.cpp")},
			Model:         p.model.Path,
			Scheduler:     p.scheduler,
			Threads:       threads,
			KVCacheBytes:  p.kvBytes,
			KVCacheDtype:  p.kvDtype,
			GreedyInGraph: o.GreedyInGraph,
		}
		if !dev.Virtual {
			// The rank's model and KV cache go on its GPU, and only there.
			cfg.Worker.Env = append(cfg.Worker.Env, "CUDA_VISIBLE_DEVICES="+dev.UUID)
			cfg.GPULayers = -1
			if cfg.KVCacheBytes == 0 {
				budget := int64(o.GPUMemoryUtilization*float64(dev.MemoryTotalBytes)) - p.model.Bytes - gpuReserve
				if budget <= 0 {
					return nil, fmt.Errorf("the model (%d MiB) does not fit in %.0f%% of GPU %s's %d MiB with room for a KV cache; raise --gpu-memory-utilization or use a smaller model",
						p.model.Bytes>>20, 100*o.GPUMemoryUtilization, dev.UUID, dev.MemoryTotalBytes>>20)
				}
				cfg.KVCacheBytes = uint64(budget)
			}
		} else if cfg.KVCacheBytes == 0 {
			cfg.KVCacheBytes = DefaultCPUKVCache
		}
		return llamacpp.NewCore(ctx, cfg, o.Logger.With("rank", rank))
	}
	e.describe = []any{"model_file", p.model.Path, "architecture", p.model.Architecture, "threads_per_rank", threads, "kv_cache_dtype", p.kvDtype,
		"chat_template", e.template != nil, "max_num_seqs", p.scheduler.MaxNumSeqs}
	return e, nil
}
