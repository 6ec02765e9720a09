package engine

import (
	"context"
	"fmt"
)

// Core is one rank's engine as its actor drives it: requests go in, and
// outputs come out of one step at a time. A Core whose steps dpnode's
// scheduler builds (StepCore) runs one forward pass per step; an engine
// that schedules its own work (a server in front of which dpnode stands)
// makes a step of waiting for its next outputs.
//
// Concurrency: the engine actor calls every method from its mailbox, one
// at a time, except Step.Run, which runs off it while the mailbox goes
// on; at most one step is in flight. Done and Err are safe for concurrent
// use.
type Core interface {
	// Add takes a request, or refuses it with an error a client can read.
	Add(NewRequest) error
	// Abort drops requests; their outputs stop, and ids not held are
	// ignored.
	Abort(ids ...string)
	// IDs lists the requests held whose client passes keep.
	IDs(keep func(client any) bool) []string
	// HasWork reports whether a step would do anything.
	HasWork() bool
	// Next begins the next step; it is called only when HasWork.
	Next() Step
	// Stats is the engine's load now.
	Stats() Stats
	// Capabilities says what the engine can do beyond serving requests.
	Capabilities() Capabilities
	// Done is closed when the engine dies on its own, between steps (a
	// worker process that exits); nil for one that cannot.
	Done() <-chan struct{}
	// Err says why the engine died, once Done is closed.
	Err() error
	// Close stops the engine and waits for what it runs to end; it is
	// called once no step is in flight, and again is harmless.
	Close() error
}

// Step is one step of a Core.
type Step interface {
	// Run does the step's work, off the actor's mailbox; it must return
	// when ctx is done. An error is the engine's failure: the rank
	// restarts and its requests move.
	Run(ctx context.Context) error
	// Finish, back on the mailbox after Run returned nil, appends the
	// step's outputs to outs.
	Finish(outs []Output) []Output
	// Result is what the step computed, for the rank's step metrics;
	// false for a step that computed nothing on this rank's behalf (an
	// empty batch, or an engine that schedules its own steps).
	Result() (StepResult, bool)
}

// Capabilities are what an engine can do beyond serving requests; the
// node turns off what its engine lacks.
type Capabilities struct {
	// ExpertParallel: the ranks can step in lockstep waves (BatchCore).
	ExpertParallel bool
	// ExactMigration: a request moved to another rank with its output so
	// far continues token for token as it would have, sampled requests
	// included (dpnode's sampling is seeded per output index). Without
	// it a moved request continues from its output so far, exactly only
	// where the engine is deterministic (greedy on a batch-invariant
	// engine).
	ExactMigration bool
	// PrefixHashes: the engine's prefix cache keys blocks by dpnode's
	// block hashes, so it takes the API server's hashes instead of
	// computing them again.
	PrefixHashes bool
	// KVUsage: Stats.KVUsage measures the engine's KV cache.
	KVUsage bool
	// Logprobs: the engine computes log-probabilities of output tokens
	// (SamplingParams.Logprobs).
	Logprobs bool
	// PromptLogprobs: and of prompt tokens (SamplingParams.PromptLogprobs).
	PromptLogprobs bool
	// Grammar: the engine constrains output to a grammar (structured
	// output, SamplingParams.Grammar).
	Grammar bool
}

// BatchCore is a Core whose every step is a Batch that dpnode's scheduler
// builds. Expert-parallel waves need one: the wave decides which batch
// each step runs, and when.
type BatchCore interface {
	Core
	// Schedule builds the next batch (possibly empty); StepOf makes it a
	// step. Next is StepOf(Schedule()).
	Schedule() *Batch
	StepOf(*Batch) Step
}

// Configured is a Core whose scheduler's configuration is dpnode's, with
// the limits its model set (StepCore).
type Configured interface {
	Config() SchedulerConfig
}

// StepCore is the Core of an engine whose every step dpnode's scheduler
// builds and an Executor computes: the simulator and llama.cpp.
type StepCore struct {
	sched *Scheduler
	exec  Executor
	caps  Capabilities
}

var (
	_ BatchCore  = (*StepCore)(nil)
	_ Configured = (*StepCore)(nil)
)

// NewStepCore returns the core of exec under cfg, adopting the limits of
// an executor that learns them when its model loads (Limited). The
// resolved configuration is the core's Config. On error the caller still
// owns exec.
func NewStepCore(cfg SchedulerConfig, exec Executor, caps Capabilities) (*StepCore, error) {
	if l, ok := exec.(Limited); ok {
		var err error
		if cfg, err = cfg.WithLimits(l.Limits()); err != nil {
			return nil, err
		}
	}
	sched, err := NewScheduler(cfg)
	if err != nil {
		return nil, err
	}
	return &StepCore{sched: sched, exec: exec, caps: caps}, nil
}

// Config returns the scheduler's configuration, limits adopted.
func (c *StepCore) Config() SchedulerConfig { return c.sched.Config() }

// Executor returns the core's executor.
func (c *StepCore) Executor() Executor { return c.exec }

func (c *StepCore) Add(nr NewRequest) error                 { return c.sched.Add(nr) }
func (c *StepCore) Abort(ids ...string)                     { c.sched.Abort(ids...) }
func (c *StepCore) IDs(keep func(client any) bool) []string { return c.sched.IDs(keep) }
func (c *StepCore) HasWork() bool                           { return c.sched.HasWork() }
func (c *StepCore) Stats() Stats                            { return c.sched.Stats() }
func (c *StepCore) Capabilities() Capabilities              { return c.caps }
func (c *StepCore) Schedule() *Batch                        { return c.sched.Schedule() }
func (c *StepCore) Next() Step                              { return c.StepOf(c.sched.Schedule()) }

func (c *StepCore) StepOf(b *Batch) Step { return &batchStep{core: c, batch: b} }

func (c *StepCore) Done() <-chan struct{} {
	if p, ok := c.exec.(Process); ok {
		return p.Done()
	}
	return nil
}

func (c *StepCore) Err() error {
	if p, ok := c.exec.(Process); ok {
		return p.Err()
	}
	return nil
}

func (c *StepCore) Close() error {
	if p, ok := c.exec.(Process); ok {
		return p.Close()
	}
	return nil
}

// batchStep is a StepCore's step: one batch through the executor.
type batchStep struct {
	core  *StepCore
	batch *Batch
	res   StepResult
}

func (s *batchStep) Run(ctx context.Context) (err error) {
	s.res, err = s.core.exec.Execute(ctx, s.batch)
	if err != nil {
		return fmt.Errorf("step %d: %w", s.batch.Step, err)
	}
	return nil
}

func (s *batchStep) Finish(outs []Output) []Output {
	return s.core.sched.AppendUpdate(outs, s.batch, s.res)
}

func (s *batchStep) Result() (StepResult, bool) {
	s.res.ScheduledTokens = s.batch.NumTokens()
	return s.res, !s.batch.Empty()
}
