package vsim

import (
	"cmp"
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	dpnode "github.com/dpnode/dpnode"
	"github.com/dpnode/dpnode/dp"
	"github.com/dpnode/dpnode/engine"
	"github.com/dpnode/dpnode/engine/sim"
)

func profile(t *testing.T, name string) *sim.Profile {
	t.Helper()
	p, err := sim.LoadProfile(dpnode.SimProfiles, name)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// workload is n requests at rate per second (Poisson), prompts of 200 to
// 2,000 tokens of which groups of them share a 512-token prefix, outputs
// of 20 to 300 tokens.
func workload(n int, rate float64, seed uint64) []Request {
	rng := rand.New(rand.NewPCG(seed, 1))
	var at time.Duration
	reqs := make([]Request, n)
	for i := range reqs {
		at += time.Duration(rng.ExpFloat64() / rate * float64(time.Second))
		prompt := make([]uint32, 200+rng.IntN(1800))
		group := rng.IntN(8)
		for j := range prompt {
			if j < 512 {
				prompt[j] = uint32(1000 + group*1000 + j%1000)
			} else {
				prompt[j] = uint32(1000 + rng.IntN(30000))
			}
		}
		reqs[i] = Request{Arrival: at, Prompt: prompt, MaxTokens: 20 + rng.IntN(280)}
	}
	return reqs
}

func TestOneRequestStepsAtTheCostModelsPace(t *testing.T) {
	p := profile(t, "llama-3.1-8b-h100")
	prompt := make([]uint32, 100)
	for i := range prompt {
		prompt[i] = uint32(2000 + i)
	}
	res, err := Run(Config{Ranks: 2, Profile: p, Policy: dp.NewLiveLoad(8192)}, []Request{{Prompt: prompt, MaxTokens: 50}})
	if err != nil {
		t.Fatal(err)
	}
	o := res.Requests[0]
	if o.Err != nil || o.Tokens != 50 {
		t.Fatalf("outcome %+v", o)
	}
	if o.First <= 0 || o.First > 100*time.Millisecond {
		t.Fatalf("TTFT %v for a 100-token prompt on an idle rank", o.First)
	}
	if len(res.ITL) != 49 {
		t.Fatalf("%d inter-token gaps, want 49", len(res.ITL))
	}
	for i, gap := range res.ITL {
		if want := p.DecodeStepTime(1, 100+i+1); gap != want {
			t.Fatalf("gap %d is %v; a one-sequence decode step at context %d costs %v", i, gap, 100+i+1, want)
		}
	}
}

func TestEveryRequestEndsWithItsTokens(t *testing.T) {
	p := profile(t, "llama-3.1-8b-h100")
	reqs := workload(2000, 60, 1)
	for _, name := range dp.PolicyNames {
		pol, _ := dp.NewPolicy(name, dp.PolicyConfig{StepTokens: 8192, Seed: 1})
		res, err := Run(Config{Ranks: 4, Profile: p, Policy: pol}, reqs)
		if err != nil {
			t.Fatal(err)
		}
		served := 0
		for i, o := range res.Requests {
			if o.Err != nil || o.Tokens != reqs[i].MaxTokens || o.First <= o.Arrival || o.End < o.First {
				t.Fatalf("%s: request %d: %+v", name, i, o)
			}
		}
		for _, r := range res.Ranks {
			served += r.Served
		}
		if served != len(reqs) {
			t.Fatalf("%s: ranks served %d of %d", name, served, len(reqs))
		}
	}
}

func TestRunsAreDeterministic(t *testing.T) {
	p := profile(t, "llama-3.1-8b-h100")
	reqs := workload(500, 40, 2)
	run := func() *Result {
		res, err := Run(Config{Ranks: 3, Profile: p, Policy: dp.NewPowerOfTwo(7)}, reqs)
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	a, b := run(), run()
	for i := range a.Requests {
		if a.Requests[i] != b.Requests[i] {
			t.Fatalf("request %d: %+v then %+v", i, a.Requests[i], b.Requests[i])
		}
	}
}

// TestClosedLoopHoldsItsConcurrency: with c clients, at most c requests
// are in flight at any time, and all of them run.
func TestClosedLoopHoldsItsConcurrency(t *testing.T) {
	p := profile(t, "llama-3.1-8b-h100")
	reqs := workload(300, 1, 3)
	res, err := Run(Config{Ranks: 2, Profile: p, Policy: &dp.RoundRobin{}, Concurrency: 8}, reqs)
	if err != nil {
		t.Fatal(err)
	}
	type edge struct {
		at    time.Duration
		delta int
	}
	inFlight, most := 0, 0
	var edges []edge
	for _, o := range res.Requests {
		edges = append(edges, edge{o.Arrival, 1}, edge{o.End, -1})
	}
	// Ends before starts at the same instant: the next request is sent
	// when the previous ends.
	slices.SortFunc(edges, func(a, b edge) int { return cmp.Or(cmp.Compare(a.at, b.at), cmp.Compare(a.delta, b.delta)) })
	for _, e := range edges {
		inFlight += e.delta
		most = max(most, inFlight)
	}
	if most != 8 {
		t.Fatalf("at most %d requests in flight with 8 clients", most)
	}
}

// TestWavesRunDummyStepsForIdleRanks: with expert parallelism every rank
// steps while any has work, so a lone request makes the others run dummy
// steps, and an idle cluster ends its wave.
func TestWavesRunDummyStepsForIdleRanks(t *testing.T) {
	p := profile(t, "qwen3-30b-a3b-h200")
	prompt := make([]uint32, 64)
	for i := range prompt {
		prompt[i] = uint32(3000 + i)
	}
	reqs := []Request{{Prompt: prompt, MaxTokens: 20}, {Arrival: 10 * time.Second, Prompt: prompt, MaxTokens: 20}}
	res, err := Run(Config{Ranks: 4, Profile: p, Policy: dp.NewLiveLoad(8192), ExpertParallel: true}, reqs)
	if err != nil {
		t.Fatal(err)
	}
	if res.Waves != 2 {
		t.Fatalf("%d waves for two requests ten seconds apart, want 2", res.Waves)
	}
	working, dummy := 0, 0
	for _, r := range res.Ranks {
		working += r.Steps - r.DummySteps
		dummy += r.DummySteps
	}
	// Each request takes 20 steps on its rank (prefill, then 19 decodes),
	// each a dummy step on the three others; then the wave ends after one
	// more step in which no rank reports work, a dummy step on all four.
	if working != 40 || dummy != 2*(20*3+4) {
		t.Fatalf("%d working and %d dummy rank-steps, want 40 and 128", working, dummy)
	}
	if share := res.DummyShare(); share != 128.0/168 {
		t.Fatalf("dummy share %v, want 128/168", share)
	}
}

// TestRunTakesArrivalsInAnyOrder: Run streams the requests in the order
// of their arrivals, and hands each outcome back at its request's place.
func TestRunTakesArrivalsInAnyOrder(t *testing.T) {
	p := profile(t, "llama-3.1-8b-h100")
	reqs := workload(300, 40, 4)
	shuffled := slices.Clone(reqs)
	rand.New(rand.NewPCG(4, 4)).Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
	run := func(reqs []Request) map[time.Duration]Outcome {
		res, err := Run(Config{Ranks: 3, Profile: p, Policy: dp.NewLiveLoad(8192)}, reqs)
		if err != nil {
			t.Fatal(err)
		}
		byArrival := map[time.Duration]Outcome{}
		for i, o := range res.Requests {
			if o.Arrival != reqs[i].Arrival || o.PromptTokens != len(reqs[i].Prompt) {
				t.Fatalf("outcome %d is another request's: %+v", i, o)
			}
			byArrival[o.Arrival] = o
		}
		return byArrival
	}
	in, out := run(reqs), run(shuffled)
	for at, o := range in {
		if out[at] != o {
			t.Fatalf("request arriving at %v: %+v in order, %+v shuffled", at, o, out[at])
		}
	}
}

// TestStreamRefusesArrivalsBackInTime: a source must hand requests over
// in the order they arrive.
func TestStreamRefusesArrivalsBackInTime(t *testing.T) {
	p := profile(t, "llama-3.1-8b-h100")
	reqs := workload(20, 40, 5)
	reqs[10].Arrival = reqs[3].Arrival
	next := 0
	src := func() (Request, bool) {
		if next == len(reqs) {
			return Request{}, false
		}
		next++
		return reqs[next-1], true
	}
	if _, err := Stream(Config{Ranks: 2, Profile: p, Policy: &dp.RoundRobin{}}, src, discard{}); err == nil {
		t.Fatal("a request arriving before the one before it was taken")
	}
}

// TestBlocksHashedAheadMustFitThePrompt: block hashes handed over with a
// request are the prompt's, or the run stops.
func TestBlocksHashedAheadMustFitThePrompt(t *testing.T) {
	p := profile(t, "llama-3.1-8b-h100")
	req := workload(1, 1, 6)[0]
	req.Blocks = engine.PrefixHashes(req.Prompt[:len(req.Prompt)-32], p.BlockSize, "")
	if _, err := Run(Config{Ranks: 1, Profile: p, Policy: &dp.RoundRobin{}}, []Request{req}); err == nil {
		t.Fatal("a request with two blocks' hashes missing was taken")
	}
	req.Blocks = engine.PrefixHashes(req.Prompt, p.BlockSize, "")
	req.PromptHash = engine.PromptHash(req.Prompt, nil)
	res, err := Run(Config{Ranks: 1, Profile: p, Policy: &dp.RoundRobin{}}, []Request{req})
	if err != nil {
		t.Fatal(err)
	}
	req.Blocks, req.PromptHash = nil, 0
	again, err := Run(Config{Ranks: 1, Profile: p, Policy: &dp.RoundRobin{}}, []Request{req})
	if err != nil {
		t.Fatal(err)
	}
	if res.Requests[0] != again.Requests[0] {
		t.Fatalf("hashed ahead %+v, hashed by the run %+v", res.Requests[0], again.Requests[0])
	}
}

type discard struct{}

func (discard) Gap(time.Duration)  {}
func (discard) Ended(int, Outcome) {}

// TestACancelledRunStops: a run whose context is done returns its error
// instead of simulating on.
func TestACancelledRunStops(t *testing.T) {
	p := profile(t, "llama-3.1-8b-h100")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := Run(Config{Ranks: 4, Profile: p, Policy: dp.NewLiveLoad(8192), Context: ctx}, workload(2000, 40, 3))
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("a cancelled run returned %v, want context.Canceled", err)
	}
	res, err := Run(Config{Ranks: 4, Profile: p, Policy: dp.NewLiveLoad(8192), Context: context.Background()}, workload(2000, 40, 3))
	if err != nil || res.Events < cancelCheckEvents {
		t.Fatalf("a live context: %v after %d events (the check must have run)", err, res.Events)
	}
}
