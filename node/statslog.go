package node

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// StatsInterval is how often the stats line is logged, as vLLM's
// VLLM_LOG_STATS_INTERVAL.
const StatsInterval = 10 * time.Second

// rankFigures are one rank's figures as the metrics tell them: counters
// (cumulative) and gauges (now).
type rankFigures struct {
	promptTokens, generationTokens float64
	prefixQueries, prefixHits      float64
	moves, restarts                float64
	running, waiting, kvUsage      float64
	inFlight                       float64
	// local is set for a rank of this node (its engine's gauges are
	// here).
	local bool
}

// statsLogger logs, every StatsInterval while there is work, one line with
// vLLM's figures summed over the node's ranks and dpnode's own, and one
// per rank at debug. It reads the node's metrics, so the lines say what
// the dashboards say.
type statsLogger struct {
	gather prometheus.Gatherer
	logger *slog.Logger
	last   map[string]rankFigures
	lastAt time.Time
	// busy is set when the last interval had work: the line after work
	// stops, at zero, is logged too, as vLLM's.
	busy bool
}

func (s *statsLogger) run(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	s.last, s.lastAt = s.read(), time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			s.log(now)
		}
	}
}

// log reads the figures and logs the interval since the last read.
func (s *statsLogger) log(now time.Time) {
	cur := s.read()
	secs := now.Sub(s.lastAt).Seconds()
	if secs <= 0 {
		return
	}
	delta := func(r string, f func(rankFigures) float64) float64 { return max(0, f(cur[r])-f(s.last[r])) }
	var total rankFigures
	var kvSum float64
	locals := 0
	inFlight := []float64{}
	ranks := slices.Sorted(func(yield func(string) bool) {
		for r := range cur {
			if !yield(r) {
				return
			}
		}
	})
	level := slog.LevelDebug
	for _, r := range ranks {
		c := cur[r]
		d := rankFigures{
			promptTokens:     delta(r, func(f rankFigures) float64 { return f.promptTokens }),
			generationTokens: delta(r, func(f rankFigures) float64 { return f.generationTokens }),
			prefixQueries:    delta(r, func(f rankFigures) float64 { return f.prefixQueries }),
			prefixHits:       delta(r, func(f rankFigures) float64 { return f.prefixHits }),
			moves:            delta(r, func(f rankFigures) float64 { return f.moves }),
			restarts:         delta(r, func(f rankFigures) float64 { return f.restarts }),
		}
		total.promptTokens += d.promptTokens
		total.generationTokens += d.generationTokens
		total.prefixQueries += d.prefixQueries
		total.prefixHits += d.prefixHits
		total.moves += d.moves
		total.restarts += d.restarts
		total.running += c.running
		total.waiting += c.waiting
		total.inFlight += c.inFlight
		inFlight = append(inFlight, c.inFlight)
		if c.local {
			kvSum += c.kvUsage
			locals++
		}
		if s.logger.Enabled(context.Background(), slog.LevelDebug) {
			s.logger.Debug("rank stats", "rank", r, "prompt_throughput", perSecond(d.promptTokens, secs),
				"generation_throughput", perSecond(d.generationTokens, secs), "running", int(c.running), "waiting", int(c.waiting),
				"kv_cache_usage", percent(c.kvUsage), "prefix_cache_hit_rate", hitRate(d.prefixHits, d.prefixQueries),
				"in_flight", int(c.inFlight), "moves", int(d.moves), "restarts", int(d.restarts))
		}
	}
	busy := total.promptTokens > 0 || total.generationTokens > 0 || total.inFlight > 0
	if busy || s.busy {
		level = slog.LevelInfo
	}
	s.busy = busy
	kv := 0.0
	if locals > 0 {
		kv = kvSum / float64(locals)
	}
	spread := "-"
	if len(inFlight) > 0 {
		spread = fmt.Sprintf("%d-%d", int(slices.Min(inFlight)), int(slices.Max(inFlight)))
	}
	s.logger.Log(context.Background(), level, "stats", "prompt_throughput", perSecond(total.promptTokens, secs),
		"generation_throughput", perSecond(total.generationTokens, secs), "running", int(total.running), "waiting", int(total.waiting),
		"kv_cache_usage", percent(kv), "prefix_cache_hit_rate", hitRate(total.prefixHits, total.prefixQueries),
		"in_flight", int(total.inFlight), "in_flight_per_rank", spread, "moves", int(total.moves), "restarts", int(total.restarts))
	s.last, s.lastAt = cur, now
}

func perSecond(n, secs float64) string { return strconv.FormatFloat(n/secs, 'f', 1, 64) + " tokens/s" }

func percent(f float64) string { return strconv.FormatFloat(100*f, 'f', 1, 64) + "%" }

func hitRate(hits, queries float64) string {
	if queries == 0 {
		return "-"
	}
	return percent(hits / queries)
}

// read takes each rank's figures from the metrics, by their engine label.
func (s *statsLogger) read() map[string]rankFigures {
	out := map[string]rankFigures{}
	families, err := s.gather.Gather()
	if err != nil {
		s.logger.Debug("stats: reading the metrics", "error", err)
	}
	for _, f := range families {
		var set func(*rankFigures, float64)
		local := false
		switch f.GetName() {
		case "vllm:prompt_tokens_total":
			set = func(r *rankFigures, v float64) { r.promptTokens += v }
		case "vllm:generation_tokens_total":
			set = func(r *rankFigures, v float64) { r.generationTokens += v }
		case "vllm:prefix_cache_queries_total":
			set, local = func(r *rankFigures, v float64) { r.prefixQueries += v }, true
		case "vllm:prefix_cache_hits_total":
			set, local = func(r *rankFigures, v float64) { r.prefixHits += v }, true
		case "dpnode_requests_migrated_total", "dpnode_requests_redispatched_total":
			set = func(r *rankFigures, v float64) { r.moves += v }
		case "dpnode_engine_restarts_total":
			set, local = func(r *rankFigures, v float64) { r.restarts += v }, true
		case "vllm:num_requests_running":
			set, local = func(r *rankFigures, v float64) { r.running += v }, true
		case "vllm:num_requests_waiting":
			set, local = func(r *rankFigures, v float64) { r.waiting += v }, true
		case "vllm:kv_cache_usage_perc":
			set, local = func(r *rankFigures, v float64) { r.kvUsage += v }, true
		case "dpnode_requests_in_flight":
			set = func(r *rankFigures, v float64) { r.inFlight += v }
		default:
			continue
		}
		for _, m := range f.GetMetric() {
			rank := label(m, "engine")
			if rank == "" {
				continue
			}
			r := out[rank]
			set(&r, value(m))
			r.local = r.local || local
			out[rank] = r
		}
	}
	return out
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

func value(m *dto.Metric) float64 {
	switch {
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	}
	return 0
}
