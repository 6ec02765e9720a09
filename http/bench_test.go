package httpapi_test

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// BenchmarkRequestPath measures what the runtime adds to a request: HTTP
// in, the API server actor, an engine actor stepping a zero-cost executor,
// and SSE out. Each op is one streamed chat completion over loopback; the
// reported percentiles are of whole requests, all of it runtime.
func BenchmarkRequestPath(b *testing.B) {
	for _, tc := range []struct {
		tokens, parallel int
	}{{1, 1}, {16, 1}, {16, 16}} {
		// One node at a time: each has its own actor transport, and
		// protoactor's start of one touches process-wide gRPC state that a
		// running one reads.
		ts := startServer(b, 0)
		b.Run(fmt.Sprintf("tokens=%d/clients=%d", tc.tokens, tc.parallel*runtime.GOMAXPROCS(0)), func(b *testing.B) {
			body := fmt.Sprintf(`{"messages":[{"role":"user","content":"benchmark"}],"max_tokens":%d,"ignore_eos":true,"stream":true}`, tc.tokens)
			var mu sync.Mutex
			var lat []time.Duration
			b.SetParallelism(tc.parallel)
			b.ResetTimer()
			start := time.Now()
			b.RunParallel(func(pb *testing.PB) {
				var mine []time.Duration
				for pb.Next() {
					t0 := time.Now()
					req, _ := http.NewRequest(http.MethodPost, ts.base+"/v1/chat/completions", strings.NewReader(body))
					req.Header.Set("Authorization", "Bearer "+apiKey)
					resp, err := ts.http.Do(req)
					if err != nil {
						b.Error(err)
						return
					}
					out, err := io.ReadAll(resp.Body)
					resp.Body.Close()
					if err != nil || !bytes.HasSuffix(out, []byte("data: [DONE]\n\n")) {
						b.Errorf("incomplete stream: %v", err)
						return
					}
					mine = append(mine, time.Since(t0))
				}
				mu.Lock()
				lat = append(lat, mine...)
				mu.Unlock()
			})
			elapsed := time.Since(start)
			b.StopTimer()
			if len(lat) == 0 {
				return
			}
			slices.Sort(lat)
			pct := func(p float64) float64 { return float64(lat[int(p*float64(len(lat)-1))].Microseconds()) }
			b.ReportMetric(float64(len(lat))/elapsed.Seconds(), "req/s")
			b.ReportMetric(pct(0.50), "p50-µs")
			b.ReportMetric(pct(0.99), "p99-µs")
		})
		if err := ts.run.Shutdown(); err != nil {
			b.Fatal(err)
		}
	}
}
