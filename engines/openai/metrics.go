package openai

import (
	"context"
	"errors"
	"io"
	"math"
	"net/http"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// The server metrics a rank's load is read from, by server: vLLM's (which
// dpnode exports too), then llama-server's (with --metrics).
var (
	runningSeries = []string{"vllm:num_requests_running", "llamacpp:requests_processing"}
	waitingSeries = []string{"vllm:num_requests_waiting", "llamacpp:requests_deferred"}
	kvSeries      = []string{"vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"}
)

var nanBits = math.Float64bits(math.NaN())

func bitsFloat(b uint64) float64 { return math.Float64frombits(b) }

// watchMetrics reads the server's /metrics every MetricsInterval, and
// wakes the rank when its load moved. A server without /metrics (404) is
// not asked again.
func (c *core) watchMetrics() {
	defer c.wg.Done()
	t := time.NewTicker(c.cfg.MetricsInterval)
	defer t.Stop()
	for {
		select {
		case <-c.ctx.Done():
			return
		case <-t.C:
		}
		fams, err := c.scrape()
		var se *statusError
		if errors.As(err, &se) && se.status == http.StatusNotFound {
			c.cfg.Logger.Info("the server has no /metrics: the rank's load is dpnode's count of its requests alone", "url", c.srv.base)
			return
		}
		if err != nil {
			continue
		}
		running, waiting := sum(fams, runningSeries, false), sum(fams, waitingSeries, false)
		kv := sum(fams, kvSeries, true)
		changed := false
		if !math.IsNaN(running) && !math.IsNaN(waiting) {
			changed = c.srvRunning.Swap(int64(running)) != int64(running) || changed
			changed = c.srvWaiting.Swap(int64(waiting)) != int64(waiting) || changed
		}
		if !math.IsNaN(kv) {
			old := bitsFloat(c.srvKV.Swap(math.Float64bits(kv)))
			changed = changed || !(math.Abs(old-kv) < 0.01)
		}
		if changed {
			select {
			case c.wake <- struct{}{}:
			default:
			}
		}
	}
}

// scrape reads the server's metrics.
func (c *core) scrape() (map[string]*dto.MetricFamily, error) {
	ctx, cancel := context.WithTimeout(c.ctx, c.cfg.HealthTimeout)
	defer cancel()
	resp, err := c.srv.request(ctx, http.MethodGet, "/metrics", nil)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	return p.TextToMetricFamilies(io.LimitReader(resp.Body, 16<<20))
}

// sum adds the samples of the first of names the families hold, over
// every label set (a server's engines, or dpnode's ranks), or averages
// them (a share); NaN when none is there.
func sum(fams map[string]*dto.MetricFamily, names []string, mean bool) float64 {
	for _, n := range names {
		f := fams[n]
		if f == nil {
			continue
		}
		total := 0.0
		for _, m := range f.GetMetric() {
			switch {
			case m.Gauge != nil:
				total += m.GetGauge().GetValue()
			case m.Counter != nil:
				total += m.GetCounter().GetValue()
			case m.Untyped != nil:
				total += m.GetUntyped().GetValue()
			}
		}
		if mean && len(f.GetMetric()) > 0 {
			total /= float64(len(f.GetMetric()))
		}
		return total
	}
	return math.NaN()
}
