package main

import (
	"bufio"
	"compress/gzip"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	dpnode "github.com/dpnode/dpnode"
	"github.com/dpnode/dpnode/engine/sim"
)

var updateGolden = flag.Bool("update", false, "write the simulator's golden decisions anew")

// goldenSim is the run whose every decision is kept in testdata: the
// workload of docs/bench/balance.sh (prompts lognormal around 1,000 tokens,
// outputs around 200), 10,000 requests arriving at 80% of the capacity of
// 512 ranks, balanced by the live policy.
const (
	goldenRanks    = 512
	goldenRequests = 10000
	// goldenRate is 80% of 4,580.44 req/s, the capacity dpbench measured
	// for 512 ranks of the 8B profile (a rank's, in a closed loop of 256
	// clients, times the ranks): an input of the run, fixed so that the
	// run does not depend on the measurement.
	goldenRate = 3664.35
	goldenFile = "testdata/sim-512-live-10k.csv.gz"
)

// golden is a simulated run whose decisions are kept in a file.
type golden struct {
	file     string
	profile  string
	sim      Simulation
	requests int
	rate     float64
}

var goldens = []golden{
	{file: goldenFile, profile: "llama-3.1-8b-h100", sim: Simulation{Ranks: goldenRanks, Seed: 7}, requests: goldenRequests, rate: goldenRate},
	// Expert parallelism: 8 ranks of the MoE profile on two nodes of 4,
	// 150 requests at 2% of the 26.25 req/s dpbench measured for them in
	// lockstep, so that waves end and start again tens of times. Its
	// steps, dummy steps and waves are the wave loop the engine actors run
	// (dp.WaveStepper), and are kept too.
	{file: "testdata/sim-8-ep-live-150.csv.gz", profile: "qwen3-30b-a3b-h200",
		sim: Simulation{Ranks: 8, ExpertParallel: true, RanksPerNode: 4, Seed: 7}, requests: 150, rate: 0.525},
}

// lines are the run's decisions: a line per request (rank, arrival, first
// token, end, tokens, cached tokens, times in nanoseconds), then a line per
// rank (served, steps, dummy steps, busy) and one for the run (waves,
// events).
func (g golden) lines(t *testing.T) []string {
	t.Helper()
	in, _ := ParseDist("lognormal:1000,1")
	out, _ := ParseDist("lognormal:200,1")
	items := Synthetic{Requests: g.requests, Input: in, Output: out, InputMax: 16384, OutputMax: 2048, MaxModelLen: 32768, Seed: 7}.Generate()
	Poisson(items, g.rate, 7)
	p, err := sim.LoadProfile(dpnode.SimProfiles, g.profile)
	if err != nil {
		t.Fatal(err)
	}
	sm := g.sim
	sm.Profile = p
	res, err := runSim(sm, "live", items, Load{Open: true, Rate: g.rate})
	if err != nil {
		t.Fatal(err)
	}
	lines := make([]string, 0, len(res.Requests)+len(res.Ranks)+1)
	for _, o := range res.Requests {
		lines = append(lines, fmt.Sprintf("%d,%d,%d,%d,%d,%d", o.Rank, o.Arrival, o.First, o.End, o.Tokens, o.CachedTokens))
	}
	if g.file == goldenFile {
		// Recorded before ranks' and the run's lines were kept.
		return lines
	}
	for i, r := range res.Ranks {
		lines = append(lines, fmt.Sprintf("rank %d: %d,%d,%d,%d", i, r.Served, r.Steps, r.DummySteps, r.Busy))
	}
	return append(lines, fmt.Sprintf("run: %d,%d", res.Waves, res.Events))
}

// TestSimulatorDecisionsAreGolden holds the simulator to the decisions it
// made when they were recorded: every request's rank, arrival, first
// token, end, tokens and cached tokens, and with expert parallelism every
// rank's steps and dummy steps and the waves. A change that is meant to
// change them (a policy, the cost model) writes them anew with -update and
// says so; one that is meant to make the simulator faster must not.
func TestSimulatorDecisionsAreGolden(t *testing.T) {
	if testing.Short() {
		t.Skip("512 ranks")
	}
	for _, g := range goldens {
		t.Run(filepath.Base(g.file), func(t *testing.T) {
			got := g.lines(t)
			if *updateGolden {
				writeGolden(t, g.file, got)
				return
			}
			want := readGolden(t, g.file)
			if len(want) != len(got) {
				t.Fatalf("%d lines, the golden run has %d", len(got), len(want))
			}
			for i := range want {
				if got[i] != want[i] {
					t.Fatalf("line %d: %s; the golden run's: %s (of %d lines, the first that differs; requests are rank,arrival,first,end,tokens,cached)", i, got[i], want[i], len(want))
				}
			}
		})
	}
}

func writeGolden(t *testing.T, file string, lines []string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(file)
	if err != nil {
		t.Fatal(err)
	}
	zw, _ := gzip.NewWriterLevel(f, gzip.BestCompression)
	fmt.Fprintln(zw, "# per request rank,arrival_ns,first_token_ns,end_ns,tokens,cached_tokens; per rank served,steps,dummy_steps,busy_ns; waves,events: go test ./cmd/dpbench -run TestSimulatorDecisionsAreGolden -update")
	fmt.Fprintln(zw, strings.Join(lines, "\n"))
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

func readGolden(t *testing.T, file string) []string {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	sc := bufio.NewScanner(zr)
	for sc.Scan() {
		if line := sc.Text(); line != "" && !strings.HasPrefix(line, "#") {
			lines = append(lines, line)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return lines
}
