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

func goldenLines(t *testing.T) []string {
	t.Helper()
	in, _ := ParseDist("lognormal:1000,1")
	out, _ := ParseDist("lognormal:200,1")
	items := Synthetic{Requests: goldenRequests, Input: in, Output: out, InputMax: 16384, OutputMax: 2048, MaxModelLen: 32768, Seed: 7}.Generate()
	Poisson(items, goldenRate, 7)
	p, err := sim.LoadProfile(dpnode.SimProfiles, "llama-3.1-8b-h100")
	if err != nil {
		t.Fatal(err)
	}
	res, err := runSim(Simulation{Ranks: goldenRanks, Profile: p, Seed: 7}, "live", items, Load{Open: true, Rate: goldenRate})
	if err != nil {
		t.Fatal(err)
	}
	lines := make([]string, len(res.Requests))
	for i, o := range res.Requests {
		lines[i] = fmt.Sprintf("%d,%d,%d,%d,%d,%d", o.Rank, o.Arrival, o.First, o.End, o.Tokens, o.CachedTokens)
	}
	return lines
}

// TestSimulatorDecisionsAreGolden holds the simulator to the decisions it
// made when they were recorded: every request's rank, arrival, first
// token, end, tokens and cached tokens. A change that is meant to change
// them (a policy, the cost model) writes them anew with -update and says
// so; one that is meant to make the simulator faster must not.
func TestSimulatorDecisionsAreGolden(t *testing.T) {
	if testing.Short() {
		t.Skip("512 ranks")
	}
	got := goldenLines(t)
	if *updateGolden {
		writeGolden(t, got)
		return
	}
	want := readGolden(t)
	if len(want) != len(got) {
		t.Fatalf("%d requests, the golden run has %d", len(got), len(want))
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("request %d: rank,arrival,first,end,tokens,cached = %s; the golden run's: %s (of %d requests, the first that differs)", i, got[i], want[i], len(want))
		}
	}
}

func writeGolden(t *testing.T, lines []string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(goldenFile), 0o755); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(goldenFile)
	if err != nil {
		t.Fatal(err)
	}
	zw, _ := gzip.NewWriterLevel(f, gzip.BestCompression)
	fmt.Fprintln(zw, "# rank,arrival_ns,first_token_ns,end_ns,tokens,cached_tokens: go test ./cmd/dpbench -run TestSimulatorDecisionsAreGolden -update")
	fmt.Fprintln(zw, strings.Join(lines, "\n"))
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

func readGolden(t *testing.T) []string {
	t.Helper()
	f, err := os.Open(goldenFile)
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
