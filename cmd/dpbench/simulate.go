package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/dpnode/dpnode/dp"
	"github.com/dpnode/dpnode/dp/vsim"
	"github.com/dpnode/dpnode/engine"
	"github.com/dpnode/dpnode/engine/sim"
)

// Simulation is the deployment the virtual-time simulator runs.
type Simulation struct {
	Ranks          int
	Profile        *sim.Profile
	ExpertParallel bool
	RanksPerNode   int
	Seed           uint64
	// Context stops a run when done (Ctrl-C); nil never.
	Context context.Context
}

// simConfig is the simulator's configuration of sm with the named policy,
// under load l: at the requests' arrival times, or in a closed loop.
func simConfig(sm Simulation, policy string, l Load) (vsim.Config, error) {
	cfg := sm.Profile.SchedulerConfig()
	pol, err := dp.NewPolicy(policy, dp.PolicyConfig{APIServers: 1, StepTokens: cfg.MaxNumBatchedTokens, Seed: sm.Seed})
	if err != nil {
		return vsim.Config{}, err
	}
	conc := 0
	if !l.Open {
		conc = max(l.Concurrency, 1)
	}
	return vsim.Config{Ranks: sm.Ranks, Profile: sm.Profile, Scheduler: cfg, Policy: pol,
		ExpertParallel: sm.ExpertParallel, RanksPerNode: sm.RanksPerNode, Concurrency: conc, Context: sm.Context}, nil
}

// runSim runs items on the simulated deployment with the named policy,
// under load l, and keeps every request's outcome; simulate runs a
// workload of any size.
func runSim(sm Simulation, policy string, items []Item, l Load) (*vsim.Result, error) {
	cfg, err := simConfig(sm, policy, l)
	if err != nil {
		return nil, err
	}
	reqs := make([]vsim.Request, len(items))
	for i, it := range items {
		reqs[i] = vsim.Request{Arrival: it.Arrival, Prompt: it.Prompt, MaxTokens: it.MaxTokens}
	}
	return vsim.Run(cfg, reqs)
}

// simulate runs next's requests as runSim does, drawing each as the
// simulation reaches it, and summarizes the run as it goes: it holds only
// the requests in flight. It returns every request's outcome too when
// keep is set.
func simulate(sm Simulation, policy string, next Items, l Load, keep bool) (Summary, []Outcome, error) {
	wall := time.Now()
	cfg, err := simConfig(sm, policy, l)
	if err != nil {
		return Summary{}, nil, err
	}
	src, stop := prefetch(next, cfg.Scheduler.BlockSize)
	defer stop()
	rec := &simRecorder{keep: keep}
	res, err := vsim.Stream(cfg, src, rec)
	if err != nil {
		return Summary{}, nil, err
	}
	// The run lasts from the first arrival to the last end.
	s := rec.tally.summary(fmt.Sprintf("%s, %d ranks", policy, sm.Ranks), res.Makespan-rec.first)
	s.Simulated, s.Policy, s.NumRanks = true, policy, sm.Ranks
	s.DummyStepShare = res.DummyShare()
	s.SimWallS = time.Since(wall).Seconds()
	if rec.prompt > 0 {
		s.CachedShare = float64(rec.cached) / float64(rec.prompt)
	}
	served := map[string]float64{}
	for i, r := range res.Ranks {
		served[fmt.Sprint(i)] = float64(r.Served)
	}
	s.Ranks = newSpread(served)
	return s, rec.outs, nil
}

var _ vsim.Recorder = (*simRecorder)(nil)

// simRecorder sums a simulated run up as its requests end.
type simRecorder struct {
	tally tally
	// keep asks for every outcome in outs, in the order sent.
	keep bool
	outs []Outcome
	// first is the first arrival; prompt and cached count prompt tokens,
	// and those found in the prefix cache.
	first          time.Duration
	ended          int
	prompt, cached int
}

func (r *simRecorder) Gap(d time.Duration) { r.tally.gap(d) }

func (r *simRecorder) Ended(i int, o vsim.Outcome) {
	out := Outcome{Start: o.Arrival, TTFT: o.First - o.Arrival, E2E: o.End - o.Arrival, PromptTokens: o.PromptTokens, CachedTokens: o.CachedTokens, OutputTokens: o.Tokens}
	if o.Err != nil {
		out.Err = o.Err.Error()
	}
	r.tally.add(out)
	if r.ended == 0 || o.Arrival < r.first {
		r.first = o.Arrival
	}
	r.ended++
	r.prompt += o.PromptTokens
	r.cached += o.CachedTokens
	if r.keep {
		if i >= len(r.outs) {
			r.outs = append(r.outs, make([]Outcome, i+1-len(r.outs))...)
		}
		r.outs[i] = out
	}
}

// prefetchBatch is how many requests prefetch hands over at a time, and
// prefetchDepth how many such batches it draws ahead.
const (
	prefetchBatch = 256
	prefetchDepth = 4
)

// prefetch draws next's requests, and hashes their prompts (the blocks,
// and the whole for sampling) as the balancer and the engines will, on a
// goroutine of its own, a few batches ahead of the simulation that takes
// them from src: drawing and hashing the tokens is a large share of the
// work of a simulated request, and the simulation runs on one core. stop
// ends the goroutine and waits for it.
func prefetch(next Items, blockSize int) (src vsim.Source, stop func()) {
	batches := make(chan []vsim.Request, prefetchDepth)
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		defer close(batches)
		for {
			batch := make([]vsim.Request, 0, prefetchBatch)
			for len(batch) < prefetchBatch {
				it, ok := next()
				if !ok {
					break
				}
				batch = append(batch, vsim.Request{Arrival: it.Arrival, Prompt: it.Prompt, MaxTokens: it.MaxTokens,
					Blocks: engine.PrefixHashes(it.Prompt, blockSize, ""), PromptHash: engine.PromptHash(it.Prompt, nil)})
			}
			if len(batch) > 0 {
				select {
				case batches <- batch:
				case <-done:
					return
				}
			}
			if len(batch) < prefetchBatch {
				return
			}
		}
	})
	var batch []vsim.Request
	src = func() (vsim.Request, bool) {
		if len(batch) == 0 {
			var ok bool
			if batch, ok = <-batches; !ok {
				return vsim.Request{}, false
			}
		}
		req := batch[0]
		// The simulation holds the request as long as it needs it.
		batch[0] = vsim.Request{}
		batch = batch[1:]
		return req, true
	}
	return src, func() {
		close(done)
		wg.Wait()
	}
}
