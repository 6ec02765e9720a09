package actors

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/dpnode/dpnode/dp"
	"github.com/dpnode/dpnode/engine"
	"github.com/dpnode/dpnode/gpu"
	dpnodev1 "github.com/dpnode/dpnode/proto/dpnode/v1"
)

func TestRestartBackoffDoublesToItsCap(t *testing.T) {
	p := RestartPolicy{InitialBackoff: 100 * time.Millisecond, MaxBackoff: time.Second}
	want := []time.Duration{100, 200, 400, 800, 1000, 1000}
	for i, w := range want {
		if got := p.delay(i + 1); got != w*time.Millisecond {
			t.Errorf("crash %d: backoff %v, want %v", i+1, got, w*time.Millisecond)
		}
	}
}

// rankZeroDiesForGood makes rank 0's executor impossible to build after
// its first crash, so that the rank crash-loops, and parks requests for
// at most 300 ms.
func rankZeroDiesForGood(cfg *NodeConfig) {
	cfg.ParkTimeout = 300 * time.Millisecond
	inner := cfg.NewCore
	var built atomic.Int32
	cfg.NewCore = func(ctx context.Context, rank int, dev gpu.Device) (engine.Core, error) {
		if rank == 0 && built.Add(1) > 1 {
			return nil, errors.New("injected: the GPU is gone")
		}
		return inner(ctx, rank, dev)
	}
}

// TestRequestsPinnedToADeadRankFailClearly crash-loops rank 0 and pins
// requests to it: they wait for the rank, then fail with ErrNoRank; none
// hangs, and rank 1 keeps serving meanwhile.
func TestRequestsPinnedToADeadRankFailClearly(t *testing.T) {
	tn := startTestNode(t, 2, 0.01, 0, 1, rankZeroDiesForGood)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	tok := tn.tok.Tokens("pinned to a rank that will not come back")
	var streams []*Stream
	for i := range 4 {
		s := NewStream()
		tn.Submit(&Submission{ID: fmt.Sprint("pinned-", i), Prompt: tok, Sampling: engine.SamplingParams{MaxTokens: 5, IgnoreEOS: true},
			Rank: 0, Stream: s, Arrival: time.Now()})
		streams = append(streams, s)
	}
	failed := 0
	for _, s := range streams {
		r := collect(ctx, s)
		switch {
		case errors.Is(r.err, ErrNoRank):
			failed++
		case r.err != nil:
			t.Fatalf("pinned request: %v; want ErrNoRank or success", r.err)
		}
	}
	if failed == 0 {
		t.Fatal("no pinned request waited out the dead rank")
	}
	for _, r := range tn.runBurst(t, 10, 3) {
		if r.err != nil {
			t.Fatalf("rank 1 stopped serving while rank 0 was down: %v", r.err)
		}
	}
}

// TestParkedDeadlineSurvivesOtherRanksRestarting: every restart of some
// other rank wakes the parked requests, and a pinned request that still
// cannot go anywhere must keep its first deadline, not get a new one.
func TestParkedDeadlineSurvivesOtherRanksRestarting(t *testing.T) {
	tn := startTestNode(t, 2, 0.01, 0, 1, rankZeroDiesForGood)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s := NewStream()
	tn.Submit(&Submission{ID: "pinned", Prompt: tn.tok.Tokens("x"), Sampling: engine.SamplingParams{MaxTokens: 5, IgnoreEOS: true}, Rank: 0, Stream: s, Arrival: time.Now()})
	// Rank 1 "restarts" every 50 ms, as a crash-looping rank would.
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				tn.System().Root.Send(tn.APIServer(), &dpnodev1.EngineReady{Rank: 1, EngineEpoch: 1})
			}
		}
	}()
	start := time.Now()
	r := collect(ctx, s)
	close(stop)
	<-done
	if !errors.Is(r.err, ErrNoRank) {
		t.Fatalf("pinned request: %v, want ErrNoRank", r.err)
	}
	if waited := time.Since(start); waited > 5*time.Second {
		t.Fatalf("the deadline moved: failed after %v", waited)
	}
}

