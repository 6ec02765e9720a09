//go:build !chaos

package httpapi

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dpnode/dpnode/actors"
	"github.com/dpnode/dpnode/engine/sim"
)

// TestNoFaultInjectionInProductionBuilds: /debug/fault exists only in
// builds with the chaos tag.
func TestNoFaultInjectionInProductionBuilds(t *testing.T) {
	s, err := New(Config{Backend: viewBackend{&actors.ClusterView{}}, Tokenizer: sim.NewTokenizer(0), MaxModelLen: 100, Gatherer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodPost, "/debug/fault?target=engine&rank=0", nil)
	req.RemoteAddr = "127.0.0.1:1"
	s.Handler().ServeHTTP(rec, req)
	if rec.Code != http.StatusNotFound {
		t.Fatalf("POST /debug/fault: %d; a production build must not have it", rec.Code)
	}
}
