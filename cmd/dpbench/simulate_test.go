package main

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	dpnode "github.com/dpnode/dpnode"
	"github.com/dpnode/dpnode/dp/vsim"
	"github.com/dpnode/dpnode/engine/sim"
)

// outcomes keeps a streamed run's outcomes, by request.
type outcomes []vsim.Outcome

func (o *outcomes) Gap(time.Duration) {}
func (o *outcomes) Ended(i int, out vsim.Outcome) {
	if i >= len(*o) {
		*o = append(*o, make([]vsim.Outcome, i+1-len(*o))...)
	}
	(*o)[i] = out
}

// TestStreamedSimulationIsGolden runs the golden run the way dpbench runs
// a simulation of any size, drawing each request when the simulation
// reaches it, hashed ahead on another goroutine, and holds it to the same
// decisions as TestSimulatorDecisionsAreGolden.
func TestStreamedSimulationIsGolden(t *testing.T) {
	if testing.Short() {
		t.Skip("512 ranks")
	}
	in, _ := ParseDist("lognormal:1000,1")
	out, _ := ParseDist("lognormal:200,1")
	work := Synthetic{Requests: goldenRequests, Input: in, Output: out, InputMax: 16384, OutputMax: 2048, MaxModelLen: 32768, Seed: 7}
	p, err := sim.LoadProfile(dpnode.SimProfiles, "llama-3.1-8b-h100")
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := simConfig(Simulation{Ranks: goldenRanks, Profile: p, Seed: 7}, "live", Load{Open: true, Rate: goldenRate})
	if err != nil {
		t.Fatal(err)
	}
	src, stop := prefetch(InBursts(work.Items(), goldenRate, 1, 7), cfg.Scheduler.BlockSize)
	defer stop()
	var got outcomes
	if _, err := vsim.Stream(cfg, src, &got); err != nil {
		t.Fatal(err)
	}
	want := readGolden(t, goldenFile)
	if len(got) != len(want) {
		t.Fatalf("%d requests, the golden run has %d", len(got), len(want))
	}
	for i, o := range got {
		if line := fmt.Sprintf("%d,%d,%d,%d,%d,%d", o.Rank, o.Arrival, o.First, o.End, o.Tokens, o.CachedTokens); line != want[i] {
			t.Fatalf("request %d: rank,arrival,first,end,tokens,cached = %s; the golden run's: %s", i, line, want[i])
		}
	}
}

// TestItemsAreGenerate: drawn one at a time, with arrivals, a workload is
// the one Generate and Bursts make.
func TestItemsAreGenerate(t *testing.T) {
	in, _ := ParseDist("lognormal:300,1")
	out, _ := ParseDist("uniform:1,40")
	s := Synthetic{Requests: 300, Input: in, Output: out, InputMax: 900, PrefixGroups: 4, PrefixLen: 32, MaxModelLen: 1000, Seed: 3}
	want := s.Generate()
	Bursts(want, 50, 3, 9)
	got := collect(InBursts(s.Items(), 50, 3, 9))
	if len(got) != len(want) {
		t.Fatalf("%d items drawn, Generate made %d", len(got), len(want))
	}
	for i := range want {
		if got[i].Arrival != want[i].Arrival || got[i].MaxTokens != want[i].MaxTokens || !slices.Equal(got[i].Prompt, want[i].Prompt) {
			t.Fatalf("item %d differs", i)
		}
	}
}

// TestLatenciesPastTheExactLimit: past exactLimit values, percentiles
// stay within PercentileError of the exact ones; mean and maximum stay
// exact.
func TestLatenciesPastTheExactLimit(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 1))
	var l latencies
	var all []time.Duration
	for range 3 * exactLimit {
		d := time.Duration(rng.ExpFloat64() * float64(20*time.Millisecond))
		if rng.IntN(50) == 0 {
			d = time.Duration(rng.IntN(200)) // the exact buckets
		}
		l.add(d)
		all = append(all, d)
	}
	if !l.approximate() {
		t.Fatal("still exact past the limit")
	}
	got, want := l.percentiles(), percentiles(all)
	if got.Mean != want.Mean || got.Max != want.Max {
		t.Fatalf("mean %v, max %v; want %v and %v exactly", got.Mean, got.Max, want.Mean, want.Max)
	}
	// Percentiles are read in milliseconds rounded to the microsecond.
	for _, q := range [][2]float64{{got.P50, want.P50}, {got.P90, want.P90}, {got.P99, want.P99}} {
		if diff := q[0] - q[1]; diff > q[1]*PercentileError+0.001 || -diff > q[1]*PercentileError+0.001 {
			t.Fatalf("percentile %v ms, exactly %v ms: off by more than %.2f%%", q[0], q[1], 100*PercentileError)
		}
	}
	var few latencies
	for _, d := range all[:1000] {
		few.add(d)
	}
	if few.approximate() || few.percentiles() != percentiles(all[:1000]) {
		t.Fatal("a thousand values are not read exactly")
	}
}

// TestBucketsBoundTheirValues: every value's bucket midpoint is within
// PercentileError of it.
func TestBucketsBoundTheirValues(t *testing.T) {
	rng := rand.New(rand.NewPCG(2, 2))
	for range 100000 {
		d := time.Duration(rng.Int64N(1<<uint(rng.IntN(62)) + 1))
		mid := bucketMid(bucketOf(d))
		if err := float64(mid-d) / float64(max(d, 1)); err > PercentileError || -err > PercentileError {
			t.Fatalf("%d reads as %d", d, mid)
		}
	}
}
