package httpapi_test

import (
	"bytes"
	"fmt"
	"log/slog"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	prommodel "github.com/prometheus/common/model"

	"github.com/dpnode/dpnode/node"
)

// vllmDashboard is every query of vLLM's own Grafana dashboard, as
// vllm-project/vllm has it at commit
// 4b5c627c23e6690b8987100d1cbf78e34ac14bf9
// (examples/observability/prometheus_grafana/grafana.json), by panel and
// target. Its variable $model_name is label_values(model_name).
var vllmDashboard = []struct{ panel, expr string }{
	{"E2E Request Latency P99", `histogram_quantile(0.99, sum by(le) (rate(vllm:e2e_request_latency_seconds_bucket{model_name="$model_name"}[$__rate_interval])))`},
	{"E2E Request Latency P95", `histogram_quantile(0.95, sum by(le) (rate(vllm:e2e_request_latency_seconds_bucket{model_name="$model_name"}[$__rate_interval])))`},
	{"E2E Request Latency P90", `histogram_quantile(0.9, sum by(le) (rate(vllm:e2e_request_latency_seconds_bucket{model_name="$model_name"}[$__rate_interval])))`},
	{"E2E Request Latency P50", `histogram_quantile(0.5, sum by(le) (rate(vllm:e2e_request_latency_seconds_bucket{model_name="$model_name"}[$__rate_interval])))`},
	{"E2E Request Latency Average", "rate(vllm:e2e_request_latency_seconds_sum{model_name=\"$model_name\"}[$__rate_interval])\n/\nrate(vllm:e2e_request_latency_seconds_count{model_name=\"$model_name\"}[$__rate_interval])"},
	{"Token Throughput Prompt Tokens/Sec", `rate(vllm:prompt_tokens_total{model_name="$model_name"}[$__rate_interval])`},
	{"Token Throughput Generation Tokens/Sec", `rate(vllm:generation_tokens_total{model_name="$model_name"}[$__rate_interval])`},
	{"Inter Token Latency P99", `histogram_quantile(0.99, sum by(le) (rate(vllm:inter_token_latency_seconds_bucket{model_name="$model_name"}[$__rate_interval])))`},
	{"Inter Token Latency P95", `histogram_quantile(0.95, sum by(le) (rate(vllm:inter_token_latency_seconds_bucket{model_name="$model_name"}[$__rate_interval])))`},
	{"Inter Token Latency P90", `histogram_quantile(0.9, sum by(le) (rate(vllm:inter_token_latency_seconds_bucket{model_name="$model_name"}[$__rate_interval])))`},
	{"Inter Token Latency P50", `histogram_quantile(0.5, sum by(le) (rate(vllm:inter_token_latency_seconds_bucket{model_name="$model_name"}[$__rate_interval])))`},
	{"Inter Token Latency Mean", "rate(vllm:inter_token_latency_seconds_sum{model_name=\"$model_name\"}[$__rate_interval])\n/\nrate(vllm:inter_token_latency_seconds_count{model_name=\"$model_name\"}[$__rate_interval])"},
	{"Scheduler State Num Running", `vllm:num_requests_running{model_name="$model_name"}`},
	{"Scheduler State Num Waiting", `vllm:num_requests_waiting{model_name="$model_name"}`},
	{"Time To First Token Latency P99", `histogram_quantile(0.99, sum by(le) (rate(vllm:time_to_first_token_seconds_bucket{model_name="$model_name"}[$__rate_interval])))`},
	{"Time To First Token Latency P95", `histogram_quantile(0.95, sum by(le) (rate(vllm:time_to_first_token_seconds_bucket{model_name="$model_name"}[$__rate_interval])))`},
	{"Time To First Token Latency P90", `histogram_quantile(0.9, sum by(le) (rate(vllm:time_to_first_token_seconds_bucket{model_name="$model_name"}[$__rate_interval])))`},
	{"Time To First Token Latency P50", `histogram_quantile(0.5, sum by(le) (rate(vllm:time_to_first_token_seconds_bucket{model_name="$model_name"}[$__rate_interval])))`},
	{"Time To First Token Latency Average", "rate(vllm:time_to_first_token_seconds_sum{model_name=\"$model_name\"}[$__rate_interval])\n/\nrate(vllm:time_to_first_token_seconds_count{model_name=\"$model_name\"}[$__rate_interval])"},
	{"Cache Utilization GPU Cache Usage", `vllm:kv_cache_usage_perc{model_name="$model_name"}`},
	{"Request Prompt Length", `sum by(le) (increase(vllm:request_prompt_tokens_bucket{model_name="$model_name"}[$__rate_interval]))`},
	{"Request Generation Length", `sum by(le) (increase(vllm:request_generation_tokens_bucket{model_name="$model_name"}[$__rate_interval]))`},
	{"Finish Reason", `sum by(finished_reason) (increase(vllm:request_success_total{model_name="$model_name"}[$__rate_interval]))`},
	{"Queue Time", `rate(vllm:request_queue_time_seconds_sum{model_name="$model_name"}[$__rate_interval])`},
	{"Requests Prefill and Decode Time Prefill", `rate(vllm:request_prefill_time_seconds_sum{model_name="$model_name"}[$__rate_interval])`},
	{"Requests Prefill and Decode Time Decode", `rate(vllm:request_decode_time_seconds_sum{model_name="$model_name"}[$__rate_interval])`},
	{"Max Generation Token in Sequence Group", `rate(vllm:request_max_num_generation_tokens_sum{model_name="$model_name"}[$__rate_interval])`},
}