// TestNodeFailsWhenItsAPIServerIsGoneForGood stops the API server as its
// supervisor would after too many crashes: the node reports it failed,
// and a request gets an error at once instead of waiting forever.
func TestNodeFailsWhenItsAPIServerIsGoneForGood(t *testing.T) {
	tn := startTestNode(t, 1, 0, -1, 0)
	tn.System().Root.Stop(tn.APIServer())
	select {
	case <-tn.Failed():
	case <-time.After(10 * time.Second):
		t.Fatal("the node did not notice that its API server stopped")
	}
	s := NewStream()
	tn.Submit(&Submission{ID: "late", Prompt: tn.tok.Tokens("x"), Sampling: engine.SamplingParams{MaxTokens: 1}, Rank: AnyRank, Stream: s, Arrival: time.Now()})
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if r := collect(ctx, s); !errors.Is(r.err, ErrAPIServerGone) {
		t.Fatalf("request after the failure: %v, want ErrAPIServerGone", r.err)
	}
}

// TestMigrationOffFailsRequestsWithOutput crashes rank 0 mid-load with
// migration off: requests that had output fail with ErrEngineLost, those
// without are sent again and complete.
func TestMigrationOffFailsRequestsWithOutput(t *testing.T) {
	tn := startTestNode(t, 2, 0.05, 0, 8, func(cfg *NodeConfig) { cfg.Migration = false })
	lost, done := 0, 0
	for _, r := range tn.runBurst(t, 60, 20) {
		switch {
		case errors.Is(r.err, ErrEngineLost):
			lost++
			if len(r.tokens) == 0 {
				t.Fatal("a request with no output was failed instead of re-dispatched")
			}
		case r.err != nil:
			t.Fatalf("unexpected error: %v", r.err)
		default:
			done++
		}
	}
	if lost == 0 || done == 0 {
		t.Fatalf("%d lost and %d completed; want both", lost, done)
	}
	if migrated := metricSum(t, tn.reg, "dpnode_requests_migrated_total", 0); migrated != 0 {
		t.Fatalf("%v requests migrated with migration off", migrated)
	}
}

