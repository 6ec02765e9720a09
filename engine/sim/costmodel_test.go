package sim

import (
	"math"
	"os"
	"strconv"
	"testing"
	"time"

	"pgregory.net/rapid"
)

// repoRoot is the repository root seen from this package, the fs.FS under
// which ProfileDir lies.
var repoRoot = os.DirFS("../..")

// chatContext is the "~1k context" of the calibration figures: ΣK/1000
// becomes the batch size, which is how docs/CALIBRATION.md computes its checks.
const chatContext = 1000

func loadProfile(t testing.TB, name string) *Profile {
	t.Helper()
	p, err := LoadProfile(repoRoot, name)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// TestDocumentedPredictions reproduces the predictions docs/CALIBRATION.md
// prints for its own coefficients. The document gives them to 0.1 ms, so
// the model must match within half of that last digit (0.05 ms); anything
// further off means a coefficient or the formula drifted from the document.
func TestDocumentedPredictions(t *testing.T) {
	const tolMs = 0.05
	for _, tc := range []struct {
		profile string
		batch   int
		wantMs  float64
	}{
		{"llama-3.1-8b-h100", 32, 9.0},
		{"llama-3.1-8b-h100", 64, 11.7},
		{"llama-3.1-8b-h100", 128, 17.2},
		{"qwen3-30b-a3b-h200", 1, 3.1},
		{"qwen3-30b-a3b-h200", 8, 9.0},
		{"qwen3-30b-a3b-h200", 32, 18.0},
		{"qwen3-30b-a3b-h200", 64, 21.7},
		{"qwen3-30b-a3b-h200", 128, 25.8},
		{"qwen3-30b-a3b-h200", 256, 33.5},
	} {
		p := loadProfile(t, tc.profile)
		got := ms(p.DecodeStepTime(tc.batch, chatContext))
		if math.Abs(got-tc.wantMs) > tolMs {
			t.Errorf("%s N=%d: predicted %.3f ms, document says %.1f", tc.profile, tc.batch, got, tc.wantMs)
		}
	}
}

// TestCalibration replays every profile's measured median inter-token
// latencies through the cost model. docs/CALIBRATION.md claims ~15%; an
// anchor that cannot meet that with the document's coefficients goes in
// exceptions with its actual error and why, never by moving a coefficient.
// There are none today: the worst anchor, llama-3.1-8b-h100 at batch 256,
// is predicted 7.4% slow.
func TestCalibration(t *testing.T) {
	const band = 0.15
	exceptions := map[string]float64{} // "profile/batch" -> allowed |error|
	for _, name := range ProfileNames(repoRoot) {
		p := loadProfile(t, name)
		if len(p.Measured) > 0 {
			t.Logf("%s: batch  context  measured  predicted  error", name)
		}
		for _, a := range p.Measured {
			pred := ms(p.DecodeStepTime(a.Batch, a.ContextTokens))
			relErr := (pred - a.MedianITLMs) / a.MedianITLMs
			t.Logf("%s: %5d  %7d  %8.2f  %9.2f  %+5.1f%%", name, a.Batch, a.ContextTokens, a.MedianITLMs, pred, 100*relErr)
			allowed, ok := exceptions[name+"/"+strconv.Itoa(a.Batch)]
			if !ok {
				allowed = band
			}
			if math.Abs(relErr) > allowed {
				t.Errorf("%s batch %d at %d context: predicted %.2f ms, measured %.2f (%+.1f%%, band ±%.0f%%)",
					name, a.Batch, a.ContextTokens, pred, a.MedianITLMs, 100*relErr, 100*allowed)
			}
		}
	}
}

// TestCalibrationOtherHardware holds predictions to measurements of the same
// model on other GPUs. Decode is bandwidth-bound, so on a GPU with more
// bandwidth the step is no slower than measured, and no faster than the
// measurement scaled by the bandwidth ratio (fixed launch costs do not
// shrink with bandwidth).
func TestCalibrationOtherHardware(t *testing.T) {
	for _, name := range ProfileNames(repoRoot) {
		p := loadProfile(t, name)
		for _, a := range p.MeasuredElsewhere {
			pred := ms(p.DecodeStepTime(a.Batch, a.ContextTokens))
			ratio := a.HBMBandwidthTBps / p.HBMBandwidthTBps
			lo, hi := a.MedianITLMs*min(1, ratio), a.MedianITLMs*max(1, ratio)
			t.Logf("%s: batch %d: %.2f ms measured on %s, predicted %.2f, allowed [%.2f, %.2f]",
				name, a.Batch, a.MedianITLMs, a.GPU, pred, lo, hi)
			if pred < lo || pred > hi {
				t.Errorf("%s batch %d: predicted %.2f ms outside [%.2f, %.2f] implied by %.2f ms on %s",
					name, a.Batch, pred, lo, hi, a.MedianITLMs, a.GPU)
			}
		}
	}
}

// TestCalibrationPrefill replays measured prefill throughputs: prompts
// processed back to back, each split into chunks of the profile's token
// budget, each chunk attending to the chunks before it and, causally, to
// itself (as the scheduler counts PrefillContextProduct).
func TestCalibrationPrefill(t *testing.T) {
	const band = 0.15
	// The only prefill figure is SGLang's on 8k prompts, not vLLM's;
	// docs/CALIBRATION.md claims no band for prefill, so this holds the
	// model to the same band as decode.
	exceptions := map[string]float64{}
	for _, name := range ProfileNames(repoRoot) {
		p := loadProfile(t, name)
		for _, a := range p.MeasuredPrefill {
			var total time.Duration
			for done := 0; done < a.PromptTokens; {
				chunk := min(p.MaxNumBatchedTokens, a.PromptTokens-done)
				total += p.StepTime(BatchShape{
					PrefillTokens:         chunk,
					PrefillContextProduct: int64(chunk) * (int64(done) + int64(chunk)/2),
				})
				done += chunk
			}
			pred := float64(a.PromptTokens) / total.Seconds()
			relErr := (pred - a.InputTokensPerS) / a.InputTokensPerS
			t.Logf("%s: prompts of %d: measured %.0f tok/s, predicted %.0f (%+.1f%%)",
				name, a.PromptTokens, a.InputTokensPerS, pred, 100*relErr)
			allowed, ok := exceptions[name+"/"+strconv.Itoa(a.PromptTokens)]
			if !ok {
				allowed = band
			}
			if math.Abs(relErr) > allowed {
				t.Errorf("%s prompts of %d: predicted %.0f tok/s, measured %.0f (%+.1f%%, band ±%.0f%%)",
					name, a.PromptTokens, pred, a.InputTokensPerS, 100*relErr, 100*allowed)
			}
		}
	}
}

// TestFP8AgainstBF16 checks docs/CALIBRATION.md's statement that FP8 is
// "about 0.6–0.8×" of BF16. At one sequence the fixed 2 ms step cost, which
// FP8 does not shrink, dominates and the ratio is 0.84: listed, not hidden.
func TestFP8AgainstBF16(t *testing.T) {
	bf16, fp8 := loadProfile(t, "qwen3-30b-a3b-h200"), loadProfile(t, "qwen3-30b-a3b-h200-fp8")
	for _, tc := range []struct {
		batch  int
		lo, hi float64
	}{
		{1, 0.83, 0.85}, // exception: 2.56 / 3.07 ms
		{8, 0.6, 0.8},
		{32, 0.6, 0.8},
		{64, 0.6, 0.8},
		{128, 0.6, 0.8},
		{256, 0.6, 0.8},
	} {
		r := ms(fp8.DecodeStepTime(tc.batch, chatContext)) / ms(bf16.DecodeStepTime(tc.batch, chatContext))
		if r < tc.lo || r > tc.hi {
			t.Errorf("N=%d: FP8/BF16 = %.3f, want [%.2f, %.2f]", tc.batch, r, tc.lo, tc.hi)
		}
	}
}

// TestExpectedExperts checks E(T) against the figures docs/CALIBRATION.md
// quotes and its limits: one token touches exactly experts_per_token, and
// no number of tokens touches more than the rank's share.
func TestExpectedExperts(t *testing.T) {
	p := loadProfile(t, "qwen3-30b-a3b-h200")
	for _, tc := range []struct {
		tokens, ranks int
		want, tol     float64
	}{
		{0, 1, 0, 1e-9},
		{1, 1, 8, 1e-9},
		{8, 1, 52, 0.5},
		{32, 1, 112, 0.5},
		{64, 1, 126, 0.5},
		{100000, 1, 128, 1e-9},
		{1, 2, 4, 1e-9},
		{100000, 8, 16, 1e-9},
	} {
		if got := p.expectedExperts(tc.tokens, tc.ranks); math.Abs(got-tc.want) > tc.tol {
			t.Errorf("E_%d(%d) = %.3f, want %.1f", tc.ranks, tc.tokens, got, tc.want)
		}
	}
	rapid.Check(t, func(t *rapid.T) {
		tokens := rapid.IntRange(0, 1<<20).Draw(t, "tokens")
		ranks := rapid.SampledFrom([]int{1, 2, 4, 8, 16, 32, 64, 128}).Draw(t, "ranks")
		share := float64(p.MoE.NumExperts) / float64(ranks)
		e, next := p.expectedExperts(tokens, ranks), p.expectedExperts(tokens+1, ranks)
		if e < 0 || e > share || next < e {
			t.Fatalf("E_%d(%d) = %v, E(%d) = %v: want 0 <= E <= %v and non-decreasing", ranks, tokens, e, tokens+1, next, share)
		}
	})
}

// drawShape draws a batch shape the scheduler could build for p: within the
// profile's limits, contexts within max_model_len, and for a MoE profile
// sometimes a step of an EP group.
func drawShape(t *rapid.T, p *Profile) BatchShape {
	n := rapid.IntRange(0, p.MaxNumSeqs).Draw(t, "N")
	b := BatchShape{
		PrefillTokens: rapid.IntRange(0, p.MaxNumBatchedTokens-n).Draw(t, "P"),
		DecodeSeqs:    n,
	}
	b.DecodeContextTokens = rapid.Int64Range(int64(n), int64(n)*int64(p.MaxModelLen)).Draw(t, "sumK")
	b.PrefillContextProduct = int64(b.PrefillTokens) * rapid.Int64Range(0, int64(p.MaxModelLen)).Draw(t, "prefix")
	if p.Kind == KindMoE && rapid.Bool().Draw(t, "ep") {
		b.EPRanks = rapid.SampledFrom([]int{2, 4, 8}).Draw(t, "R")
		b.EPTotalTokens = n + b.PrefillTokens + rapid.IntRange(0, 8192).Draw(t, "others")
		b.CrossNode = rapid.Bool().Draw(t, "crossNode")
	}
	return b
}

// TestStepTimeMonotone: more work in a step never makes it faster, whichever
// of P, N, ΣK, the prefix product or the group's tokens grows; and the
// collective is part of the step.
func TestStepTimeMonotone(t *testing.T) {
	for _, name := range ProfileNames(repoRoot) {
		p := loadProfile(t, name)
		t.Run(name, rapid.MakeCheck(func(t *rapid.T) {
			b := drawShape(t, p)
			grown := b
			d := rapid.IntRange(1, 4096).Draw(t, "delta")
			// The group's tokens include the rank's own: they grow with them.
			own := 0
			if b.EPRanks > 0 {
				own = d
			}
			switch rapid.IntRange(0, 4).Draw(t, "field") {
			case 0:
				grown.PrefillTokens += d
				grown.EPTotalTokens += own
			case 1:
				grown.DecodeSeqs += d
				grown.EPTotalTokens += own
			case 2:
				grown.DecodeContextTokens += int64(d)
			case 3:
				grown.PrefillContextProduct += int64(d)
			case 4:
				grown.EPTotalTokens += d
			}
			before, after := p.StepTime(b), p.StepTime(grown)
			if after < before {
				t.Fatalf("step %+v takes %v but the larger %+v takes %v", b, before, grown, after)
			}
			if c := p.CollectiveTime(b); c > before {
				t.Fatalf("collective %v exceeds its step %v for %+v", c, before, b)
			}
		}))
	}
}

// TestExpertParallel pins the EP-specific terms: the dummy step, the share
// of experts, the collective and its cross-node factor, and that a dense
// profile ignores EP.
func TestExpertParallel(t *testing.T) {
	q := loadProfile(t, "qwen3-30b-a3b-h200")
	llama := loadProfile(t, "llama-3.1-8b-h100")
	c, ep := q.Cost, q.ExpertParallel
	near := func(t *testing.T, what string, got time.Duration, wantMs float64) {
		t.Helper()
		if math.Abs(ms(got)-wantMs) > 1e-6 {
			t.Errorf("%s = %.6f ms, want %.6f", what, ms(got), wantMs)
		}
	}

	if got := q.StepTime(BatchShape{}); got != 0 {
		t.Errorf("empty step without EP = %v, want 0 (no step)", got)
	}
	if got := q.StepTime(BatchShape{EPRanks: 1, EPTotalTokens: 100}); got != 0 {
		t.Errorf("empty step with an EP group of 1 = %v, want 0 (EP of 1 is no EP)", got)
	}
	// An idle rank of 4 while the others run 64 tokens: a one-token dummy
	// batch (its token the cheaper kind, here a prefill token) that still
	// streams its share of the experts the group touches.
	near(t, "dummy EP step", q.StepTime(BatchShape{EPRanks: 4, EPTotalTokens: 64}),
		c.StepBaseMs+c.PrefillTokenMs+c.ExpertMs*q.expectedExperts(64, 4)+ep.BaseMs+ep.PrefillTokenMs)
	near(t, "dummy EP collective", q.CollectiveTime(BatchShape{EPRanks: 4, EPTotalTokens: 64}), ep.BaseMs+ep.PrefillTokenMs)

	b := BatchShape{DecodeSeqs: 32, DecodeContextTokens: 32 * chatContext, PrefillTokens: 100, EPRanks: 2, EPTotalTokens: 264}
	coll := ep.BaseMs + 32*ep.DecodeTokenMs + 100*ep.PrefillTokenMs
	near(t, "EP collective", q.CollectiveTime(b), coll)
	near(t, "EP step", q.StepTime(b),
		c.StepBaseMs+100*c.PrefillTokenMs+32*c.DecodeSeqMs+32*c.DecodeContextMsPer1K+c.ExpertMs*q.expectedExperts(264, 2)+coll)
	cross := b
	cross.CrossNode = true
	near(t, "cross-node collective", q.CollectiveTime(cross), coll*ep.CrossNodeFactor)
	near(t, "cross-node step", q.StepTime(cross)-q.StepTime(b), coll*(ep.CrossNodeFactor-1))

	// N_total below the rank's own tokens is a caller's slip; the rank's
	// own tokens are a floor.
	low := b
	low.EPTotalTokens = 0
	near(t, "EP step with N_total below own tokens", q.StepTime(low),
		ms(q.StepTime(b))-c.ExpertMs*(q.expectedExperts(264, 2)-q.expectedExperts(132, 2)))

	dense := BatchShape{DecodeSeqs: 32, DecodeContextTokens: 32 * chatContext}
	withEP := dense
	withEP.EPRanks, withEP.EPTotalTokens, withEP.CrossNode = 8, 256, true
	if llama.StepTime(withEP) != llama.StepTime(dense) || llama.CollectiveTime(withEP) != 0 {
		t.Errorf("dense profile with EP fields: step %v collective %v, want %v and 0",
			llama.StepTime(withEP), llama.CollectiveTime(withEP), llama.StepTime(dense))
	}
	if llama.StepTime(BatchShape{EPRanks: 8, EPTotalTokens: 10}) != 0 {
		t.Error("empty dense step with EP fields costs time; a dense model has no dummy batch")
	}
}

func TestPrefillPrefixTerm(t *testing.T) {
	p := loadProfile(t, "llama-3.1-8b-h100")
	// A 2,048-token chunk after 8,000 tokens of prefix: 6.3 + 0.028·2048 +
	// 0.0012·2048·8000/1000 ms.
	got := ms(p.StepTime(BatchShape{PrefillTokens: 2048, PrefillContextProduct: 2048 * 8000}))
	if want := 6.3 + 0.028*2048 + 0.0012*2048*8; math.Abs(got-want) > 1e-6 {
		t.Errorf("prefill chunk = %.6f ms, want %.6f", got, want)
	}
}

func TestNegativeShapePanics(t *testing.T) {
	p := loadProfile(t, "qwen3-30b-a3b-h200")
	for _, b := range []BatchShape{
		{PrefillTokens: -1},
		{DecodeSeqs: -1},
		{DecodeSeqs: 1, DecodeContextTokens: -1},
		{PrefillTokens: 1, PrefillContextProduct: -1},
		{DecodeSeqs: 1, EPRanks: -2},
		{DecodeSeqs: 1, EPRanks: 2, EPTotalTokens: -1},
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("StepTime(%+v) did not panic", b)
				}
			}()
			p.StepTime(b)
		}()
	}
}