// selector is a metric with the dashboard's one label matcher.
var selector = regexp.MustCompile(`(vllm:[a-zA-Z0-9_:]+)\{model_name="\$model_name"\}`)

// scrape reads the node's /metrics.
func (ts *testServer) scrape(t *testing.T) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := ts.http.Get(ts.base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(prommodel.LegacyValidation)
	families, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return families
}

// series finds what a query's series name reads: a family, or one part of
// a histogram's (_bucket, _sum, _count), and the value that says it has
// data: a counter's value, a histogram's count, 1 for a gauge.
func series(families map[string]*dto.MetricFamily, name string) (*dto.MetricFamily, func(*dto.Metric) float64) {
	if f := families[name]; f != nil {
		if f.GetType() == dto.MetricType_GAUGE {
			return f, func(*dto.Metric) float64 { return 1 }
		}
		return f, func(m *dto.Metric) float64 { return m.GetCounter().GetValue() }
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if f := families[strings.TrimSuffix(name, suffix)]; f != nil && strings.HasSuffix(name, suffix) && f.GetType() == dto.MetricType_HISTOGRAM {
			return f, func(m *dto.Metric) float64 { return float64(m.GetHistogram().GetSampleCount()) }
		}
	}
	return nil, nil
}

func labelValue(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// TestVLLMDashboardHasData runs vLLM's own dashboard's queries against a
// live node after a few requests: every series a query reads must have
// samples of the served model's name, per engine, and those that count
// requests or tokens must have counted some. A "No data" panel is the
// failure this catches.
func TestVLLMDashboardHasData(t *testing.T) {
	const served = "dashboard-model"
	ts := startServer(t, 0, func(o *node.Options) { o.ServedModelName = served })
	for i, body := range []string{
		`{"prompt": "a few words to count", "max_tokens": 6}`,
		`{"prompt": "and a stream of them", "max_tokens": 5, "stream": true}`,
		`{"prompt": "two at once", "max_tokens": 4, "n": 2}`,
	} {
		if code, out := ts.post(t, "/v1/completions", body, nil); code != http.StatusOK {
			t.Fatalf("request %d: %d %s", i, code, out)
		}
	}
	families := ts.scrape(t)
	// The dashboard's $model_name is label_values(model_name).
	names := map[string]bool{}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			if v := labelValue(m, "model_name"); v != "" {
				names[v] = true
			}
		}
	}
	if len(names) != 1 || !names[served] {
		t.Errorf("label_values(model_name) gives %v, want only %s", names, served)
	}
	for _, q := range vllmDashboard {
		t.Run(q.panel, func(t *testing.T) {
			reads := selector.FindAllStringSubmatch(q.expr, -1)
			if len(reads) == 0 {
				t.Fatalf("no series found in %s", q.expr)
			}
			for _, r := range reads {
				f, has := series(families, r[1])
				if f == nil {
					t.Errorf("%s: no such series on /metrics", r[1])
					continue
				}
				samples, engines, data := 0, map[string]bool{}, 0.0
				for _, m := range f.GetMetric() {
					if labelValue(m, "model_name") != served {
						continue
					}
					samples++
					if e := labelValue(m, "engine"); e != "" {
						engines[e] = true
					}
					data += has(m)
				}
				switch {
				case samples == 0:
					t.Errorf("%s: no samples with model_name=%q", r[1], served)
				case len(engines) != 2:
					t.Errorf("%s: samples of engines %v, want both ranks' (0 and 1)", r[1], engines)
				case data == 0:
					t.Errorf("%s: every sample is zero after %d requests", r[1], 4)
				}
			}
		})
	}
}

