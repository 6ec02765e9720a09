package llamacpp

import (
	"context"
	"log/slog"

	"github.com/dpnode/dpnode/engine"
)

// Capabilities are the llama.cpp engine's: dpnode's scheduler drives it,
// with per-index seeded sampling and block hashes; llama.cpp has no
// expert-parallel API (each rank holds the whole model).
var Capabilities = engine.Capabilities{ExactMigration: true, PrefixHashes: true, KVUsage: true, Logprobs: true, PromptLogprobs: true, Grammar: true}

// NewCore starts a rank's worker, loads the model and returns the rank's
// engine under cfg.Scheduler, with the limits the model and its KV memory
// set, which it logs.
func NewCore(ctx context.Context, cfg ExecutorConfig, logger *slog.Logger) (engine.Core, error) {
	exec, err := NewExecutor(ctx, cfg)
	if err != nil {
		// Not exec: a nil *Executor is a non-nil engine.Executor.
		return nil, err
	}
	core, err := engine.NewStepCore(cfg.Scheduler, exec, Capabilities)
	if err != nil {
		_ = exec.Close()
		return nil, err
	}
	sc := core.Config()
	if sc.SequenceSlots > 0 {
		logger.Info("KV streams", "streams", sc.SequenceSlots, "tokens_each", sc.StreamCells,
			"running_at_most", sc.MaxNumSeqs, "kept_for_prefix_cache", sc.SequenceSlots-sc.MaxNumSeqs)
	}
	if sc.MaxNumSeqs < cfg.Scheduler.MaxNumSeqs {
		logger.Warn("the KV cache holds fewer sequences than --max-num-seqs: fewer run at once; more KV memory (--kv-cache-memory-bytes) or a shorter --max-model-len gives more",
			"max_num_seqs", sc.MaxNumSeqs, "asked", cfg.Scheduler.MaxNumSeqs)
	}
	return core, nil
}
