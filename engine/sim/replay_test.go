package sim

import (
	"context"
	"fmt"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/dpnode/dpnode/engine"
)

// TestCalibrationThroughTheScheduler replays each measured batch size
// through the real scheduler and the simulated executor on a virtual
// clock: batch-many requests with ~1k-token prompts decode together, and
// the median time of a decode step (the inter-token latency) must land
// within 15% of the measured median.
func TestCalibrationThroughTheScheduler(t *testing.T) {
	for _, name := range ProfileNames(repoRoot) {
		p := loadProfile(t, name)
		for _, a := range p.Measured {
			t.Run(fmt.Sprintf("%s/batch=%d", name, a.Batch), func(t *testing.T) {
				itl := replayDecode(t, p, a.Batch, a.ContextTokens)
				relErr := (itl - a.MedianITLMs) / a.MedianITLMs
				t.Logf("%s batch %d at %d context: measured %.2f ms, replayed %.2f ms (%+.1f%%)", name, a.Batch, a.ContextTokens, a.MedianITLMs, itl, 100*relErr)
				if math.Abs(relErr) > 0.15 {
					t.Fatalf("replayed inter-token latency %.2f ms is %+.1f%% off the measured %.2f ms", itl, 100*relErr, a.MedianITLMs)
				}
			})
		}
	}
}

// replayDecode returns the median decode-step time in milliseconds.
func replayDecode(t *testing.T, p *Profile, batch, contextTokens int) float64 {
	t.Helper()
	// The measured runs kept every sequence resident; a batch whose KV
	// would not fit (512 sequences of 1k tokens on one H100) ran with
	// shorter contexts, so shrink the context to what the cache holds.
	perSeq := p.KVCacheBlocks * p.BlockSize / batch
	contextTokens = min(contextTokens, perSeq-64-p.BlockSize)
	// Requests decode long enough that the last admitted still overlaps
	// the first: prefilling the batch takes this many chunks.
	outTokens := batch*contextTokens/p.MaxNumBatchedTokens + 32
	cfg := engine.SchedulerConfig{
		MaxNumSeqs:          batch,
		MaxNumBatchedTokens: max(p.MaxNumBatchedTokens, batch),
		BlockSize:           p.BlockSize,
		NumBlocks:           p.KVCacheBlocks,
		MaxModelLen:         p.MaxModelLen,
		EnablePrefixCaching: true,
		EOSTokenIDs:         []uint32{EOSToken},
	}
	s, err := engine.NewScheduler(cfg)
	if err != nil {
		t.Fatal(err)
	}
	clock := engine.NewVirtualClock(time.Unix(0, 0))
	exec, err := NewExecutor(ExecutorConfig{Profile: p, Tokenizer: NewTokenizer(0), Clock: clock, TimeScale: 1})
	if err != nil {
		t.Fatal(err)
	}
	for i := range batch {
		prompt := make([]uint32, contextTokens)
		for j := range prompt {
			prompt[j] = uint32(1000 + (i*7919+j*31)%100000)
		}
		if err := s.Add(engine.NewRequest{ID: fmt.Sprint(i), Prompt: prompt, Sampling: engine.SamplingParams{MaxTokens: outTokens, IgnoreEOS: true}}); err != nil {
			t.Fatal(err)
		}
	}
	var decode []float64
	for s.HasWork() {
		b := s.Schedule()
		before := clock.Now()
		res, err := exec.Execute(context.Background(), b)
		if err != nil {
			t.Fatal(err)
		}
		if b.NumPrefillTokens == 0 && b.NumDecodeSeqs == batch {
			decode = append(decode, float64(clock.Now().Sub(before))/float64(time.Millisecond))
		}
		s.Update(b, res)
	}
	if st := s.Stats(); st.NumPreemptions > 0 {
		t.Fatalf("%d preemptions: the replay must keep every sequence resident", st.NumPreemptions)
	}
	if len(decode) == 0 {
		t.Fatal("no step decoded the whole batch")
	}
	slices.Sort(decode)
	return decode[len(decode)/2]
}
