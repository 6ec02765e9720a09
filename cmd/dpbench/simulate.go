package main

import (
	"fmt"
	"time"

	"github.com/dpnode/dpnode/dp"
	"github.com/dpnode/dpnode/dp/vsim"
	"github.com/dpnode/dpnode/engine/sim"
)

// Simulation is the deployment the virtual-time simulator runs.
type Simulation struct {
	Ranks          int
	Profile        *sim.Profile
	ExpertParallel bool
	RanksPerNode   int
	Seed           uint64
}

// runSim runs items on the simulated deployment with the named policy,
// under load l: at the items' arrival times, or in a closed loop.
func runSim(sm Simulation, policy string, items []Item, l Load) (*vsim.Result, error) {
	cfg := sm.Profile.SchedulerConfig()
	pol, err := dp.NewPolicy(policy, dp.PolicyConfig{APIServers: 1, StepTokens: cfg.MaxNumBatchedTokens, Seed: sm.Seed})
	if err != nil {
		return nil, err
	}
	reqs := make([]vsim.Request, len(items))
	for i, it := range items {
		reqs[i] = vsim.Request{Arrival: it.Arrival, Prompt: it.Prompt, MaxTokens: it.MaxTokens}
	}
	conc := 0
	if !l.Open {
		conc = max(l.Concurrency, 1)
	}
	return vsim.Run(vsim.Config{Ranks: sm.Ranks, Profile: sm.Profile, Scheduler: cfg, Policy: pol,
		ExpertParallel: sm.ExpertParallel, RanksPerNode: sm.RanksPerNode, Concurrency: conc}, reqs)
}

// simulate runs items as runSim does and summarizes the run.
func simulate(sm Simulation, policy string, items []Item, l Load) (Summary, []Outcome, error) {
	wall := time.Now()
	res, err := runSim(sm, policy, items, l)
	if err != nil {
		return Summary{}, nil, err
	}
	outs := make([]Outcome, len(res.Requests))
	prompt, cached := 0, 0
	for i, o := range res.Requests {
		outs[i] = Outcome{Start: o.Arrival, TTFT: o.First - o.Arrival, E2E: o.End - o.Arrival, PromptTokens: len(items[i].Prompt), OutputTokens: o.Tokens}
		if o.Err != nil {
			outs[i].Err = o.Err.Error()
		}
		prompt += len(items[i].Prompt)
		cached += o.CachedTokens
	}
	// The run lasts from the first arrival to the last end.
	first := time.Duration(0)
	if len(outs) > 0 {
		first = outs[0].Start
		for _, o := range outs {
			first = min(first, o.Start)
		}
	}
	s := summarize(fmt.Sprintf("%s, %d ranks", policy, sm.Ranks), outs, res.ITL, res.Makespan-first)
	s.Simulated, s.Policy, s.NumRanks = true, policy, sm.Ranks
	s.DummyStepShare = res.DummyShare()
	s.SimWallS = time.Since(wall).Seconds()
	if prompt > 0 {
		s.CachedShare = float64(cached) / float64(prompt)
	}
	served := map[string]float64{}
	for i, r := range res.Ranks {
		served[fmt.Sprint(i)] = float64(r.Served)
	}
	s.Ranks = newSpread(served)
	return s, outs, nil
}
