package actors

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dpnode/dpnode/engine"
	"github.com/dpnode/dpnode/gpu"
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

// TestRequestsPinnedToADeadRankFailClearly crash-loops rank 0 (its
// executor cannot be built after the first crash) and pins requests to
// it: they wait for the rank, then fail with ErrNoRank; none hangs, and
// rank 1 keeps serving meanwhile.
func TestRequestsPinnedToADeadRankFailClearly(t *testing.T) {
	tn := startTestNode(t, 2, 0.01, 0, 1, func(cfg *NodeConfig) {
		cfg.ParkTimeout = 300 * time.Millisecond
		inner := cfg.NewExecutor
		var built atomic.Int32
		cfg.NewExecutor = func(rank int, dev gpu.Device) (engine.Executor, error) {
			if rank == 0 {
				if built.Add(1) > 1 {
					return nil, errors.New("injected: the GPU is gone")
				}
			}
			return inner(rank, dev)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	tok := tn.tok.Encode("pinned to a rank that will not come back")
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
