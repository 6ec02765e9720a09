package actors

import (
	"math"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/dpnode/dpnode/engine"
)

func TestTokenBucketsAreVLLMs(t *testing.T) {
	for _, c := range []struct {
		maxModelLen int
		want        []float64
	}{
		{100, []float64{1, 2, 5, 10, 20, 50, 100}},
		{4096, []float64{1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000}},
		{32768, []float64{1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000}},
	} {
		if got := tokenBuckets(c.maxModelLen); !slices.Equal(got, c.want) {
			t.Errorf("tokenBuckets(%d) = %v, want %v", c.maxModelLen, got, c.want)
		}
	}
}

// histogram returns the count and sum of the family's series of engine 0.
func histogram(t *testing.T, reg *prometheus.Registry, name string) (uint64, float64) {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			if labelOf(m, "engine") == "0" {
				return m.GetHistogram().GetSampleCount(), m.GetHistogram().GetSampleSum()
			}
		}
	}
	t.Fatalf("no %s series of engine 0", name)
	return 0, 0
}

func labelOf(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// TestOutcomeFillsVLLMsRequestSeries: a finished request's phases are
// vLLM's (queue, then prefill to the first token, then decode), and an
// abort counts no request figures.
func TestOutcomeFillsVLLMsRequestSeries(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg, "m", 4096)
	m.forRank(0, true)
	m.recordOutcome(Outcome{Rank: 0, Reason: engine.FinishedLength, PromptTokens: 300, Latency: 1100 * time.Millisecond,
		GenerationTokens: 11, FirstToken: 100 * time.Millisecond, Queued: 40 * time.Millisecond, MaxTokens: 11, N: 2, MaxGenerationTokens: 12})
	m.recordOutcome(Outcome{Rank: 0, Reason: engine.FinishedAbort, PromptTokens: 7, Latency: time.Second})
	for _, c := range []struct {
		name  string
		count uint64
		sum   float64
	}{
		{"vllm:request_prompt_tokens", 1, 300},
		{"vllm:request_generation_tokens", 1, 11},
		{"vllm:request_params_max_tokens", 1, 11},
		{"vllm:request_params_n", 1, 2},
		{"vllm:request_max_num_generation_tokens", 1, 12},
		{"vllm:request_queue_time_seconds", 1, 0.04},
		{"vllm:request_prefill_time_seconds", 1, 0.06},
		{"vllm:request_decode_time_seconds", 1, 1},
		{"vllm:request_inference_time_seconds", 1, 1.06},
		{"vllm:request_time_per_output_token_seconds", 1, 0.1},
		{"vllm:e2e_request_latency_seconds", 1, 1.1},
	} {
		count, sum := histogram(t, reg, c.name)
		if count != c.count || math.Abs(sum-c.sum) > 1e-9 {
			t.Errorf("%s: %d observations summing to %g, want %d summing to %g", c.name, count, sum, c.count, c.sum)
		}
	}
	// A request the client asked no max_tokens of, and one of n
	// requests that is not the last to end, count neither.
	m.recordOutcome(Outcome{Rank: 0, Reason: engine.FinishedStop, PromptTokens: 1, Latency: time.Second, GenerationTokens: 1})
	for _, name := range []string{"vllm:request_params_max_tokens", "vllm:request_params_n", "vllm:request_max_num_generation_tokens"} {
		if count, _ := histogram(t, reg, name); count != 1 {
			t.Errorf("%s: %d observations after a request without the parameter, want 1", name, count)
		}
	}
	// One token: no time per output token to speak of, as vLLM's 0.
	if count, sum := histogram(t, reg, "vllm:request_time_per_output_token_seconds"); count != 2 || math.Abs(sum-0.1) > 1e-9 {
		t.Errorf("time per output token: %d observations summing to %g, want 2 summing to 0.1", count, sum)
	}
}

// TestEverySeriesExistsBeforeItsFirstEvent: an alert on rate(x) > 0 or a
// dashboard panel needs the series at zero, not absent until something
// happens.
func TestEverySeriesExistsBeforeItsFirstEvent(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg, "m", 1024)
	m.forRank(0, true)
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	for _, f := range families {
		seen[f.GetName()] = len(f.GetMetric())
	}
	for _, name := range []string{"dpnode_requests_failed_total", "vllm:request_success_total", "vllm:request_queue_time_seconds",
		"vllm:request_prompt_tokens", "vllm:iteration_tokens_total", "dpnode_engine_step_phase_seconds_total", "dpnode_requests_migrated_total"} {
		if seen[name] == 0 {
			t.Errorf("%s has no series before its first event", name)
		}
	}
	if seen["dpnode_requests_failed_total"] != len(failReasons) {
		t.Errorf("dpnode_requests_failed_total has %d series, want one per reason (%d)", seen["dpnode_requests_failed_total"], len(failReasons))
	}
}
