package httpapi

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dpnode/dpnode/actors"
	"github.com/dpnode/dpnode/dp"
	"github.com/dpnode/dpnode/engine/sim"
)

// viewBackend answers views only.
type viewBackend struct{ view *actors.ClusterView }

func (b viewBackend) Model() string                                     { return "m" }
func (b viewBackend) Topology() dp.Topology                             { return dp.Topology{Size: 2, LocalSize: 2} }
func (b viewBackend) Submit(*actors.Submission)                         {}
func (b viewBackend) Abort(string)                                      {}
func (b viewBackend) Finished(actors.Outcome)                           {}
func (b viewBackend) View(context.Context) (*actors.ClusterView, error) { return b.view, nil }

func TestHealthStates(t *testing.T) {
	rank := func(r int, ready, failed bool) actors.RankView {
		return actors.RankView{Rank: r, Balanced: true, Ready: ready, Failed: failed}
	}
	cases := []struct {
		name   string
		ranks  []actors.RankView
		code   int
		status string
	}{
		{"all ready", []actors.RankView{rank(0, true, false), rank(1, true, false)}, 200, "ok"},
		{"one restarting", []actors.RankView{rank(0, true, false), rank(1, false, false)}, 200, "degraded"},
		{"one failed", []actors.RankView{rank(0, true, false), rank(1, false, true)}, 200, "degraded"},
		{"none ready", []actors.RankView{rank(0, false, true), rank(1, false, false)}, 503, "unavailable"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s, err := New(Config{Backend: viewBackend{&actors.ClusterView{Ranks: tc.ranks}}, Tokenizer: sim.NewTokenizer(0),
				MaxModelLen: 100, Gatherer: prometheus.NewRegistry()})
			if err != nil {
				t.Fatal(err)
			}
			rec := httptest.NewRecorder()
			s.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/health", nil))
			var body struct {
				Status string `json:"status"`
				Failed []int  `json:"ranks_failed"`
			}
			if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil || rec.Code != tc.code || body.Status != tc.status {
				t.Fatalf("%d %s; want %d %s", rec.Code, rec.Body, tc.code, tc.status)
			}
		})
	}
}
