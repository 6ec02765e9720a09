package main

import (
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestParseDist(t *testing.T) {
	good := map[string]Dist{
		"fixed:512":          {Kind: "fixed", A: 512},
		"uniform:10,20":      {Kind: "uniform", A: 10, B: 20},
		"lognormal:1000,1.2": {Kind: "lognormal", A: 1000, B: 1.2},
		"pareto:100,1.5":     {Kind: "pareto", A: 100, B: 1.5},
	}
	for s, want := range good {
		got, err := ParseDist(s)
		if err != nil || got != want {
			t.Errorf("ParseDist(%q) = %+v, %v; want %+v", s, got, err, want)
		}
	}
	for _, s := range []string{"", "normal:1,2", "fixed:", "fixed:1,2", "uniform:20,10", "lognormal:x,1", "fixed:0", "pareto:10,0", "uniform:-1,5"} {
		if _, err := ParseDist(s); err == nil {
			t.Errorf("ParseDist(%q) accepted", s)
		}
	}
}

func TestDistSamplesStayInRange(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	u := Dist{Kind: "uniform", A: 10, B: 20}
	f := Dist{Kind: "fixed", A: 7}
	p := Dist{Kind: "pareto", A: 100, B: 1.5}
	seen := map[int]bool{}
	for range 10000 {
		v := u.Sample(rng)
		if v < 10 || v > 20 {
			t.Fatalf("uniform:10,20 drew %d", v)
		}
		seen[v] = true
		if v := f.Sample(rng); v != 7 {
			t.Fatalf("fixed:7 drew %d", v)
		}
		if v := p.Sample(rng); v < 100 {
			t.Fatalf("pareto:100,1.5 drew %d", v)
		}
	}
	if len(seen) != 11 {
		t.Fatalf("uniform:10,20 drew %d distinct values, want all 11", len(seen))
	}
}

func TestSyntheticSharesPrefixesAndFits(t *testing.T) {
	s := Synthetic{Requests: 200, Input: Dist{Kind: "fixed", A: 100}, Output: Dist{Kind: "uniform", A: 1, B: 50},
		PrefixGroups: 3, PrefixLen: 64, MaxModelLen: 150, Seed: 5}
	items := s.Generate()
	prefixes := map[string]int{}
	for _, it := range items {
		if len(it.Prompt) != 149 || len(it.Prompt)+it.MaxTokens > 150 {
			t.Fatalf("a request of %d prompt tokens and %d to generate does not fit 150", len(it.Prompt), it.MaxTokens)
		}
		prefixes[fmtIDs(it.Prompt[:64])]++
	}
	if len(prefixes) != 3 {
		t.Fatalf("%d distinct 64-token prefixes, want the 3 groups", len(prefixes))
	}
	again := s.Generate()
	for i := range items {
		if !slices.Equal(items[i].Prompt, again[i].Prompt) || items[i].MaxTokens != again[i].MaxTokens {
			t.Fatalf("request %d differs between two generations of one seed", i)
		}
	}
}

func fmtIDs(ids []uint32) string {
	var b strings.Builder
	for _, id := range ids {
		b.WriteString(string(rune(id)))
	}
	return b.String()
}

func TestBurstsArriveTogetherAtTheSameMeanRate(t *testing.T) {
	items := make([]Item, 40000)
	Bursts(items, 50, 200, 1)
	for i := range items {
		if first := items[i/200*200].Arrival; items[i].Arrival != first {
			t.Fatalf("request %d arrives at %v, its burst at %v", i, items[i].Arrival, first)
		}
	}
	mean := items[len(items)-1].Arrival.Seconds() / float64(len(items)-200)
	if mean < 0.018 || mean > 0.022 {
		t.Fatalf("mean gap %.4fs at 50/s in bursts of 200, want about 0.02", mean)
	}
}

func TestPoissonSpacing(t *testing.T) {
	items := make([]Item, 20000)
	Poisson(items, 50, 1)
	mean := items[len(items)-1].Arrival.Seconds() / float64(len(items))
	if mean < 0.019 || mean > 0.021 {
		t.Fatalf("mean gap %.4fs at 50/s, want about 0.02", mean)
	}
	for i := 1; i < len(items); i++ {
		if items[i].Arrival < items[i-1].Arrival {
			t.Fatal("arrivals go back in time")
		}
	}
}

func TestLoadMooncakeStyleTrace(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "trace.jsonl")
	lines := `{"timestamp": 1000, "input_length": 1100, "output_length": 5, "hash_ids": [0, 1, 2]}
{"timestamp": 1500, "input_length": 600, "output_length": 7, "hash_ids": [0, 3]}

{"timestamp": 3000, "input_length": 20, "output_length": 1}
`
	if err := os.WriteFile(path, []byte(lines), 0o644); err != nil {
		t.Fatal(err)
	}
	items, err := LoadTrace(path, 512, 2, 0, 32768)
	if err != nil {
		t.Fatal(err)
	}
	if len(items) != 3 {
		t.Fatalf("%d requests, want 3", len(items))
	}
	// Arrivals from the first, twice as fast.
	if want := []time.Duration{0, 250 * time.Millisecond, time.Second}; items[0].Arrival != want[0] || items[1].Arrival != want[1] || items[2].Arrival != want[2] {
		t.Fatalf("arrivals %v %v %v, want %v", items[0].Arrival, items[1].Arrival, items[2].Arrival, want)
	}
	if len(items[0].Prompt) != 1100 || len(items[1].Prompt) != 600 || items[0].MaxTokens != 5 {
		t.Fatalf("lengths %d, %d", len(items[0].Prompt), len(items[1].Prompt))
	}
	// Hash id 0 is a shared 512-token block; what follows differs.
	if !slices.Equal(items[0].Prompt[:512], items[1].Prompt[:512]) || slices.Equal(items[0].Prompt[512:600], items[1].Prompt[512:600]) {
		t.Fatal("requests sharing hash id 0 must share exactly their first 512 tokens")
	}
	// At 16 tokens a hash id, prompts are 32 times shorter, and still
	// share exactly their first block.
	small, err := LoadTrace(path, 16, 1, 0, 32768)
	if err != nil {
		t.Fatal(err)
	}
	if len(small[0].Prompt) != 35 || len(small[1].Prompt) != 19 || len(small[2].Prompt) != 1 {
		t.Fatalf("scaled lengths %d, %d, %d; want 35, 19, 1", len(small[0].Prompt), len(small[1].Prompt), len(small[2].Prompt))
	}
	if !slices.Equal(small[0].Prompt[:16], small[1].Prompt[:16]) || slices.Equal(small[0].Prompt[16:19], small[1].Prompt[16:19]) {
		t.Fatal("scaled requests sharing hash id 0 must share exactly their first 16 tokens")
	}
	// --input-max and --output-max cut a trace as they cut drawn lengths.
	cutItems(items, 700, 6)
	if len(items[0].Prompt) != 700 || len(items[1].Prompt) != 600 || items[0].MaxTokens != 5 || items[1].MaxTokens != 6 {
		t.Fatalf("cut: prompts %d, %d; outputs %d, %d", len(items[0].Prompt), len(items[1].Prompt), items[0].MaxTokens, items[1].MaxTokens)
	}
	if _, err := LoadTrace(path, 512, 1, 1, 32768); err != nil {
		t.Fatal(err)
	}
	bad := filepath.Join(dir, "bad.jsonl")
	os.WriteFile(bad, []byte(`{"timestamp": 1, "input_length": 0, "output_length": 1}`), 0o644)
	if _, err := LoadTrace(bad, 512, 1, 0, 32768); err == nil || !strings.Contains(err.Error(), "line 1") {
		t.Fatalf("a zero-length prompt: %v", err)
	}
}

