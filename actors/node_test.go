package actors

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	dpnode "github.com/dpnode/dpnode"
	"github.com/dpnode/dpnode/dp"
	"github.com/dpnode/dpnode/engine"
	"github.com/dpnode/dpnode/engine/sim"
	"github.com/dpnode/dpnode/gpu"
)

func TestMain(m *testing.M) {
	// protoactor's dead-letter throttle lives on for its one-second period
	// after the system stops.
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/asynkron/protoactor-go/actor.NewThrottle.func1.1"),
		goleak.IgnoreAnyFunction("github.com/asynkron/protoactor-go/actor.NewDeadLetter.NewThrottle.func4.1"))
}

// crashingExecutor wraps the simulated executor and panics on the step
// numbered crashAt (counted across incarnations), once.
type crashingExecutor struct {
	inner   engine.Executor
	steps   *atomic.Int64
	crashAt int64
}

func (c *crashingExecutor) Execute(ctx context.Context, b *engine.Batch) (engine.StepResult, error) {
	if c.steps.Add(1) == c.crashAt {
		panic("injected executor fault")
	}
	return c.inner.Execute(ctx, b)
}

type testNode struct {
	*Node
	reg   *prometheus.Registry
	tok   *sim.Tokenizer
	steps []*atomic.Int64
}

// startTestNode runs ranks engines of the 8B profile at timeScale; the
// executor of rank crashRank panics on its crashAt-th step (0: never).
func startTestNode(t testing.TB, ranks int, timeScale float64, crashRank int, crashAt int64, mutate ...func(*NodeConfig)) *testNode {
	t.Helper()
	return startProfileNode(t, "llama-3.1-8b-h100", ranks, timeScale, crashRank, crashAt, mutate...)
}

func startProfileNode(t testing.TB, profileName string, ranks int, timeScale float64, crashRank int, crashAt int64, mutate ...func(*NodeConfig)) *testNode {
	t.Helper()
	profile, err := sim.LoadProfile(dpnode.SimProfiles, profileName)
	if err != nil {
		t.Fatal(err)
	}
	tn := &testNode{reg: prometheus.NewRegistry(), tok: sim.NewTokenizer(0)}
	for range ranks {
		tn.steps = append(tn.steps, new(atomic.Int64))
	}
	cfg := DefaultNodeConfig()
	cfg.Model = "test-model"
	cfg.Topology = dp.Topology{Size: ranks, LocalSize: ranks}
	for i := range ranks {
		cfg.Devices = append(cfg.Devices, gpu.Device{Index: i, UUID: fmt.Sprint("GPU-test-", i), Name: "test-gpu", Virtual: true})
	}
	cfg.Scheduler.EOSTokenIDs = []uint32{sim.EOSToken}
	cfg.Scheduler.NumBlocks = profile.KVCacheBlocks
	cfg.Registry = tn.reg
	cfg.Restart.InitialBackoff = 10 * time.Millisecond
	cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	cfg.NewCore = func(_ context.Context, rank int, _ gpu.Device) (engine.Core, error) {
		e, err := sim.NewExecutor(sim.ExecutorConfig{Profile: profile, Tokenizer: tn.tok, Clock: engine.RealClock{}, TimeScale: timeScale})
		if err != nil {
			return nil, err
		}
		crash := int64(0)
		if rank == crashRank {
			crash = crashAt
		}
		return engine.NewStepCore(cfg.Scheduler, &crashingExecutor{inner: e, steps: tn.steps[rank], crashAt: crash}, sim.Capabilities(profile))
	}
	for _, f := range mutate {
		f(&cfg)
	}
	n, err := StartNode(cfg)
	if err != nil {
		t.Fatal(err)
	}
	tn.Node = n
	t.Cleanup(n.Stop)
	return tn
}

// result is what a stream delivered for one request.
type result struct {
	tokens []uint32
	finish engine.FinishReason
	err    error
	ranks  []int
	// events counts the events that brought tokens.
	events int
}

// collect drains a stream of one request until it finishes.
func collect(ctx context.Context, s *Stream) result {
	var r result
	var buf []Event
	for {
		evs, err := s.Next(ctx, buf)
		if err != nil {
			r.err = err
			return r
		}
		for _, ev := range evs {
			if len(ev.Tokens) > 0 {
				r.events++
			}
			r.tokens = append(r.tokens, ev.Tokens...)
			if len(ev.Tokens) > 0 && (len(r.ranks) == 0 || r.ranks[len(r.ranks)-1] != ev.Rank) {
				r.ranks = append(r.ranks, ev.Rank)
			}
			if ev.Finish != engine.NotFinished {
				r.finish, r.err = ev.Finish, ev.Err
				return r
			}
		}
		buf = evs
	}
}

func (tn *testNode) expected(prompt []uint32, sp engine.SamplingParams) []uint32 {
	h := engine.PromptHash(prompt, sp.Seed)
	var want []uint32
	for i := range sp.MaxTokens {
		want = append(want, tn.tok.Sample(h, i, &sp))
	}
	return want
}

// runBurst submits n requests at once and waits for all of them.
func (tn *testNode) runBurst(t *testing.T, n, maxTokens int) []result {
	t.Helper()
	return tn.runCalls(t, n, maxTokens, false)
}

