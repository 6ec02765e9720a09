package node

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// TestStatsLineSumsTheRanks: one line with vLLM's figures over the
// interval, summed over the ranks, dpnode's spread of requests, and
// vLLM's idle rule: after work stops, one more line, then none.
func TestStatsLineSumsTheRanks(t *testing.T) {
	reg := prometheus.NewRegistry()
	labels := []string{"model_name", "engine"}
	counter := func(name string) *prometheus.CounterVec {
		c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: name}, labels)
		reg.MustRegister(c)
		return c
	}
	gauge := func(name string) *prometheus.GaugeVec {
		g := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name}, labels)
		reg.MustRegister(g)
		return g
	}
	prompt, generation := counter("vllm:prompt_tokens_total"), counter("vllm:generation_tokens_total")
	queries, hits := counter("vllm:prefix_cache_queries_total"), counter("vllm:prefix_cache_hits_total")
	migrated, restarts := counter("dpnode_requests_migrated_total"), counter("dpnode_engine_restarts_total")
	running, waiting, kv := gauge("vllm:num_requests_running"), gauge("vllm:num_requests_waiting"), gauge("vllm:kv_cache_usage_perc")
	inflight := gauge("dpnode_requests_in_flight")

	var out bytes.Buffer
	s := &statsLogger{gather: reg, logger: slog.New(slog.NewTextHandler(&out, nil))}
	start := time.Unix(1000, 0)
	s.last, s.lastAt = s.read(), start
	for e, n := range map[string]float64{"0": 300, "1": 100} {
		prompt.WithLabelValues("m", e).Add(n)
		generation.WithLabelValues("m", e).Add(n / 10)
		queries.WithLabelValues("m", e).Add(n)
		hits.WithLabelValues("m", e).Add(n / 4)
		running.WithLabelValues("m", e).Set(n / 100)
		kv.WithLabelValues("m", e).Set(n / 1000)
		inflight.WithLabelValues("m", e).Set(n / 100)
	}
	waiting.WithLabelValues("m", "1").Set(2)
	migrated.WithLabelValues("m", "0").Inc()
	restarts.WithLabelValues("m", "0").Inc()
	s.log(start.Add(10 * time.Second))
	want := `level=INFO msg=stats prompt_throughput="40.0 tokens/s" generation_throughput="4.0 tokens/s" running=4 waiting=2 kv_cache_usage=20.0% ` +
		`prefix_cache_hit_rate=25.0% in_flight=4 in_flight_per_rank=1-3 moves=1 restarts=1`
	if got := strings.TrimSpace(out.String()); !strings.HasSuffix(got, want) {
		t.Fatalf("stats line\n%s\nwant it to end\n%s", got, want)
	}
	// Work stops: one line at zero, then the node is quiet.
	for e := range []string{"0", "1"} {
		inflight.WithLabelValues("m", []string{"0", "1"}[e]).Set(0)
	}
	out.Reset()
	s.log(start.Add(20 * time.Second))
	if !strings.Contains(out.String(), `level=INFO msg=stats prompt_throughput="0.0 tokens/s"`) {
		t.Fatalf("the interval after work: %q; want one line at zero", out.String())
	}
	out.Reset()
	s.log(start.Add(30 * time.Second))
	if out.Len() != 0 {
		t.Fatalf("an idle interval logged %q at info", out.String())
	}
}

// TestStatsLineFollowsTheFlag: a node logs stats unless --disable-log-stats.
func TestStatsLineFollowsTheFlag(t *testing.T) {
	for _, off := range []bool{false, true} {
		o := DefaultOptions()
		o.Host, o.Port = "127.0.0.1", 0
		o.Bind, o.RPCPort = "127.0.0.1:0", 0
		o.Logger = slog.New(slog.DiscardHandler)
		o.DisableLogStats = off
		r, err := Start(o)
		if err != nil {
			t.Fatal(err)
		}
		if on := r.stopStats != nil; on == off {
			t.Errorf("--disable-log-stats %v: stats logged %v", off, on)
		}
		if err := r.Shutdown(); err != nil {
			t.Fatal(err)
		}
	}
}
