package httpapi

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dpnode/dpnode/actors"
	"github.com/dpnode/dpnode/engine/sim"
)

// TestClusterPageLoadsWithoutAKeyAndItsDataNeedsOne: a browser cannot
// send a bearer token when it opens a page, so the page is served to
// anyone and holds no data; /v1/cluster, which it polls, needs the key.
// The page may run its own inline script and nothing else.
func TestClusterPageLoadsWithoutAKeyAndItsDataNeedsOne(t *testing.T) {
	keys, _ := NewKeys([]string{"k"}, "")
	for _, metricsOnly := range []bool{false, true} {
		s, err := New(Config{Backend: viewBackend{&actors.ClusterView{Model: "secret-model"}}, Tokenizer: sim.NewTokenizer(0), MaxModelLen: 100,
			Gatherer: prometheus.NewRegistry(), APIKeys: keys, MetricsOnly: metricsOnly})
		if err != nil {
			t.Fatal(err)
		}
		get := func(path, auth string) *httptest.ResponseRecorder {
			req := httptest.NewRequest(http.MethodGet, path, nil)
			if auth != "" {
				req.Header.Set("Authorization", auth)
			}
			rec := httptest.NewRecorder()
			s.Handler().ServeHTTP(rec, req)
			return rec
		}
		page := get("/cluster", "")
		body := page.Body.String()
		if page.Code != http.StatusOK || !strings.HasPrefix(page.Header().Get("Content-Type"), "text/html") || !strings.Contains(body, `fetch("v1/cluster"`) {
			t.Fatalf("metrics only %v: GET /cluster: %d %q", metricsOnly, page.Code, page.Header().Get("Content-Type"))
		}
		if strings.Contains(body, "secret-model") {
			t.Fatal("the page carries the cluster's data")
		}
		csp := page.Header().Get("Content-Security-Policy")
		if !strings.Contains(csp, "script-src "+inlineHash(clusterPage, "script")) || !strings.Contains(csp, "default-src 'none'") {
			t.Fatalf("the page's policy %q does not pin its script", csp)
		}
		if code := get("/v1/cluster", "").Code; code != http.StatusUnauthorized {
			t.Fatalf("metrics only %v: /v1/cluster without the key: %d", metricsOnly, code)
		}
		if rec := get("/v1/cluster", "Bearer k"); rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), "secret-model") {
			t.Fatalf("metrics only %v: /v1/cluster with the key: %d", metricsOnly, rec.Code)
		}
	}
}