// runCalls submits n requests at once, whole ones (Submission.Whole) or
// streamed, and waits for all of them.
func (tn *testNode) runCalls(t *testing.T, n, maxTokens int, whole bool) []result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	results := make([]result, n)
	var wg sync.WaitGroup
	for i := range n {
		s := NewStream()
		tn.Submit(&Submission{
			ID:       fmt.Sprint("req-", i),
			Prompt:   tn.tok.Tokens(fmt.Sprintf("request number %d asks about the cluster", i)),
			Sampling: engine.SamplingParams{MaxTokens: maxTokens, IgnoreEOS: true},
			Rank:     AnyRank,
			Stream:   s,
			Arrival:  time.Now(),
			Whole:    whole,
		})
		wg.Go(func() { results[i] = collect(ctx, s) })
	}
	wg.Wait()
	return results
}

func TestBurstIsBalancedAndExact(t *testing.T) {
	tn := startTestNode(t, 2, 0.01, -1, 0)
	const n = 200
	results := tn.runBurst(t, n, 5)
	for i, r := range results {
		prompt := tn.tok.Tokens(fmt.Sprintf("request number %d asks about the cluster", i))
		want := tn.expected(prompt, engine.SamplingParams{MaxTokens: 5, IgnoreEOS: true})
		if r.err != nil || r.finish != engine.FinishedLength || !slices.Equal(r.tokens, want) {
			t.Fatalf("request %d: %v %v %v; want %v", i, r.err, r.finish, r.tokens, want)
		}
	}
	served := map[int]int{}
	for _, r := range results {
		served[r.ranks[0]]++
	}
	for rank := range 2 {
		if served[rank] <= n/3 {
			t.Errorf("rank %d served %d of %d requests; vLLM's balance check wants more than %d", rank, served[rank], n, n/3)
		}
	}
	tn.assertSettled(t)
}

// assertSettled checks that, with every stream ended, the API server
// comes to count nothing in flight and no prefill pending on any rank. A
// local engine tells the API server of a request's end just after the
// stream's last event, so the counts settle a moment after the streams.
func (tn *testNode) assertSettled(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		v, err := tn.View(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		busy := slices.IndexFunc(v.Ranks, func(r RankView) bool { return r.InFlight != 0 || r.PendingPrefill != 0 })
		if busy < 0 {
			return
		}
		if r := v.Ranks[busy]; time.Now().After(deadline) {
			t.Fatalf("rank %d still counts %d in flight and %d prefill tokens pending", r.Rank, r.InFlight, r.PendingPrefill)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// metricSum adds up the series of a metric with engine label rank.
func metricSum(t *testing.T, reg *prometheus.Registry, name string, rank int) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	total := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "engine" && l.GetValue() == fmt.Sprint(rank) {
					total += m.GetCounter().GetValue() + m.GetGauge().GetValue()
				}
			}
		}
	}
	return total
}

// TestEngineCrashMovesRequestsTokenExactly crashes rank 0 mid-load: its
// requests continue on rank 1 (or on rank 0 after its restart) and every
// stream ends with exactly the tokens of an undisturbed run. Whole calls
// get them in one event, moved or not.
func TestEngineCrashMovesRequestsTokenExactly(t *testing.T) {
	for _, whole := range []bool{false, true} {
		t.Run(map[bool]string{false: "streamed", true: "whole"}[whole], func(t *testing.T) {
			engineCrashMovesRequests(t, whole)
		})
	}
}

func engineCrashMovesRequests(t *testing.T, whole bool) {
	tn := startTestNode(t, 2, 0.05, 0, 8)
	const n, maxTokens = 60, 20
	results := tn.runCalls(t, n, maxTokens, whole)
	moved := 0
	for i, r := range results {
		prompt := tn.tok.Tokens(fmt.Sprintf("request number %d asks about the cluster", i))
		want := tn.expected(prompt, engine.SamplingParams{MaxTokens: maxTokens, IgnoreEOS: true})
		if r.err != nil || !slices.Equal(r.tokens, want) {
			t.Fatalf("request %d: err %v, %d tokens; want the undisturbed %d", i, r.err, len(r.tokens), len(want))
		}
		if whole && r.events != 1 {
			t.Fatalf("request %d: a whole call's tokens came in %d events, want 1", i, r.events)
		}
		if len(r.ranks) > 1 {
			moved++
		}
	}
	restarts := metricSum(t, tn.reg, "dpnode_engine_restarts_total", 0)
	migrated := metricSum(t, tn.reg, "dpnode_requests_migrated_total", 0)
	// A whole call's one event names one rank: its moves are the
	// metric's only.
	if restarts != 1 || migrated == 0 || (!whole && moved == 0) {
		t.Fatalf("restarts %v, migrated %v, streams that changed rank %d; want one restart and migrations", restarts, migrated, moved)
	}
	v, err := tn.View(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var restartsSeen, movesSeen int
	for _, e := range v.Events {
		switch {
		case e.Kind == EventRestart && e.Rank == 0:
			restartsSeen++
		case e.Kind == EventMoved && e.Rank == 0 && strings.Contains(e.Detail, fmt.Sprintf("%v migrated with their tokens", migrated)):
			movesSeen++
		}
	}
	if restartsSeen != 1 || movesSeen != 1 {
		t.Fatalf("events %+v; want rank 0's restart, and one move naming the %v migrated requests", v.Events, migrated)
	}
	// The restarted engine serves again.
	for _, r := range tn.runBurst(t, 20, 3) {
		if r.err != nil {
			t.Fatal(r.err)
		}
	}
	tn.assertSettled(t)
}

// TestIdentifyPastItsDeadline: a deadline that passed before the call
// ends it at once. protoactor's futures take a negative timeout as none
// at all, so the call used to wait on the peer with no end.
func TestIdentifyPastItsDeadline(t *testing.T) {
	n, err := Listen("node-a", nil, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer n.Stop()
	ctx, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel()
	if name, err := n.Identify(ctx, "127.0.0.1:1"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Identify past its deadline: %q, %v", name, err)
	}
}
