// Command dpbench measures an OpenAI-compatible LLM endpoint (dpnode,
// vLLM, or anything that streams /v1/completions), or, with --simulate,
// dpnode's scheduler and balancing policies in virtual time.
//
//	dpbench --url http://127.0.0.1:8000 --rate 2,4,8 --requests 500 --plot latency.svg
//	dpbench --simulate --ranks 64 --policy all --load 0.5,0.8,0.95 --out sim.json
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	dpnode "github.com/dpnode/dpnode"
	"github.com/dpnode/dpnode/dp"
	"github.com/dpnode/dpnode/engine/sim"
)

// options are dpbench's flags.
type options struct {
	url         string
	model       string
	apiKey      string
	metricsURLs []string
	probes      []string

	rates       []float64
	concurrency []int
	loads       []float64
	capacity    float64
	saturation  int
	maxInFlight int
	burst       int
	requests    int
	duration    time.Duration
	timeout     time.Duration

	input, output  string
	inputMax       int
	outputMax      int
	label          string
	prefixGroups   int
	prefixLen      int
	trace          string
	traceSpeed     float64
	traceBlock     int
	maxModelLen    int
	seed           uint64
	out, plot      string
	title          string
	quiet          bool
	noStream       bool
	noKeepAlive    bool
	temperature    float64
	temperatureSet bool
	logprobs       int
	jsonSchema     string
	detail         bool
	simulate       bool
	ranks          int
	profile        string
	policies       []string
	expertParallel bool
	ranksPerNode   int
}

func main() {
	if err := newCommand().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "dpbench:", err)
		os.Exit(1)
	}
}

