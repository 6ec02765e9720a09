package sim

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/dpnode/dpnode/engine"
)

func newTestExecutor(t *testing.T, scale float64, clock engine.Clock) *Executor {
	t.Helper()
	e, err := NewExecutor(ExecutorConfig{
		Profile:   loadProfile(t, "llama-3.1-8b-h100"),
		Tokenizer: NewTokenizer(0),
		Clock:     clock,
		TimeScale: scale,
	})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// TestExecutorSleepsTheScaledModelledTime runs a step on a virtual clock:
// the clock moves by exactly the scaled step time, with no waiting.
func TestExecutorSleepsTheScaledModelledTime(t *testing.T) {
	clock := engine.NewVirtualClock(time.Unix(0, 0))
	e := newTestExecutor(t, 0.5, clock)
	sp := &engine.SamplingParams{}
	b := &engine.Batch{
		Requests: []engine.ScheduledRequest{
			{ID: "a", PromptHash: 1, Sampling: sp, NumNewTokens: 100, SampleIndex: 0},
			{ID: "b", PromptHash: 2, Sampling: sp, NumComputed: 499, NumNewTokens: 1, SampleIndex: 3, Decode: true},
		},
		Shape: engine.Shape{NumPrefillTokens: 100, PrefillContextProduct: 100 * 50,
			NumDecodeSeqs: 1, DecodeContextTokens: 500},
	}
	res, err := e.Execute(context.Background(), b)
	if err != nil {
		t.Fatal(err)
	}
	want := e.cfg.Profile.StepTime(Shape(b.Shape))
	if res.Duration != want || clock.Now().Sub(time.Unix(0, 0)) != want/2 {
		t.Fatalf("duration %v, clock moved %v; want %v and half of it", res.Duration, clock.Now().Sub(time.Unix(0, 0)), want)
	}
	if res.Tokens[0] != e.cfg.Tokenizer.Sample(1, 0, sp) || res.Tokens[1] != e.cfg.Tokenizer.Sample(2, 3, sp) {
		t.Fatalf("tokens %v are not the deterministic samples", res.Tokens)
	}
}

func TestZeroTimeScaleDoesNotSleep(t *testing.T) {
	clock := engine.NewVirtualClock(time.Unix(0, 0))
	e := newTestExecutor(t, 0, clock)
	b := &engine.Batch{Requests: []engine.ScheduledRequest{{Sampling: &engine.SamplingParams{}, NumNewTokens: 8, SampleIndex: 0}}, Shape: engine.Shape{NumPrefillTokens: 8}}
	if _, err := e.Execute(context.Background(), b); err != nil {
		t.Fatal(err)
	}
	if !clock.Now().Equal(time.Unix(0, 0)) {
		t.Fatal("a zero time scale slept")
	}
}

func TestExecuteReturnsWhenCancelled(t *testing.T) {
	e := newTestExecutor(t, 1000, engine.RealClock{})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	b := &engine.Batch{Requests: []engine.ScheduledRequest{{Sampling: &engine.SamplingParams{}, NumNewTokens: 8, SampleIndex: 0}}, Shape: engine.Shape{NumPrefillTokens: 8}}
	if _, err := e.Execute(ctx, b); err == nil {
		t.Fatal("a cancelled step reported success")
	}
}

func TestNewExecutorRejectsBadConfig(t *testing.T) {
	p := loadProfile(t, "llama-3.1-8b-h100")
	for _, cfg := range []ExecutorConfig{
		{Tokenizer: NewTokenizer(0), Clock: engine.RealClock{}},
		{Profile: p, Clock: engine.RealClock{}},
		{Profile: p, Tokenizer: NewTokenizer(0)},
		{Profile: p, Tokenizer: NewTokenizer(0), Clock: engine.RealClock{}, TimeScale: -1},
	} {
		if _, err := NewExecutor(cfg); err == nil {
			t.Errorf("NewExecutor(%+v) accepted", cfg)
		}
	}
}

func TestSampleIsDeterministicWordsEndingInEOS(t *testing.T) {
	tok := NewTokenizer(0)
	h := engine.PromptHash(tok.Tokens("Tell me about data parallelism."), nil)
	sp := &engine.SamplingParams{}
	n := NaturalLength(h)
	if n < 32 || n > 1024 {
		t.Fatalf("natural length %d outside 32..1024", n)
	}
	var ids []uint32
	for i := 0; ; i++ {
		id := tok.Sample(h, i, sp)
		if id != tok.Sample(h, i, sp) {
			t.Fatal("sampling the same index twice gave different tokens")
		}
		if id == EOSToken {
			if i != n {
				t.Fatalf("EOS at %d, natural length %d", i, n)
			}
			break
		}
		ids = append(ids, id)
	}
	for i := 1; i < len(ids); i++ {
		if tok.Decode(ids[i-1:i]) == "," || tok.Decode(ids[i-1:i]) == "." {
			if p := tok.Decode(ids[i : i+1]); p == "," || p == "." || p == "\n" {
				t.Fatalf("punctuation %q follows punctuation at %d", p, i)
			}
		}
	}
	text := tok.Decode(ids)
	if words := len(strings.Fields(text)); words < n/2 {
		t.Fatalf("%d tokens decoded to %d words: %q", n, words, text)
	}
	// Decoding piece by piece gives the same text, as streaming needs.
	var b strings.Builder
	for _, id := range ids {
		b.WriteString(tok.Decode([]uint32{id}))
	}
	if b.String() != text {
		t.Fatal("incremental decode differs from decoding at once")
	}
	if tok.Sample(h, n, &engine.SamplingParams{IgnoreEOS: true}) == EOSToken || tok.Sample(h, n, &engine.SamplingParams{MinTokens: n + 1}) == EOSToken {
		t.Fatal("EOS sampled despite ignore_eos or min_tokens")
	}
}

func TestTokenizerIsPrefixStable(t *testing.T) {
	tok := NewTokenizer(0)
	cases := []struct {
		prefix, rest string
	}{
		{"The system prompt says hello.", " Then the user asks a question about 12345 things."},
		{"Ünïcode wörds and\n\nnew lines", " continue here"},
		{"a", " b"},
	}
	for _, c := range cases {
		whole := tok.Tokens(c.prefix + c.rest)
		head := tok.Tokens(c.prefix)
		if len(whole) < len(head) {
			t.Fatalf("%q: whole shorter than prefix", c.prefix)
		}
		for i := range head {
			if whole[i] != head[i] {
				t.Fatalf("%q: token %d differs between the prefix alone and the whole", c.prefix, i)
			}
		}
	}
	if got := tok.Decode(tok.Tokens(" the model and the cache")); got != " the model and the cache" {
		t.Fatalf("vocabulary words do not round-trip: %q", got)
	}
	if n := len(tok.Tokens(strings.Repeat(" word", 1000))); n != 1000 {
		t.Fatalf("1000 words encode to %d tokens", n)
	}
	if ids := tok.Tokens("<|start_header_id|>user<|end_header_id|>"); len(ids) != 3 || tok.Decode(ids[:1]) != "" {
		t.Fatalf("chat template markers encode to %v; want one silent token each", ids)
	}
}

func FuzzTokenizerEncode(f *testing.F) {
	tok := NewTokenizer(0)
	f.Add("hello world, 1234567 ünï\n\n  x")
	f.Fuzz(func(t *testing.T, s string) {
		ids := tok.Tokens(s)
		if len(ids) > len(s) {
			t.Fatalf("%d tokens from %d bytes", len(ids), len(s))
		}
		for _, id := range ids {
			if id < firstWordToken || id >= tok.vocabSize {
				t.Fatalf("id %d outside the vocabulary", id)
			}
		}
	})
}

// TestCollectiveStepLastsAsLongAsTheSlowestRank prices an expert-parallel
// step: the group waits for its busiest rank, and a group of dummy steps
// still costs the dummy batch and the all-to-all.
func TestCollectiveStepLastsAsLongAsTheSlowestRank(t *testing.T) {
	clock := engine.NewVirtualClock(time.Unix(0, 0))
	e, err := NewExecutor(ExecutorConfig{Profile: loadProfile(t, "qwen3-30b-a3b-h200"), Tokenizer: NewTokenizer(0), Clock: clock, TimeScale: 1})
	if err != nil {
		t.Fatal(err)
	}
	heavy := engine.Shape{NumPrefillTokens: 2048, PrefillContextProduct: 2048 * 1024}
	light := engine.Shape{NumDecodeSeqs: 4, DecodeContextTokens: 4000}
	c := &engine.Collective{Shapes: []engine.Shape{light, heavy, {}}, TotalTokens: 2052}
	got := e.StepTime(&engine.Batch{Shape: light, Collective: c})
	want := e.cfg.Profile.StepTime(BatchShape{PrefillTokens: 2048, PrefillContextProduct: 2048 * 1024, EPRanks: 3, EPTotalTokens: 2052})
	if got != want || got <= e.cfg.Profile.StepTime(Shape(light)) {
		t.Fatalf("the light rank's step takes %v, want the heavy rank's %v", got, want)
	}
	dummies := &engine.Collective{Shapes: make([]engine.Shape, 4)}
	if d := e.StepTime(&engine.Batch{Collective: dummies}); d <= 0 {
		t.Fatalf("a step of four dummies takes %v", d)
	}
	cross := *c
	cross.CrossNode = true
	if e.StepTime(&engine.Batch{Collective: &cross}) <= got {
		t.Fatal("a collective across nodes costs no more than within one")
	}
}
