package sim

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/dpnode/dpnode/engine"
)

// ExecutorConfig sets up a simulated executor.
type ExecutorConfig struct {
	// Profile models the step times.
	Profile *Profile
	// Tokenizer decides which tokens are words; output decodes with it.
	Tokenizer *Tokenizer
	// Clock is slept on for each step's scaled time; a VirtualClock runs
	// the model without waiting.
	Clock engine.Clock
	// TimeScale multiplies the modelled step time before sleeping: 1 runs
	// in real time, 0.01 a hundred times faster, 0 not at all (a zero-cost
	// executor, which measures the runtime around it).
	TimeScale float64
}

// Executor is the simulated executor: it prices a step with the profile's
// cost model, sleeps for it (scaled), and samples deterministic text.
type Executor struct {
	cfg ExecutorConfig
}

var _ engine.Executor = (*Executor)(nil)

// NewExecutor checks cfg and returns an executor.
func NewExecutor(cfg ExecutorConfig) (*Executor, error) {
	switch {
	case cfg.Profile == nil:
		return nil, fmt.Errorf("sim: executor needs a profile")
	case cfg.Tokenizer == nil:
		return nil, fmt.Errorf("sim: executor needs a tokenizer")
	case cfg.Clock == nil:
		return nil, fmt.Errorf("sim: executor needs a clock")
	case cfg.TimeScale < 0 || math.IsNaN(cfg.TimeScale) || math.IsInf(cfg.TimeScale, 0):
		return nil, fmt.Errorf("sim: --sim-time-scale must be a finite number at least 0, got %v", cfg.TimeScale)
	}
	return &Executor{cfg: cfg}, nil
}

// Shape is the cost model's view of a step's shape.
func Shape(s engine.Shape) BatchShape {
	return BatchShape{
		PrefillTokens:         s.NumPrefillTokens,
		PrefillContextProduct: s.PrefillContextProduct,
		DecodeSeqs:            s.NumDecodeSeqs,
		DecodeContextTokens:   s.DecodeContextTokens,
	}
}

// StepTime is how long a batch takes: its own modelled time, or in an
// expert-parallel group the slowest rank's (each with its part of the
// all-to-all), since the group steps together.
func (e *Executor) StepTime(b *engine.Batch) time.Duration {
	c := b.Collective
	if c == nil {
		return e.cfg.Profile.StepTime(Shape(b.Shape))
	}
	var slowest time.Duration
	for _, s := range c.Shapes {
		bs := Shape(s)
		bs.EPRanks, bs.EPTotalTokens, bs.CrossNode = len(c.Shapes), c.TotalTokens, c.CrossNode
		slowest = max(slowest, e.cfg.Profile.StepTime(bs))
	}
	return slowest
}

// Execute implements engine.Executor.
func (e *Executor) Execute(ctx context.Context, b *engine.Batch) (engine.StepResult, error) {
	d := e.StepTime(b)
	res := engine.StepResult{Tokens: make([]uint32, len(b.Requests)), Duration: d, ComputedTokens: b.NumTokens()}
	for i := range b.Requests {
		r := &b.Requests[i]
		if r.SampleIndex >= 0 {
			res.Tokens[i] = e.cfg.Tokenizer.Sample(r.PromptHash, r.SampleIndex, r.Sampling)
		}
	}
	if e.cfg.TimeScale > 0 {
		if err := e.cfg.Clock.Sleep(ctx, time.Duration(float64(d)*e.cfg.TimeScale)); err != nil {
			return engine.StepResult{}, err
		}
	}
	return res, nil
}

// mix is a 64-bit finaliser (splitmix64): a cheap hash of a key and an
// index with every output bit depending on every input bit.
func mix(x uint64) uint64 {
	x += 0x9E3779B97F4A7C15
	x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9
	x = (x ^ (x >> 27)) * 0x94D049BB133111EB
	return x ^ (x >> 31)
}

// NaturalLength is the number of tokens the simulated model writes before
// its end-of-sequence token for a prompt: between 32 and 1024, log-uniform,
// like the spread of chat replies.
func NaturalLength(promptHash uint64) int {
	u := float64(mix(promptHash)>>11) / float64(1<<53)
	return int(32 * math.Pow(32, u))
}

// Sample returns token i of the request whose prompt hashes to promptHash:
// a function of those two only (and of the sampling limits that decide
// where EOS may fall), so a request continues token-exactly on any engine.
// The text is words with some punctuation and an occasional new line.
func (t *Tokenizer) Sample(promptHash uint64, i int, sp *engine.SamplingParams) uint32 {
	if !sp.IgnoreEOS && i >= max(NaturalLength(promptHash), sp.MinTokens) {
		return EOSToken
	}
	x := mix(promptHash ^ mix(uint64(i)))
	// Punctuation never follows punctuation: index i may be punctuation
	// only where i-1 did not draw it, which keeps token i a function of i.
	if r := x % 100; r < 11 && i > 0 && mix(promptHash^mix(uint64(i-1)))%100 >= 11 {
		switch {
		case r < 6:
			return t.ids["."]
		case r < 10:
			return t.ids[","]
		default:
			return t.ids["\n"]
		}
	}
	return firstWordToken + uint32((x>>8)%uint64(t.numWords()))
}

// Capabilities are the simulated engine's: dpnode's scheduler with
// per-index seeded sampling, block hashes and a KV cache it measures, and
// expert-parallel waves for a mixture-of-experts profile.
func Capabilities(p *Profile) engine.Capabilities {
	return engine.Capabilities{ExpertParallel: p.Kind == KindMoE, ExactMigration: true, PrefixHashes: true, KVUsage: true}
}

// NewCore returns a rank's engine: the simulated executor under dpnode's
// scheduler.
func NewCore(sched engine.SchedulerConfig, cfg ExecutorConfig) (*engine.StepCore, error) {
	exec, err := NewExecutor(cfg)
	if err != nil {
		return nil, err
	}
	return engine.NewStepCore(sched, exec, Capabilities(cfg.Profile))
}
