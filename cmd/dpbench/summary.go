package main

import (
	"cmp"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// Percentiles of a latency, in milliseconds.
type Percentiles struct {
	Mean float64 `json:"mean"`
	P50  float64 `json:"p50"`
	P90  float64 `json:"p90"`
	P99  float64 `json:"p99"`
	Max  float64 `json:"max"`
}

// percentiles sorts ds and reads its percentiles (nearest rank).
func percentiles(ds []time.Duration) Percentiles {
	if len(ds) == 0 {
		return Percentiles{}
	}
	slices.Sort(ds)
	at := func(q float64) float64 { return ms(ds[nearestRank(q, len(ds))]) }
	var sum time.Duration
	for _, d := range ds {
		sum += d
	}
	return Percentiles{Mean: ms(sum / time.Duration(len(ds))), P50: at(0.5), P90: at(0.9), P99: at(0.99), Max: ms(ds[len(ds)-1])}
}

// nearestRank is the index, from 0, of the q-th quantile of n sorted
// values.
func nearestRank(q float64, n int) int {
	return min(max(int(q*float64(n)+0.999999)-1, 0), n-1)
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// RankSpread is how requests spread over the ranks, from the servers'
// metrics (vllm:request_success_total by engine).
type RankSpread struct {
	Engines []string  `json:"engines"`
	Served  []float64 `json:"served"`
	// MinOverMean and MaxOverMean are 1 for a perfect spread.
	MinOverMean float64 `json:"min_over_mean"`
	MaxOverMean float64 `json:"max_over_mean"`
}

func newSpread(served map[string]float64) *RankSpread {
	if len(served) == 0 {
		return nil
	}
	s := &RankSpread{Engines: slices.SortedFunc(maps.Keys(served), func(a, b string) int {
		return cmp.Or(cmp.Compare(len(a), len(b)), cmp.Compare(a, b))
	})}
	var sum, lo, hi float64
	for i, e := range s.Engines {
		v := served[e]
		s.Served = append(s.Served, v)
		sum += v
		if i == 0 || v < lo {
			lo = v
		}
		hi = max(hi, v)
	}
	if mean := sum / float64(len(s.Served)); mean > 0 {
		s.MinOverMean, s.MaxOverMean = lo/mean, hi/mean
	}
	return s
}

// Summary is one run's results.
type Summary struct {
	Label string `json:"label"`
	// Load is the offered rate as a share of the measured capacity.
	Load        float64 `json:"load,omitempty"`
	OfferedRate float64 `json:"offered_rate,omitempty"`
	Concurrency int     `json:"concurrency,omitempty"`
	Sent        int     `json:"sent"`
	Completed   int     `json:"completed"`
	Failed      int     `json:"failed"`
	// DurationS runs from the first send to the last end, as vLLM's
	// benchmark_serving measures it.
	DurationS             float64     `json:"duration_s"`
	RequestThroughput     float64     `json:"request_throughput"`
	InputTokenThroughput  float64     `json:"input_token_throughput"`
	OutputTokenThroughput float64     `json:"output_token_throughput"`
	TTFT                  Percentiles `json:"ttft_ms"`
	ITL                   Percentiles `json:"itl_ms"`
	TPOT                  Percentiles `json:"tpot_ms"`
	E2E                   Percentiles `json:"e2e_ms"`
	// PercentileError bounds the relative error of the percentiles when
	// some latency had more values than are kept exactly (see latencies);
	// 0 when they are exact.
	PercentileError float64 `json:"percentile_rel_error,omitempty"`
	// Errors counts the failures by message.
	Errors map[string]int `json:"errors,omitempty"`
	Ranks  *RankSpread    `json:"ranks,omitempty"`
	// Probes are the --probe paths' answers during the run.
	Probes []ProbeSummary `json:"probes,omitempty"`
	// Simulated runs only.
	Simulated      bool    `json:"simulated,omitempty"`
	Policy         string  `json:"policy,omitempty"`
	NumRanks       int     `json:"num_ranks,omitempty"`
	DummyStepShare float64 `json:"dummy_step_share,omitempty"`
	CachedShare    float64 `json:"cached_prompt_share,omitempty"`
	SimWallS       float64 `json:"sim_wall_s,omitempty"`
	// Requests holds every request's timings, with --detail.
	Requests []Record `json:"requests,omitempty"`
	// StartedUnixMs is when a live run began sending: its requests'
	// start_ms count from it (dpbench timeline lines them up with events).
	StartedUnixMs int64 `json:"started_unix_ms,omitempty"`
}

// Record is one request's timings, in milliseconds from the run's start.
type Record struct {
	StartMs      float64 `json:"start_ms"`
	TTFTMs       float64 `json:"ttft_ms"`
	E2EMs        float64 `json:"e2e_ms"`
	PromptTokens int     `json:"prompt_tokens"`
	CachedTokens int     `json:"cached_tokens"`
	OutputTokens int     `json:"output_tokens"`
	Err          string  `json:"error,omitempty"`
}

// records lists the outcomes' timings, in the order they were sent.
func records(outs []Outcome) []Record {
	rs := make([]Record, len(outs))
	for i, o := range outs {
		rs[i] = Record{StartMs: ms(o.Start), TTFTMs: ms(o.TTFT), E2EMs: ms(o.E2E), PromptTokens: o.PromptTokens, CachedTokens: o.CachedTokens, OutputTokens: o.OutputTokens, Err: o.Err}
	}
	return rs
}

// summarize computes a run's summary from its outcomes.
func summarize(label string, outs []Outcome, elapsed time.Duration) Summary {
	var t tally
	for _, o := range outs {
		t.add(o)
	}
	return t.summary(label, elapsed)
}

// tally sums a run up one outcome at a time, so that a simulation of a
// million requests need keep none of them.
type tally struct {
	sent, completed, failed int
	errors                  map[string]int
	in, out                 int
	ttft, e2e, tpot, itl    latencies
}

// add counts an outcome, and its inter-token gaps, in.
func (t *tally) add(o Outcome) {
	t.sent++
	for _, g := range o.Gaps {
		t.itl.add(g)
	}
	if o.Err != "" {
		t.failed++
		if t.errors == nil {
			t.errors = map[string]int{}
		}
		t.errors[o.Err]++
		return
	}
	t.completed++
	t.in += o.PromptTokens
	t.out += o.OutputTokens
	t.ttft.add(o.TTFT)
	t.e2e.add(o.E2E)
	if o.OutputTokens > 1 {
		t.tpot.add((o.E2E - o.TTFT) / time.Duration(o.OutputTokens-1))
	}
}

// gap counts an inter-token gap in, for outcomes that come without theirs.
func (t *tally) gap(d time.Duration) { t.itl.add(d) }

// summary is the run's summary, over elapsed.
func (t *tally) summary(label string, elapsed time.Duration) Summary {
	s := Summary{Label: label, Sent: t.sent, Completed: t.completed, Failed: t.failed, Errors: t.errors, DurationS: elapsed.Seconds()}
	if elapsed > 0 {
		s.RequestThroughput = float64(s.Completed) / elapsed.Seconds()
		s.InputTokenThroughput = float64(t.in) / elapsed.Seconds()
		s.OutputTokenThroughput = float64(t.out) / elapsed.Seconds()
	}
	s.TTFT, s.E2E, s.TPOT, s.ITL = t.ttft.percentiles(), t.e2e.percentiles(), t.tpot.percentiles(), t.itl.percentiles()
	if t.ttft.approximate() || t.e2e.approximate() || t.tpot.approximate() || t.itl.approximate() {
		s.PercentileError = PercentileError
	}
	return s
}

// printTable writes the summaries as an aligned table.
func printTable(w io.Writer, sums []Summary) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "run\tload\trate\treq/s\tout tok/s\tTTFT p50\tTTFT p90\tTTFT p99\tITL p50\tITL p99\tE2E p50\tE2E p99\tfailed\tranks min/max of mean\t")
	for _, s := range sums {
		load, rate, spread := "-", "-", "-"
		if s.Load > 0 {
			load = fmt.Sprintf("%.0f%%", 100*s.Load)
		}
		switch {
		case s.OfferedRate > 0:
			rate = fmt.Sprintf("%.2f/s", s.OfferedRate)
		case s.Concurrency > 0:
			rate = fmt.Sprintf("c=%d", s.Concurrency)
		}
		if s.Ranks != nil {
			spread = fmt.Sprintf("%.2f/%.2f", s.Ranks.MinOverMean, s.Ranks.MaxOverMean)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%.2f\t%.0f\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\t\n", s.Label, load, rate,
			s.RequestThroughput, s.OutputTokenThroughput, fmtMs(s.TTFT.P50), fmtMs(s.TTFT.P90), fmtMs(s.TTFT.P99),
			fmtMs(s.ITL.P50), fmtMs(s.ITL.P99), fmtMs(s.E2E.P50), fmtMs(s.E2E.P99), s.Failed, spread)
	}
	tw.Flush()
	for _, s := range sums {
		if s.PercentileError > 0 {
			fmt.Fprintf(w, "percentiles: exact up to %d values of a latency, past that read from log buckets, within %.2f%%\n", exactLimit, 100*s.PercentileError)
			break
		}
	}
	printProbes(w, sums)
	for _, s := range sums {
		if len(s.Errors) == 0 {
			continue
		}
		msgs := slices.SortedFunc(maps.Keys(s.Errors), func(a, b string) int { return s.Errors[b] - s.Errors[a] })
		fmt.Fprintf(w, "%s: %d failed; most frequent: %d× %s\n", s.Label, s.Failed, s.Errors[msgs[0]], strings.TrimSpace(msgs[0]))
	}
}

func fmtMs(v float64) string {
	if v >= 1000 {
		return fmt.Sprintf("%.2fs", v/1000)
	}
	return fmt.Sprintf("%.1fms", v)
}