func TestLoadAzureStyleTrace(t *testing.T) {
	path := filepath.Join(t.TempDir(), "conv.csv")
	csv := "TIMESTAMP,ContextTokens,GeneratedTokens\n" +
		"2023-11-16 18:15:46.6805900,374,44\n" +
		"2023-11-16 18:15:50.9951690,396,0\n"
	if err := os.WriteFile(path, []byte(csv), 0o644); err != nil {
		t.Fatal(err)
	}
	items, err := LoadTrace(path, 512, 1, 0, 32768)
	if err != nil {
		t.Fatal(err)
	}
	if len(items) != 2 || len(items[0].Prompt) != 374 || items[1].MaxTokens != 1 {
		t.Fatalf("items %d: %d tokens, %d to generate", len(items), len(items[0].Prompt), items[1].MaxTokens)
	}
	if got, want := items[1].Arrival, 4314579*time.Microsecond; got != want {
		t.Fatalf("second arrival %v, want %v", got, want)
	}
}

// TestTheSharedTracesLoad reads the production traces this repository's
// benchmarks replay, where they are present.
func TestTheSharedTracesLoad(t *testing.T) {
	for _, p := range []string{"../../../shared/data/azure-llm-2023/conv.csv", "../../../shared/data/mooncake-fast25/conversation_trace.jsonl"} {
		if _, err := os.Stat(p); err != nil {
			t.Skipf("%s: not in this checkout's neighbourhood", p)
		}
		items, err := LoadTrace(p, TraceBlockTokens, 1, 1000, 32768)
		if err != nil {
			t.Fatal(err)
		}
		if len(items) != 1000 {
			t.Fatalf("%s: %d requests, want the first 1000", p, len(items))
		}
	}
}

func TestPercentilesAreNearestRank(t *testing.T) {
	var ds []time.Duration
	for i := 100; i >= 1; i-- {
		ds = append(ds, time.Duration(i)*time.Millisecond)
	}
	p := percentiles(ds)
	if p.P50 != 50 || p.P90 != 90 || p.P99 != 99 || p.Max != 100 || p.Mean != 50.5 {
		t.Fatalf("percentiles of 1..100 ms: %+v", p)
	}
	if (percentiles(nil) != Percentiles{}) {
		t.Fatal("percentiles of nothing")
	}
}

// TestSteadyThroughputLeavesTheDrainOut: two clients, each request 1 s,
// the last sent at 4 s, then one long straggler: the steady rate is 2/s.
func TestSteadyThroughputLeavesTheDrainOut(t *testing.T) {
	var outs []Outcome
	for i := range 5 {
		for range 2 {
			outs = append(outs, Outcome{Start: time.Duration(i) * time.Second, E2E: time.Second})
		}
	}
	outs[len(outs)-1].E2E = time.Minute
	if got := steadyThroughput(outs); got != 2 {
		t.Fatalf("steady throughput %v, want 2", got)
	}
}