// syncBuffer is a log destination the node's goroutines share.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) lines(match string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, l := range strings.Split(s.b.String(), "\n") {
		if strings.Contains(l, match) {
			out = append(out, l)
		}
	}
	return out
}

// TestRequestLogIsOptIn: with --enable-log-requests one line per finished
// request says its figures and not its text; without, none.
func TestRequestLogIsOptIn(t *testing.T) {
	for _, on := range []bool{false, true} {
		t.Run(fmt.Sprint("enable-log-requests=", on), func(t *testing.T) {
			var logs syncBuffer
			ts := startServer(t, 0, func(o *node.Options) {
				o.LogRequests = on
				o.DisableLogStats = true
				o.Logger = slog.New(slog.NewTextHandler(&logs, nil))
			})
			code, out := ts.post(t, "/v1/completions", `{"prompt": "secret words", "max_tokens": 7, "n": 2}`, nil)
			if code != http.StatusOK {
				t.Fatalf("%d %s", code, out)
			}
			lines := logs.lines("request finished")
			if !on {
				if len(lines) != 0 {
					t.Fatalf("logged %q without --enable-log-requests", lines)
				}
				return
			}
			if len(lines) != 2 {
				t.Fatalf("%d request lines for a call of n=2, want 2: %q", len(lines), lines)
			}
			for _, l := range lines {
				for _, want := range []string{"level=INFO", "id=cmpl-", "rank=", "prompt_tokens=", "cached_tokens=0", "output_tokens=7",
					"ttft=", "e2e=", "finish_reason=length", "moves=0"} {
					if !strings.Contains(l, want) {
						t.Errorf("request line %q lacks %s", l, want)
					}
				}
				if strings.Contains(l, "secret") {
					t.Errorf("the request line %q has the prompt's text", l)
				}
			}
		})
	}
}

// TestModelAliases: every name of --served-model-name is served and
// listed; answers carry the first, as vLLM's.
func TestModelAliases(t *testing.T) {
	ts := startServer(t, 0, func(o *node.Options) {
		o.ServedModelName, o.ServedModelAliases = "first", []string{"second"}
	})
	var models struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	ts.getJSON(t, "/v1/models", &models)
	if len(models.Data) != 2 || models.Data[0].ID != "first" || models.Data[1].ID != "second" {
		t.Fatalf("/v1/models lists %+v, want first then second", models.Data)
	}
	code, out := ts.post(t, "/v1/completions", `{"model": "second", "prompt": "hi", "max_tokens": 2}`, nil)
	if code != http.StatusOK || !strings.Contains(string(out), `"model":"first"`) {
		t.Fatalf("asked by its second name: %d %s; want 200 answered as first", code, out)
	}
	if code, out := ts.post(t, "/v1/completions", `{"model": "third", "prompt": "hi", "max_tokens": 2}`, nil); code != http.StatusNotFound {
		t.Fatalf("asked by another name: %d %s; want 404", code, out)
	}
}
