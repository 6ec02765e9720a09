package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"
)

// ProbeSummary is how an endpoint that must stay responsive under load
// (/health, /metrics) answered while a run sent it work.
type ProbeSummary struct {
	Path string `json:"path"`
	// Sent counts the probes; NotOK those that failed or did not answer
	// 200.
	Sent    int         `json:"sent"`
	NotOK   int         `json:"not_ok"`
	Latency Percentiles `json:"latency_ms"`
}

// probeInterval is how often each probed path is asked during a run.
const probeInterval = 50 * time.Millisecond

// probe GETs each of paths every probeInterval, one at a time per path,
// until ctx is done, and returns how they answered.
func probe(ctx context.Context, client *http.Client, base string, paths []string) []ProbeSummary {
	out := make([]ProbeSummary, len(paths))
	var wg sync.WaitGroup
	for i, path := range paths {
		wg.Go(func() {
			s := ProbeSummary{Path: path}
			var lat []time.Duration
			tick := time.NewTicker(probeInterval)
			defer tick.Stop()
			for {
				select {
				case <-ctx.Done():
					s.Latency = percentiles(lat)
					out[i] = s
					return
				case <-tick.C:
				}
				s.Sent++
				start := time.Now()
				ok := false
				// A probe has its own deadline, not the run's: one that
				// cannot answer within it is a failed probe.
				pctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				req, err := http.NewRequestWithContext(pctx, http.MethodGet, base+path, nil)
				if err == nil {
					var resp *http.Response
					if resp, err = client.Do(req); err == nil {
						_, _ = io.Copy(io.Discard, resp.Body)
						resp.Body.Close()
						ok = resp.StatusCode == http.StatusOK
					}
				}
				cancel()
				lat = append(lat, time.Since(start))
				if !ok {
					s.NotOK++
				}
			}
		})
	}
	wg.Wait()
	return out
}

// printProbes writes the probes of each run, under its table.
func printProbes(w io.Writer, sums []Summary) {
	for _, s := range sums {
		for _, p := range s.Probes {
			fmt.Fprintf(w, "%s: GET %s during the run: %d sent, %d not 200; latency p50 %s, p99 %s, max %s\n",
				s.Label, p.Path, p.Sent, p.NotOK, fmtMs(p.Latency.P50), fmtMs(p.Latency.P99), fmtMs(p.Latency.Max))
		}
	}
}
