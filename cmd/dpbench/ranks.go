package main

import (
	"context"
	"fmt"
	"net/http"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// servedMetric counts finished requests per engine, in vLLM and dpnode.
const servedMetric = "vllm:request_success_total"

// scrapeServed sums servedMetric by engine label (the rank) over the
// metrics URLs: one per node, or one per rank behind a balancer, add up.
func scrapeServed(ctx context.Context, client *http.Client, urls []string) (map[string]float64, error) {
	served := map[string]float64{}
	for _, u := range urls {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
		if err != nil {
			return nil, err
		}
		resp, err := client.Do(req)
		if err != nil {
			return nil, err
		}
		parser := expfmt.NewTextParser(model.UTF8Validation)
		families, err := parser.TextToMetricFamilies(resp.Body)
		resp.Body.Close()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", u, err)
		}
		mf := families[servedMetric]
		if mf == nil {
			continue
		}
		for _, m := range mf.GetMetric() {
			engine := "0"
			for _, l := range m.GetLabel() {
				if l.GetName() == "engine" {
					engine = l.GetValue()
				}
			}
			served[engine] += m.GetCounter().GetValue()
		}
	}
	return served, nil
}

// servedDelta is what each engine served between two scrapes.
func servedDelta(before, after map[string]float64) map[string]float64 {
	d := map[string]float64{}
	for k, v := range after {
		d[k] = v - before[k]
	}
	return d
}
