package grafana

import (
	"fmt"
	"os"
	"regexp"
	"slices"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	dto "github.com/prometheus/client_model/go"

	"github.com/dpnode/dpnode/actors"
	"github.com/dpnode/dpnode/engine/sim"
	httpapi "github.com/dpnode/dpnode/http"
)

// seriesRecorder is a prometheus.Registerer that records the names of the
// series each collector registered on it exports, as Prometheus stores
// them: a histogram's _bucket, _sum and _count, a summary's quantiles
// under its own name with its _sum and _count.
type seriesRecorder struct {
	// family is each series' metric family: its name in the collector.
	family map[string]string
}

func (r *seriesRecorder) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := r.Register(c); err != nil {
			panic(err)
		}
	}
}

func (r *seriesRecorder) Unregister(prometheus.Collector) bool { return false }

// Register records c's series. A vector's type is its Go type: before its
// first labels it collects nothing to ask. Anything else is asked what it
// collects.
func (r *seriesRecorder) Register(c prometheus.Collector) error {
	var suffixes []string
	switch c.(type) {
	case *prometheus.CounterVec, *prometheus.GaugeVec:
		suffixes = []string{""}
	case *prometheus.HistogramVec:
		suffixes = []string{"_bucket", "_sum", "_count"}
	case *prometheus.SummaryVec:
		suffixes = []string{"", "_sum", "_count"}
	default:
		return r.gather(c)
	}
	descs := make(chan *prometheus.Desc)
	go func() { c.Describe(descs); close(descs) }()
	for d := range descs {
		name, err := descName(d)
		if err != nil {
			return err
		}
		for _, s := range suffixes {
			r.family[name+s] = name
		}
	}
	return nil
}

// gather records what c collects, by the type of each family.
func (r *seriesRecorder) gather(c prometheus.Collector) error {
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(c); err != nil {
		return err
	}
	families, err := reg.Gather()
	if err != nil {
		return err
	}
	if len(families) == 0 {
		return fmt.Errorf("%T collects nothing, so its series cannot be told", c)
	}
	for _, f := range families {
		suffixes := []string{""}
		switch f.GetType() {
		case dto.MetricType_HISTOGRAM, dto.MetricType_GAUGE_HISTOGRAM:
			suffixes = []string{"_bucket", "_sum", "_count"}
		case dto.MetricType_SUMMARY:
			suffixes = []string{"", "_sum", "_count"}
		}
		for _, s := range suffixes {
			r.family[f.GetName()+s] = f.GetName()
		}
	}
	return nil
}

// descFQName is the name in a Desc's String: client_golang exports no
// accessor for it.
var descFQName = regexp.MustCompile(`^Desc\{fqName: "([^"]+)"`)

func descName(d *prometheus.Desc) (string, error) {
	m := descFQName.FindStringSubmatch(d.String())
	if m == nil {
		return "", fmt.Errorf("no name in %s", d)
	}
	return m[1], nil
}

// exportedSeries are the series dpnode's /metrics has, each with its
// family: the node's (actors.NewMetrics), the API server's (httpapi.New),
// and the Go and process collectors that node.Start registers beside
// them.
func exportedSeries() (map[string]string, error) {
	r := &seriesRecorder{family: map[string]string{}}
	actors.NewMetrics(r, "model", 1024)
	// A key file's metrics exist with one.
	f, err := os.CreateTemp("", "keys")
	if err != nil {
		return nil, err
	}
	defer os.Remove(f.Name())
	_, _ = f.WriteString("key\n")
	f.Close()
	keys, err := httpapi.NewKeys(nil, f.Name())
	if err != nil {
		return nil, err
	}
	_, err = httpapi.New(httpapi.Config{
		// New asks nothing of its backend.
		Backend:     struct{ httpapi.Backend }{},
		Tokenizer:   sim.NewTokenizer(0),
		MaxModelLen: 1024,
		APIKeys:     keys,
		Registerer:  r,
		Gatherer:    prometheus.NewRegistry(),
	})
	if err != nil {
		return nil, err
	}
	if err := httpapi.NewConnCap(1).Register(r); err != nil {
		return nil, err
	}
	for _, c := range []prometheus.Collector{collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})} {
		if err := r.Register(c); err != nil {
			return nil, err
		}
	}
	return r.family, nil
}

func TestExportedSeries(t *testing.T) {
	series, err := exportedSeries()
	if err != nil {
		t.Fatal(err)
	}
	// One of each kind: a vLLM gauge, a histogram's series, dpnode's
	// own counter and gauge, the API server's, the Go and process
	// collectors'.
	for _, want := range []string{
		"vllm:num_requests_running",
		"vllm:time_to_first_token_seconds_bucket", "vllm:time_to_first_token_seconds_count",
		"dpnode_requests_migrated_total", "dpnode_data_parallel_size",
		"dpnode_http_requests_rejected_total",
		"go_goroutines", "go_gc_duration_seconds", "go_gc_duration_seconds_sum", "process_resident_memory_bytes",
	} {
		if _, ok := series[want]; !ok {
			t.Errorf("%s is not among the series recorded", want)
		}
	}
	// A histogram's own name is no series.
	for _, notWant := range []string{"vllm:time_to_first_token_seconds", "dpnode_collective_wait_seconds"} {
		if _, ok := series[notWant]; ok {
			t.Errorf("%s is recorded, but a histogram exports only its _bucket, _sum and _count", notWant)
		}
	}
	if t.Failed() {
		var all []string
		for n := range series {
			all = append(all, n)
		}
		slices.Sort(all)
		t.Logf("recorded: %q", all)
	}
}