func newCommand() *cobra.Command {
	o := &options{}
	cmd := &cobra.Command{
		Use:   "dpbench",
		Short: "Load an OpenAI-compatible LLM endpoint, or simulate dpnode's balancing in virtual time",
		Long: `dpbench sends a workload to an OpenAI-compatible endpoint (streaming /v1/completions with
token-id prompts) and reports TTFT, inter-token latency and end-to-end latency at p50/p90/p99,
throughput, and how requests spread over the ranks (from /metrics). Load is an open loop at
Poisson rates (--rate), a closed loop at fixed concurrencies (--concurrency), or shares of the
measured capacity (--load). With --simulate it runs dpnode's real scheduler, balancing policies
and wave logic over --ranks simulated ranks in virtual time instead, drawing each request as the
simulation reaches it, so that a run of a million requests holds only those in flight.
Percentiles are the nearest rank: exact up to 65,536 values of a latency, and past that (the
inter-token gaps of a long run) read from log buckets, within 0.4%.`,
		SilenceUsage:  true,
		SilenceErrors: true,
		Args:          cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			o.temperatureSet = cmd.Flags().Changed("temperature")
			return run(ctx, o, cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	cmd.AddCommand(newBareCommand(), newPlotCommand(), newTimelineCommand())
	f := cmd.Flags()
	f.StringVar(&o.url, "url", "http://127.0.0.1:8000", "the endpoint's base URL (without /v1)")
	f.StringVar(&o.model, "model", "", "model to ask for (default: the first the server lists)")
	f.StringVar(&o.apiKey, "api-key", os.Getenv("OPENAI_API_KEY"), "bearer token (default: $OPENAI_API_KEY)")
	f.StringSliceVar(&o.metricsURLs, "metrics-url", nil, "Prometheus endpoints to read the spread over ranks from (default: URL/metrics; none: off)")
	f.StringSliceVar(&o.probes, "probe", nil, "GET these paths (as /health,/metrics) every 50 ms during each run and report their latency and non-200 answers")
	f.Float64SliceVar(&o.rates, "rate", nil, "open loop: Poisson arrival rates in requests/s, one run each")
	f.IntSliceVar(&o.concurrency, "concurrency", nil, "closed loop: numbers of clients, one run each")
	f.Float64SliceVar(&o.loads, "load", nil, "open loop at these shares of the capacity (0.8: 80%), one run each")
	f.Float64Var(&o.capacity, "capacity", 0, "the capacity --load refers to, in requests/s (default: measured in a closed loop first)")
	f.IntVar(&o.saturation, "saturation-concurrency", 0, "clients of the closed loop that measures the capacity (default 256: one rank's --max-num-seqs)")
	f.IntVar(&o.burst, "burst", 1, "open loop: requests arrive in bursts of this many at the same instant, at the same mean rate")
	f.IntVar(&o.maxInFlight, "max-concurrency", 0, "cap on requests in flight in an open loop; later ones wait (0: none)")
	f.IntVar(&o.requests, "requests", 500, "requests per run")
	f.DurationVar(&o.duration, "duration", 0, "stop sending after this long in each run (0: when the requests are sent)")
	f.DurationVar(&o.timeout, "timeout", 10*time.Minute, "limit on one request")
	f.StringVar(&o.input, "input-len", "lognormal:1000,1", "prompt lengths: fixed:N, uniform:LO,HI, lognormal:MEDIAN,SIGMA or pareto:MIN,ALPHA")
	f.StringVar(&o.output, "output-len", "lognormal:200,1", "output lengths, as --input-len")
	f.IntVar(&o.inputMax, "input-max", 0, "cut prompt lengths, drawn or a trace's, to this (0: no cut)")
	f.IntVar(&o.outputMax, "output-max", 0, "cut output lengths, drawn or a trace's, to this (0: no cut)")
	f.StringVar(&o.label, "label", "", "name this target's runs in the table, the JSON and plots (dpbench plot merges several)")
	f.IntVar(&o.prefixGroups, "prefix-groups", 0, "give each prompt one of this many shared prefixes")
	f.IntVar(&o.prefixLen, "prefix-len", 1024, "tokens of each shared prefix")
	f.StringVar(&o.trace, "trace", "", "replay a trace: JSON lines (timestamp ms, input_length, output_length, hash_ids) or Azure's CSV")
	f.Float64Var(&o.traceSpeed, "trace-speed", 1, "replay the trace this many times faster (ignored with --rate or --load)")
	f.IntVar(&o.traceBlock, "trace-block-tokens", TraceBlockTokens, "tokens per hash id of the trace; its prompt lengths scale with it (16 divides them by 32)")
	f.IntVar(&o.maxModelLen, "max-model-len", 32768, "cut prompts and outputs to fit this context")
	f.Uint64Var(&o.seed, "seed", 1, "seed of the workload and of random policies")
	f.StringVar(&o.out, "out", "", "write the results as JSON here")
	f.StringVar(&o.plot, "plot", "", "draw latency percentiles against load here (.svg, .png or .pdf)")
	f.StringVar(&o.title, "title", "", "the plot's title")
	f.BoolVar(&o.quiet, "quiet", false, "no progress bar")
	f.BoolVar(&o.noStream, "no-stream", false, "ask for whole responses: end-to-end latency only, at the least client cost (TTFT then reads as E2E)")
	f.BoolVar(&o.noKeepAlive, "no-keepalive", false, "a connection per request (for servers that close idle connections under the client, which POSTs cannot be retried on)")
	f.Float64Var(&o.temperature, "temperature", 0, "send this temperature with every request (default: the server's; 0 is greedy)")
	f.IntVar(&o.logprobs, "logprobs", -1, "ask every request for its tokens' log-probabilities and this many top ones each (-1: none)")
	f.StringVar(&o.jsonSchema, "json-schema", "", "constrain every request's output to the JSON schema in this file (structured output; the output still runs to its length, ignore_eos)")
	f.BoolVar(&o.detail, "detail", false, "also write every request's timings to --out (start, TTFT, end-to-end, prompt, cached and output tokens, error)")
	f.BoolVar(&o.simulate, "simulate", false, "run the virtual-time simulator instead of an endpoint")
	f.IntVar(&o.ranks, "ranks", 4, "simulated data-parallel ranks")
	f.StringVar(&o.profile, "sim-profile", "llama-3.1-8b-h100", "simulated model and GPU: "+strings.Join(sim.ProfileNames(dpnode.SimProfiles), ", ")+", or a profile .json")
	f.StringSliceVar(&o.policies, "policy", []string{dp.PolicyLive}, "simulated balancing policies: "+strings.Join(dp.PolicyNames, ", ")+", or all")
	f.BoolVar(&o.expertParallel, "expert-parallel", false, "simulate MoE ranks stepping in lockstep waves")
	f.IntVar(&o.ranksPerNode, "ranks-per-node", 8, "simulated ranks per node: an expert-parallel group across nodes pays the cross-node all-to-all")
	return cmd
}

// report is what --out writes.
type report struct {
	Command  []string  `json:"command"`
	Target   string    `json:"target"`
	Workload string    `json:"workload"`
	Capacity float64   `json:"capacity_rps,omitempty"`
	Runs     []Summary `json:"runs"`
}

// runSpec is one run: an open loop at a rate, or a closed loop.
type runSpec struct {
	load Load
	// share is the rate's share of the capacity, for --load.
	share float64
}

// benchFunc runs one load of items, under a simulated policy ("" against
// an endpoint), showing label as its progress, and returns its summary and
// every request's outcome.
type benchFunc func(next Items, l Load, policy, label string) (Summary, []Outcome, error)

// run is dpbench: it sets up the bench (simulated or an endpoint), runs
// every load under every policy, and reports the runs.
func run(ctx context.Context, o *options, stdout, stderr io.Writer) error {
	if err := o.check(); err != nil {
		return err
	}
	base, describe, err := o.workload(o.requests, o.seed)
	if err != nil {
		return err
	}
	progress := stderr
	if o.quiet {
		progress = io.Discard
	}
	var (
		bench  benchFunc
		sm     Simulation
		target = o.url
	)
	if o.simulate {
		bench, sm, target, err = o.simulatedBench(ctx, progress)
	} else {
		bench, err = o.endpointBench(ctx, progress, stderr)
	}
	if err != nil {
		return err
	}
	policies := []string{""}
	if o.simulate {
		policies = o.policies
	}
	rep := report{Command: os.Args, Target: target, Workload: describe}
	specs := o.specs()
	if len(o.loads) > 0 {
		rep.Capacity = o.capacity
		if rep.Capacity == 0 {
			if rep.Capacity, err = o.measureCapacity(ctx, bench, sm, policies[0], base, stdout); err != nil {
				return err
			}
		}
		for _, share := range o.loads {
			specs = append(specs, runSpec{load: Load{Open: true, Rate: share * rep.Capacity}, share: share})
		}
	}
	for _, spec := range specs {
		for _, policy := range policies {
			s, err := o.runOne(bench, base, spec, policy)
			if err != nil {
				return err
			}
			rep.Runs = append(rep.Runs, s)
		}
	}
	return o.writeReport(stdout, rep)
}

// simulatedBench is the bench of --simulate, which runs each load on the
// --sim-profile's ranks in virtual time. It returns the simulation too,
// which measureCapacity reruns, and the target the report names.
func (o *options) simulatedBench(ctx context.Context, progress io.Writer) (benchFunc, Simulation, string, error) {
	profile, err := sim.LoadProfile(dpnode.SimProfiles, o.profile)
	if err != nil {
		return nil, Simulation{}, "", err
	}
	sm := Simulation{Ranks: o.ranks, Profile: profile, ExpertParallel: o.expertParallel, RanksPerNode: o.ranksPerNode, Seed: o.seed, Context: ctx}
	target := fmt.Sprintf("simulated: %d ranks of %s (policies %s)", o.ranks, profile.Name, strings.Join(o.policies, ", "))
	bench := func(next Items, l Load, policy, label string) (Summary, []Outcome, error) {
		fmt.Fprintf(progress, "%s: simulating...\r", label)
		return simulate(sm, policy, next, l, o.detail)
	}
	return bench, sm, target, nil
}

// endpointBench is the bench of an endpoint: each run sends its requests
// while probing the server, and reads the spread over ranks from the
// servers' metrics before and after. Once the metrics cannot be read, the
// later runs stop trying.
func (o *options) endpointBench(ctx context.Context, progress, stderr io.Writer) (benchFunc, error) {
	t, err := o.endpoint(ctx)
	if err != nil {
		return nil, err
	}
	metrics := o.metricsURLs
	if len(metrics) == 0 {
		metrics = []string{t.BaseURL + "/metrics"}
	}
	if slices.Equal(metrics, []string{"none"}) {
		metrics = nil
	}
	return func(next Items, l Load, _, label string) (Summary, []Outcome, error) {
		items := collect(next)
		var before map[string]float64
		if metrics != nil {
			var err error
			if before, err = scrapeServed(ctx, t.Client, metrics); err != nil {
				fmt.Fprintf(stderr, "dpbench: no spread over ranks: %v\n", err)
				metrics = nil
			}
		}
		probeCtx, stopProbes := context.WithCancel(ctx)
		probed := make(chan []ProbeSummary, 1)
		go func() { probed <- probe(probeCtx, NewHTTPClient(), t.BaseURL, o.probes) }()
		started := time.Now()
		outs, elapsed := send(ctx, t, items, l, progress, label)
		stopProbes()
		probes := <-probed
		if ctx.Err() != nil {
			return Summary{}, nil, ctx.Err()
		}
		s := summarize(label, outs, elapsed)
		s.Probes, s.StartedUnixMs = probes, started.UnixMilli()
		if metrics != nil {
			if after, err := scrapeServed(ctx, t.Client, metrics); err == nil {
				s.Ranks = newSpread(servedDelta(before, after))
			}
		}
		return s, outs, nil
	}, nil
}

// endpoint is the --url endpoint with the request options of the flags,
// asking it for its model unless --model names one.
func (o *options) endpoint(ctx context.Context) (*Target, error) {
	t := &Target{BaseURL: strings.TrimRight(o.url, "/"), Model: o.model, APIKey: o.apiKey, Client: NewHTTPClient(), NoStream: o.noStream}
	if o.noKeepAlive {
		t.Client.Transport.(*http.Transport).DisableKeepAlives = true
	}
	if o.temperatureSet {
		t.Temperature = &o.temperature
	}
	if o.logprobs >= 0 {
		t.Logprobs = &o.logprobs
	}
	if o.jsonSchema != "" {
		b, err := os.ReadFile(o.jsonSchema)
		if err != nil {
			return nil, err
		}
		if !json.Valid(b) {
			return nil, fmt.Errorf("--json-schema %s: not JSON", o.jsonSchema)
		}
		t.Schema = b
	}
	if t.Model == "" {
		var err error
		if t.Model, err = t.DiscoverModel(ctx); err != nil {
			return nil, fmt.Errorf("%s: %w", o.url, err)
		}
	}
	return t, nil
}

// runOne runs spec under policy on a fresh pass of the workload and
// summarizes it as the report shows it.
func (o *options) runOne(bench benchFunc, base Workload, spec runSpec, policy string) (Summary, error) {
	l := spec.load
	l.MaxInFlight, l.Duration, l.Timeout = o.maxInFlight, o.duration, o.timeout
	next := base()
	if l.Rate > 0 {
		next = InBursts(next, l.Rate, o.burst, o.seed)
	}
	name := policy
	if o.label != "" {
		name = o.label
	}
	label := runLabel(name, spec)
	s, outs, err := bench(next, l, policy, label)
	if err != nil {
		return Summary{}, err
	}
	if o.detail {
		s.Requests = records(outs)
	}
	if o.label != "" {
		s.Policy = o.label
	}
	s.Load, s.OfferedRate, s.Concurrency = spec.share, l.Rate, l.Concurrency
	if l.Open {
		s.Concurrency = 0
	}
	return s, nil
}

// writeReport prints the table of rep's runs, and writes them as JSON to
// --out and as a plot to --plot where those are given.
func (o *options) writeReport(stdout io.Writer, rep report) error {
	fmt.Fprintf(stdout, "target: %s\nworkload: %s\n", rep.Target, rep.Workload)
	printTable(stdout, rep.Runs)
	if o.out != "" {
		b, err := json.MarshalIndent(rep, "", "  ")
		if err != nil {
			return err
		}
		if err := os.WriteFile(o.out, append(b, '\n'), 0o644); err != nil {
			return err
		}
	}
	if o.plot != "" {
		title := o.title
		if title == "" {
			title = rep.Target
		}
		if err := savePlot(o.plot, title, rep.Runs); err != nil {
			return err
		}
	}
	return nil
}

func runLabel(policy string, spec runSpec) string {
	var what string
	switch {
	case spec.share > 0:
		what = fmt.Sprintf("%.0f%% load", 100*spec.share)
	case spec.load.Rate > 0:
		what = fmt.Sprintf("%g req/s", spec.load.Rate)
	case spec.load.Open:
		what = "trace pace"
	default:
		what = fmt.Sprintf("%d clients", spec.load.Concurrency)
	}
	if policy != "" {
		return policy + " " + what
	}
	return what
}

// specs lists the runs --rate and --concurrency ask for.
func (o *options) specs() []runSpec {
	var specs []runSpec
	for _, r := range o.rates {
		specs = append(specs, runSpec{load: Load{Open: true, Rate: r}})
	}
	for _, c := range o.concurrency {
		specs = append(specs, runSpec{load: Load{Concurrency: c}})
	}
	if len(specs) == 0 && len(o.loads) == 0 && o.trace != "" {
		// A trace alone replays at its own pace.
		specs = append(specs, runSpec{load: Load{Open: true}})
	}
	return specs
}

func (o *options) check() error {
	if slices.Contains(o.policies, "all") {
		o.policies = slices.Clone(dp.PolicyNames)
	}
	for _, p := range o.policies {
		if _, err := dp.NewPolicy(p, dp.PolicyConfig{}); err != nil {
			return err
		}
	}
	switch {
	case len(o.rates) == 0 && len(o.concurrency) == 0 && len(o.loads) == 0 && o.trace == "":
		return errors.New("say how to load: --rate, --concurrency, --load, or --trace to replay a trace at its own pace")
	case o.requests < 1:
		return fmt.Errorf("--requests must be at least 1, got %d", o.requests)
	case o.simulate && o.ranks < 1:
		return fmt.Errorf("--ranks must be at least 1, got %d", o.ranks)
	case !o.simulate && len(o.policies) > 1:
		return errors.New("--policy chooses simulated policies; against an endpoint, the server's --balance-policy decides")
	case o.timeout <= 0:
		return errors.New("--timeout must be positive")
	case o.burst < 1:
		return fmt.Errorf("--burst must be at least 1, got %d", o.burst)
	}
	for _, r := range o.rates {
		if r <= 0 {
			return fmt.Errorf("--rate must be positive, got %v", r)
		}
	}
	for _, c := range o.concurrency {
		if c < 1 {
			return fmt.Errorf("--concurrency must be at least 1, got %d", c)
		}
	}
	for _, l := range o.loads {
		if l <= 0 {
			return fmt.Errorf("--load must be positive, got %v", l)
		}
	}
	return nil
}

// measureCapacity is the steady throughput of a closed loop of
// --saturation-concurrency clients (256 per rank by default): against an
// endpoint, of the workload itself; simulated, of one rank on a workload
// twenty times the clients, times the ranks (a closed loop that saturates
// hundreds of ranks would need millions of requests); with expert
// parallelism, of the whole group on five times its clients.
func (o *options) measureCapacity(ctx context.Context, bench func(Items, Load, string, string) (Summary, []Outcome, error),
	sm Simulation, policy string, base Workload, stdout io.Writer) (float64, error) {
	conc := o.saturation
	if conc == 0 {
		conc = 256
	}
	if !o.simulate {
		_, outs, err := bench(base(), Load{Concurrency: conc, Timeout: o.timeout, Duration: o.duration}, policy, fmt.Sprintf("capacity (%d clients)", conc))
		if err != nil {
			return 0, err
		}
		per, err := capacityOf(outs)
		if err == nil {
			fmt.Fprintf(stdout, "capacity: %.2f requests/s (closed loop of %d clients, %d requests)\n", per, conc, len(outs))
		}
		return per, err
	}
	// Independent ranks: one rank, times the ranks. Ranks in lockstep are
	// not independent (each step waits for the slowest rank and pays the
	// all-to-all), so the whole group runs.
	run, clients, n, scale := sm, conc*sm.Ranks, 5*conc*sm.Ranks, 1.0
	if !sm.ExpertParallel {
		run.Ranks, clients, n, scale = 1, conc, 20*conc, float64(sm.Ranks)
	}
	work, _, err := o.workload(n, o.seed+1)
	if err != nil {
		return 0, err
	}
	_, outs, err := simulate(run, policy, work(), Load{Concurrency: clients}, true)
	if err != nil {
		return 0, err
	}
	per, err := capacityOf(outs)
	if err != nil {
		return 0, err
	}
	if sm.ExpertParallel {
		fmt.Fprintf(stdout, "capacity: %.2f requests/s (%d ranks in lockstep, closed loop of %d clients, %d requests)\n", per, sm.Ranks, clients, len(outs))
	} else {
		fmt.Fprintf(stdout, "capacity: %.2f requests/s = %d ranks × %.2f (one rank, closed loop of %d clients, %d requests)\n", per*scale, sm.Ranks, per, clients, len(outs))
	}
	return per * scale, nil
}

// capacityOf is the steady throughput of a saturated closed loop's
// outcomes, or why there is none.
func capacityOf(outs []Outcome) (float64, error) {
	if per := steadyThroughput(outs); per > 0 {
		return per, nil
	}
	return 0, errors.New("measuring the capacity: no request completed while every client was busy; send more requests (--requests) or fewer clients (--saturation-concurrency)")
}

// steadyThroughput is the throughput of a closed loop while all its
// clients were busy: the requests that ended by the time the last one was
// sent, over that time. The drain after it, when clients run out of work
// and the longest requests finish alone, is left out.
func steadyThroughput(outs []Outcome) float64 {
	var last time.Duration
	for _, o := range outs {
		last = max(last, o.Start)
	}
	n := 0
	for _, o := range outs {
		if o.Err == "" && o.Start+o.E2E <= last {
			n++
		}
	}
	if last <= 0 {
		return 0
	}
	return float64(n) / last.Seconds()
}

// workload is n requests of the workload, and what they are.
func (o *options) workload(n int, seed uint64) (Workload, string, error) {
	if o.inputMax < 0 || o.outputMax < 0 {
		return nil, "", errors.New("--input-max and --output-max must not be negative")
	}
	if o.trace != "" {
		items, err := LoadTrace(o.trace, o.traceBlock, o.traceSpeed, n, o.maxModelLen)
		if err != nil {
			return nil, "", err
		}
		cutItems(items, o.inputMax, o.outputMax)
		describe := fmt.Sprintf("trace %s, first %d requests", o.trace, len(items))
		if o.inputMax > 0 || o.outputMax > 0 {
			describe += fmt.Sprintf(" (cut at %d and %d)", o.inputMax, o.outputMax)
		}
		return func() Items { return sliceItems(items) }, describe, nil
	}
	in, err := ParseDist(o.input)
	if err != nil {
		return nil, "", fmt.Errorf("--input-len: %w", err)
	}
	out, err := ParseDist(o.output)
	if err != nil {
		return nil, "", fmt.Errorf("--output-len: %w", err)
	}
	if o.prefixGroups < 0 || o.prefixLen < 0 {
		return nil, "", errors.New("--prefix-groups and --prefix-len must not be negative")
	}
	s := Synthetic{Requests: n, Input: in, Output: out, InputMax: o.inputMax, OutputMax: o.outputMax, PrefixGroups: o.prefixGroups, PrefixLen: o.prefixLen, MaxModelLen: o.maxModelLen, Seed: seed}
	describe := fmt.Sprintf("synthetic, %d requests, prompts %s, outputs %s", n, in, out)
	if o.inputMax > 0 || o.outputMax > 0 {
		describe += fmt.Sprintf(" (cut at %d and %d)", o.inputMax, o.outputMax)
	}
	if o.prefixGroups > 0 {
		describe += fmt.Sprintf(", each after one of %d shared %d-token prefixes", o.prefixGroups, o.prefixLen)
	}
	return s.Items, describe, nil
}
