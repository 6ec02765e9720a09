package actors

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/dpnode/dpnode/engine"
)

// BenchmarkStep measures what a step costs the runtime, with the executor
// at no cost: one request of b.N tokens on rank 0 of four. Without expert
// parallelism rank 0 steps alone; with it, every step is a collective of
// the four ranks (each sends its report to the three others and waits for
// theirs). The difference is the collective's overhead per step.
func BenchmarkStep(b *testing.B) {
	for _, ep := range []bool{false, true} {
		b.Run(fmt.Sprintf("ranks=4/expert_parallel=%v", ep), func(b *testing.B) {
			tn := startProfileNode(b, "qwen3-30b-a3b-h200", 4, 0, -1, 0, func(cfg *NodeConfig) {
				cfg.ExpertParallel = ep
				cfg.Scheduler.MaxModelLen = max(cfg.Scheduler.MaxModelLen, b.N+64)
				cfg.Scheduler.NumBlocks = max(cfg.Scheduler.NumBlocks, (b.N+64)/cfg.Scheduler.BlockSize+1)
			})
			if ep {
				for {
					v, err := tn.View(context.Background())
					if err == nil && len(v.Coordinator.Group) == 4 {
						break
					}
					time.Sleep(time.Millisecond)
				}
			}
			s := NewStream()
			b.ResetTimer()
			start := time.Now()
			tn.Submit(&Submission{ID: "long", Prompt: tn.tok.Tokens("step overhead"), Sampling: engine.SamplingParams{MaxTokens: b.N, IgnoreEOS: true},
				Rank: 0, Stream: s, Arrival: time.Now()})
			r := collect(context.Background(), s)
			elapsed := time.Since(start)
			b.StopTimer()
			if r.err != nil || len(r.tokens) != b.N {
				b.Fatalf("%v, %d tokens", r.err, len(r.tokens))
			}
			b.ReportMetric(float64(elapsed.Microseconds())/float64(b.N), "µs/step")
		})
	}
}