// TestRankThatCrashesTooOftenIsStopped lets rank 0 crash-loop with a limit
// of 2 restarts: after the third crash the rank is stopped and failed, out
// of balancing, and a request pinned to it fails at once.
func TestRankThatCrashesTooOftenIsStopped(t *testing.T) {
	tn := startTestNode(t, 2, 0.01, 0, 1, rankZeroDiesForGood, func(cfg *NodeConfig) {
		cfg.Restart.MaxRestarts = 2
		cfg.ParkTimeout = time.Minute
	})
	// The first request to rank 0 crashes it; its restarts then fail.
	first := NewStream()
	tn.Submit(&Submission{ID: "first", Prompt: tn.tok.Tokens("crash it"), Sampling: engine.SamplingParams{MaxTokens: 2}, Rank: 0, Stream: first, Arrival: time.Now()})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if r := collect(ctx, first); !errors.Is(r.err, ErrRankFailed) {
		t.Fatalf("the request pinned to the crash-looping rank: %v, want ErrRankFailed", r.err)
	}
	v, err := tn.View(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if r0 := v.Ranks[0]; !r0.Failed || r0.Ready || r0.Restarts != 3 {
		t.Fatalf("rank 0: %+v; want failed after 3 crashes", r0)
	}
	if metricSum(t, tn.reg, "dpnode_engine_failed", 0) != 1 {
		t.Fatal("dpnode_engine_failed is not set for rank 0")
	}
	// The cluster page's events: each crash that restarted it, then the
	// stop.
	if got := eventKinds(v.Events, 0); !slices.Equal(got, []string{EventRestart, EventRestart, EventRankFailed}) {
		t.Fatalf("rank 0's events: %v; want two restarts, then rank_failed", got)
	}
	for _, r := range tn.runBurst(t, 10, 3) {
		if r.err != nil || r.ranks[0] != 1 {
			t.Fatalf("with rank 0 failed, a request: %v on %v; want rank 1", r.err, r.ranks)
		}
	}
	late := NewStream()
	tn.Submit(&Submission{ID: "late", Prompt: tn.tok.Tokens("x"), Sampling: engine.SamplingParams{MaxTokens: 1}, Rank: 0, Stream: late, Arrival: time.Now()})
	if r := collect(ctx, late); !errors.Is(r.err, ErrRankFailed) {
		t.Fatalf("pinned to the failed rank: %v", r.err)
	}
}

// TestLostRequestIsSentAgain tells the API server, as an engine that lost
// a request would, that the engine holds none of its requests: the request
// in flight is aborted there and sent again, and its stream ends
// token-exactly.
func TestLostRequestIsSentAgain(t *testing.T) {
	tn := startTestNode(t, 1, 0.2, -1, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s := NewStream()
	prompt := tn.tok.Tokens("lost on the way")
	sp := engine.SamplingParams{MaxTokens: 200, IgnoreEOS: true}
	tn.Submit(&Submission{ID: "lost", Prompt: prompt, Sampling: sp, Rank: AnyRank, Stream: s, Arrival: time.Now()})
	first, err := s.Next(ctx, nil)
	if err != nil || len(first) == 0 {
		t.Fatalf("no first token: %v", err)
	}
	// The API server asks engines what they hold every few seconds;
	// answer, as the engine that lost the request would: nothing.
	tn.System().Root.Send(tn.APIServer(), &reconcile{})
	v, err := tn.View(ctx)
	if err != nil {
		t.Fatal(err)
	}
	tn.System().Root.Send(tn.APIServer(), &dpnodev1.RequestList{Rank: 0, EngineEpoch: v.Ranks[0].Epoch})
	r := collect(ctx, s)
	tokens := append(append([]uint32{}, first[0].Tokens...), r.tokens...)
	if r.err != nil || !slices.Equal(tokens, tn.expected(prompt, sp)) {
		t.Fatalf("the stream after its request was sent again: %v, %d tokens", r.err, len(tokens))
	}
	if moved := metricSum(t, tn.reg, "dpnode_requests_migrated_total", 0) + metricSum(t, tn.reg, "dpnode_requests_redispatched_total", 0); moved != 1 {
		t.Fatalf("%v moves, want the lost request's one", moved)
	}
}

// TestAPIServerCrashLosesNoRequest crashes the API server in the middle of
// a burst, on the first word of prompts prefilled it receives from an
// engine (which is lost with it; the engines deliver the tokens
// themselves):
// its supervisor restarts it, the new incarnation takes the calls over,
// and every request finishes token-exactly, with no error.
func TestAPIServerCrashLosesNoRequest(t *testing.T) {
	var injected atomic.Bool
	prev := faultHook
	faultHook = func(ctx actor.Context) bool {
		// The first word of prompts prefilled comes while their requests
		// have tokens still to come.
		if o, ok := ctx.Message().(*localOutputs); ok && ctx.Self().Id == apiServerID && len(o.prefilled) > 0 && injected.CompareAndSwap(false, true) {
			panic("injected API server fault")
		}
		return prev != nil && prev(ctx)
	}
	// Registered before the node's own cleanup, so run after it stops.
	t.Cleanup(func() { faultHook = prev })
	tn := startTestNode(t, 2, 0.05, -1, 0)
	const n, maxTokens = 60, 20
	results := tn.runBurst(t, n, maxTokens)
	if !injected.Load() {
		t.Fatal("the fault was never injected")
	}
	for i, r := range results {
		prompt := tn.tok.Tokens(fmt.Sprintf("request number %d asks about the cluster", i))
		if want := tn.expected(prompt, engine.SamplingParams{MaxTokens: maxTokens, IgnoreEOS: true}); r.err != nil || !slices.Equal(r.tokens, want) {
			t.Fatalf("request %d: err %v, %d tokens; want the undisturbed %d", i, r.err, len(r.tokens), len(want))
		}
	}
	for _, r := range tn.runBurst(t, 20, 3) {
		if r.err != nil {
			t.Fatalf("after the restart: %v", r.err)
		}
	}
	tn.assertSettled(t)
}

// TestRequestIDFreeOnceItsStreamEnds: a client may send an id again as
// soon as its last answer came, though a local engine tells the API server
// of the end only after the stream's last event.
func TestRequestIDFreeOnceItsStreamEnds(t *testing.T) {
	tn := startTestNode(t, 1, 0, -1, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	prompt := tn.tok.Tokens("the same id, again and again")
	sp := engine.SamplingParams{MaxTokens: 2, IgnoreEOS: true}
	for i := range 50 {
		s := NewStream()
		tn.Submit(&Submission{ID: "same", Prompt: prompt, Sampling: sp, Rank: AnyRank, Stream: s, Arrival: time.Now()})
		if r := collect(ctx, s); r.err != nil || !slices.Equal(r.tokens, tn.expected(prompt, sp)) {
			t.Fatalf("call %d: %v, %v", i, r.err, r.tokens)
		}
	}
	tn.assertSettled(t)
}

// apiServerFault crashes the API server that receives it.
type apiServerFault struct{}

// crashFirstStepThenLoad makes rank 0's first step crash its engine and
// the engine's next start block in NewCore until release is closed (then
// it starts) or the start is cancelled (then it fails as a model worker's
// does, with a nil pointer, which panics when closed). starting is closed
// when that start begins; built counts the engines asked for.
func crashFirstStepThenLoad(starting, release chan struct{}, built *atomic.Int32) func(*NodeConfig) {
	return func(cfg *NodeConfig) {
		inner := cfg.NewCore
		cfg.NewCore = func(ctx context.Context, rank int, dev gpu.Device) (engine.Core, error) {
			if built.Add(1) != 2 {
				return inner(ctx, rank, dev)
			}
			close(starting)
			select {
			case <-release:
				return inner(ctx, rank, dev)
			case <-ctx.Done():
				var c *engine.StepCore
				return c, ctx.Err()
			}
		}
	}
}

// TestAPIServerCrashLeavesTheEnginesAlone crashes the API server while
// the engine it restarted after a crash is loading its model: the node
// actor, not the API server, supervises the engines, so the load goes on,
// no engine restarts, and the request finishes on the engine that loaded.
func TestAPIServerCrashLeavesTheEnginesAlone(t *testing.T) {
	prev := faultHook
	faultHook = func(ctx actor.Context) bool {
		if _, ok := ctx.Message().(*apiServerFault); ok {
			panic("injected API server fault")
		}
		return prev != nil && prev(ctx)
	}
	t.Cleanup(func() { faultHook = prev })
	starting, release := make(chan struct{}), make(chan struct{})
	var built atomic.Int32
	tn := startTestNode(t, 1, 0, 0, 1, crashFirstStepThenLoad(starting, release, &built))
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	s := NewStream()
	tn.Submit(&Submission{ID: "crash", Prompt: tn.tok.Tokens("crash the engine"), Sampling: engine.SamplingParams{MaxTokens: 2, IgnoreEOS: true},
		Rank: AnyRank, Stream: s, Arrival: time.Now()})
	select {
	case <-starting:
	case <-ctx.Done():
		t.Fatal("rank 0's engine did not crash and restart")
	}
	tn.System().Root.Send(tn.APIServer(), &apiServerFault{})
	// The restarted API server answers, and only then does the load end.
	if _, err := tn.View(ctx); err != nil {
		t.Fatalf("the API server after its restart: %v", err)
	}
	close(release)
	if r := collect(ctx, s); r.err != nil || len(r.tokens) != 2 {
		t.Fatalf("the request across both crashes: %v, %d tokens", r.err, len(r.tokens))
	}
	if n := built.Load(); n != 2 {
		t.Fatalf("%d executors built; want 2 (the first, and the one after the engine's crash)", n)
	}
	if restarts := metricSum(t, tn.reg, "dpnode_engine_restarts_total", 0); restarts != 1 {
		t.Fatalf("%v engine restarts, want the engine crash's 1", restarts)
	}
}

// TestNodeStopsWhileAnEngineStarts stops the node while an engine loads
// its model: the load is cancelled and fails as a model worker's does,
// with a nil process pointer. The engine must stop all the same, or the
// node actor, which waits for its children to stop, never does.
func TestNodeStopsWhileAnEngineStarts(t *testing.T) {
	starting, release := make(chan struct{}), make(chan struct{})
	var built atomic.Int32
	tn := startTestNode(t, 1, 0, 0, 1, crashFirstStepThenLoad(starting, release, &built))
	s := NewStream()
	tn.Submit(&Submission{ID: "crash", Prompt: tn.tok.Tokens("crash the engine"), Sampling: engine.SamplingParams{MaxTokens: 2, IgnoreEOS: true},
		Rank: AnyRank, Stream: s, Arrival: time.Now()})
	select {
	case <-starting:
	case <-time.After(15 * time.Second):
		t.Fatal("rank 0's engine did not crash and restart")
	}
	stopped := make(chan struct{})
	go func() {
		tn.Stop()
		close(stopped)
	}()
	select {
	case <-stopped:
	case <-time.After(15 * time.Second):
		t.Fatal("the node did not stop while its engine started")
	}
}

// TestLostSubscriptionIsSentAgain: an API server's subscription to another
// node's ranks that is lost on the way (a connection that breaks as it is
// sent: no answer comes, and no Terminated either) is sent again until the
// node answers. The other node is played by this API server itself: the
// member's address is its own, the first SubscribeRanks it receives is
// dropped, and no statuses come back.
func TestLostSubscriptionIsSentAgain(t *testing.T) {
	var seen atomic.Int32
	again := make(chan struct{})
	prev := faultHook
	faultHook = func(ctx actor.Context) bool {
		if ctx.Self().Id != apiServerID {
			return prev != nil && prev(ctx)
		}
		switch ctx.Message().(type) {
		case *dpnodev1.SubscribeRanks:
			switch seen.Add(1) {
			case 1:
				return true
			case 2:
				close(again)
			}
		case *dpnodev1.RankStatuses:
			// This node's statuses, pushed to the "other node" as to a
			// subscriber, come back here: they are not its answer.
			return true
		}
		return prev != nil && prev(ctx)
	}
	// Registered before the node's own cleanup, so run after it stops.
	t.Cleanup(func() { faultHook = prev })
	tn := startTestNode(t, 2, 0.01, -1, 0, func(c *NodeConfig) {
		c.Topology = dp.Topology{Mode: dp.Internal, Size: 4, LocalSize: 2}
	})
	self := tn.APIServer()
	tn.System().Root.Send(self, &nodeUp{name: "peer", meta: &dpnodev1.NodeMeta{ActorAddress: self.Address, StartRank: 2, LocalSize: 2}})
	select {
	case <-again:
	case <-time.After(4 * hostRetryInterval):
		t.Fatalf("the subscription was sent %d times in %v; want it again after the first was lost", seen.Load(), 4*hostRetryInterval)
	}
}

// eventKinds lists the kinds of the events about rank, in order; moves
// are left out (whether a crash had requests to move depends on timing).
func eventKinds(events []ClusterEvent, rank int) []string {
	var kinds []string
	for _, e := range events {
		if e.Rank == rank && e.Kind != EventMoved {
			kinds = append(kinds, e.Kind)
		}
	}
	return kinds
}
