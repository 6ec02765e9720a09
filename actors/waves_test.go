package actors

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/dpnode/dpnode/engine"
	dpnodev1 "github.com/dpnode/dpnode/proto/dpnode/v1"
)

// startWaveNode runs ranks engines of the MoE profile, stepping in waves.
func startWaveNode(t *testing.T, ranks int, timeScale float64, crashRank int, crashAt int64) *testNode {
	t.Helper()
	return startProfileNode(t, "qwen3-30b-a3b-h200", ranks, timeScale, crashRank, crashAt, func(cfg *NodeConfig) {
		cfg.ExpertParallel = true
	})
}

// waitGroup waits until the coordinator's group has n ranks.
func (tn *testNode) waitGroup(t testing.TB, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		v, err := tn.View(context.Background())
		if err == nil && len(v.Coordinator.Group) == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the group did not reach %d ranks: %+v %v", n, v, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// waitIdle waits until every rank's engine has left its wave.
func (tn *testNode) waitIdle(t *testing.T) *ClusterView {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		v, err := tn.View(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		running := slices.ContainsFunc(v.Ranks, func(r RankView) bool { return r.WaveRunning })
		if !running && !v.Coordinator.WaveRunning && v.Coordinator.SnapshotSeq > 0 {
			return v
		}
		if time.Now().After(deadline) {
			t.Fatalf("the wave did not end: %+v", v)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// watchWaveOrder reports whether rank's engine took a message of a wave (a
// StartWave, a peer's step report) before its first request, in the order
// its mailbox delivered them. It must not: woken before its request, the
// engine reports no work, the wave ends on its first step, and the request
// has to start a second one. Call it before starting the node, so that
// the hook is put back only after the node stopped.
func watchWaveOrder(t *testing.T, rank int) *atomic.Bool {
	t.Helper()
	prev := faultHook
	t.Cleanup(func() { faultHook = prev })
	var gotRequest atomic.Bool
	early := new(atomic.Bool)
	id := engineID(rank)
	faultHook = func(ctx actor.Context) bool {
		if self := ctx.Self(); self != nil && self.Id == id {
			switch ctx.Message().(type) {
			case *dpnodev1.AddRequest, *localAdd:
				gotRequest.Store(true)
			case *dpnodev1.StartWave, *dpnodev1.StepReport:
				if !gotRequest.Load() {
					early.Store(true)
				}
			}
		}
		return prev != nil && prev(ctx)
	}
	return early
}

func TestOneRequestStepsEveryRankInAWave(t *testing.T) {
	early := watchWaveOrder(t, 1)
	tn := startWaveNode(t, 4, 0.01, -1, 0)
	tn.waitGroup(t, 4)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s := NewStream()
	prompt := tn.tok.Tokens("one request wakes the group")
	sp := engine.SamplingParams{MaxTokens: 5, IgnoreEOS: true}
	tn.Submit(&Submission{ID: "one", Prompt: prompt, Sampling: sp, Rank: 1, Stream: s, Arrival: time.Now()})
	r := collect(ctx, s)
	if r.err != nil || !slices.Equal(r.tokens, tn.expected(prompt, sp)) {
		t.Fatalf("the request: %v %v", r.err, r.tokens)
	}
	v := tn.waitIdle(t)
	if early.Load() {
		t.Error("rank 1 heard of the wave before its request reached it")
	}
	for rank := range 4 {
		waves := metricSum(t, tn.reg, "dpnode_waves_total", rank)
		dummies := metricSum(t, tn.reg, "dpnode_dummy_steps_total", rank)
		if waves != 1 {
			t.Errorf("rank %d stepped in %v waves, want 1", rank, waves)
		}
		// The rank with the request runs one dummy: the last step, where
		// every rank says it has nothing left. The others run dummies
		// throughout: prefill, four decodes and that last step.
		if want := map[bool]float64{true: 1, false: 6}[rank == 1]; dummies != want {
			t.Errorf("rank %d ran %v dummy steps, want %v", rank, dummies, want)
		}
	}
	if v.Coordinator.Wave != 1 || len(v.Coordinator.Group) != 4 {
		t.Fatalf("coordinator after one wave: %+v", v.Coordinator)
	}
}

func TestBurstInWavesIsTokenExact(t *testing.T) {
	tn := startWaveNode(t, 4, 0.01, -1, 0)
	const n = 400
	results := tn.runBurst(t, n, 8)
	for i, r := range results {
		prompt := tn.tok.Tokens(fmt.Sprintf("request number %d asks about the cluster", i))
		if r.err != nil || !slices.Equal(r.tokens, tn.expected(prompt, engine.SamplingParams{MaxTokens: 8, IgnoreEOS: true})) {
			t.Fatalf("request %d: %v, %d tokens", i, r.err, len(r.tokens))
		}
	}
	tn.waitIdle(t)
	for rank := range 4 {
		if metricSum(t, tn.reg, "dpnode_waves_total", rank) < 1 {
			t.Errorf("rank %d stepped in no wave", rank)
		}
	}
	if count := histogramCount(t, tn, "dpnode_step_balance_ratio"); count == 0 {
		t.Error("no step balance ratio was recorded")
	}
}

// TestEngineCrashMidWave crashes a rank in the middle of a wave: it comes
// back, joins the wave where the others wait for it, and every request
// ends token-exactly.
func TestEngineCrashMidWave(t *testing.T) {
	tn := startWaveNode(t, 4, 0.02, 2, 6)
	results := tn.runBurst(t, 60, 16)
	for i, r := range results {
		prompt := tn.tok.Tokens(fmt.Sprintf("request number %d asks about the cluster", i))
		if r.err != nil || !slices.Equal(r.tokens, tn.expected(prompt, engine.SamplingParams{MaxTokens: 16, IgnoreEOS: true})) {
			t.Fatalf("request %d: %v, %d tokens", i, r.err, len(r.tokens))
		}
	}
	if restarts := metricSum(t, tn.reg, "dpnode_engine_restarts_total", 2); restarts != 1 {
		t.Fatalf("%v restarts of rank 2, want 1", restarts)
	}
	// The restarted engine joined the step the others waited in: no rank
	// had to be dropped for a late collective.
	if v := tn.waitIdle(t); len(v.Coordinator.Group) != 4 {
		t.Fatalf("group after the crash: %v, want all four ranks", v.Coordinator.Group)
	}
}

// histogramCount sums a histogram's sample counts over all engines.
func histogramCount(t *testing.T, tn *testNode, name string) uint64 {
	t.Helper()
	mfs, err := tn.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var n uint64
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				n += m.GetHistogram().GetSampleCount()
			}
		}
	}
	return n
}

// TestLostEngineIsDroppedFromTheGroup stops one engine for good: the others
// wait out the collective timeout, the coordinator re-forms the group
// without it, and requests on the remaining ranks are served.
func TestLostEngineIsDroppedFromTheGroup(t *testing.T) {
	tn := startProfileNode(t, "qwen3-30b-a3b-h200", 4, 0.01, -1, 0, func(cfg *NodeConfig) {
		cfg.ExpertParallel, cfg.CollectiveTimeout = true, 200*time.Millisecond
	})
	tn.waitGroup(t, 4)
	tn.System().Root.Stop(actor.NewPID(tn.System().Address(), engineID(3)))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s := NewStream()
	prompt := tn.tok.Tokens("the others go on")
	sp := engine.SamplingParams{MaxTokens: 5, IgnoreEOS: true}
	tn.Submit(&Submission{ID: "on", Prompt: prompt, Sampling: sp, Rank: AnyRank, Stream: s, Arrival: time.Now()})
	if r := collect(ctx, s); r.err != nil || !slices.Equal(r.tokens, tn.expected(prompt, sp)) || r.ranks[0] == 3 {
		t.Fatalf("request after rank 3 stopped: %v, ranks %v", r.err, r.ranks)
	}
	if v := tn.waitIdle(t); !slices.Equal(v.Coordinator.Group, []uint32{0, 1, 2}) {
		t.Fatalf("group %v, want the three ranks left", v.Coordinator.Group)
	}
}
