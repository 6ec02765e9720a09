package httpapi

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
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

func TestAdminDrainNeedsAnAdminKeyOrALocalCaller(t *testing.T) {
	drained := 0
	newServer := func(apiKey, adminKey string) *Server {
		var api, admin *Keys
		if apiKey != "" {
			api, _ = NewKeys([]string{apiKey}, "")
		}
		if adminKey != "" {
			admin, _ = NewKeys([]string{adminKey}, "")
		}
		s, err := New(Config{Backend: viewBackend{&actors.ClusterView{}}, Tokenizer: sim.NewTokenizer(0), MaxModelLen: 100,
			Gatherer: prometheus.NewRegistry(), APIKeys: api, AdminKeys: admin, OnDrain: func() { drained++ }})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	cases := []struct {
		name, apiKey, adminKey, remote, auth string
		code                                 int
	}{
		{"no key, remote caller", "", "", "10.1.2.3:5000", "", http.StatusForbidden},
		{"no key, local caller", "", "", "127.0.0.1:5000", "", http.StatusAccepted},
		{"API key only, remote caller with the API key", "k", "", "10.1.2.3:5000", "Bearer k", http.StatusForbidden},
		{"admin key, no token", "k", "a", "127.0.0.1:5000", "", http.StatusUnauthorized},
		{"admin key, a client's API key", "k", "a", "10.1.2.3:5000", "Bearer k", http.StatusUnauthorized},
		{"admin key, remote caller with it", "k", "a", "10.1.2.3:5000", "Bearer a", http.StatusAccepted},
	}
	for _, tc := range cases {
		before := drained
		req := httptest.NewRequest(http.MethodPost, "/admin/drain", nil)
		req.RemoteAddr = tc.remote
		if tc.auth != "" {
			req.Header.Set("Authorization", tc.auth)
		}
		rec := httptest.NewRecorder()
		newServer(tc.apiKey, tc.adminKey).Handler().ServeHTTP(rec, req)
		if rec.Code != tc.code || (drained > before) != (tc.code == http.StatusAccepted) {
			t.Errorf("%s: %d, drain started %v; want %d", tc.name, rec.Code, drained > before, tc.code)
		}
		// Go's profiles are an admin route too.
		req = httptest.NewRequest(http.MethodGet, "/debug/pprof/goroutine?debug=1", nil)
		req.RemoteAddr = tc.remote
		if tc.auth != "" {
			req.Header.Set("Authorization", tc.auth)
		}
		rec = httptest.NewRecorder()
		newServer(tc.apiKey, tc.adminKey).Handler().ServeHTTP(rec, req)
		want := tc.code
		if want == http.StatusAccepted {
			want = http.StatusOK
		}
		if rec.Code != want || (want == http.StatusOK) != strings.Contains(rec.Body.String(), "goroutine profile") {
			t.Errorf("%s: /debug/pprof/goroutine: %d; want %d", tc.name, rec.Code, want)
		}
	}
	// While draining, new work is refused and /health says so.
	s := newServer("", "")
	s.SetDraining()
	rec := httptest.NewRecorder()
	s.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1/completions", strings.NewReader(`{"prompt":"x"}`)))
	if rec.Code != http.StatusServiceUnavailable || rec.Header().Get("Retry-After") == "" {
		t.Fatalf("a request while draining: %d", rec.Code)
	}
	rec = httptest.NewRecorder()
	s.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/health", nil))
	if rec.Code != http.StatusServiceUnavailable || !strings.Contains(rec.Body.String(), "draining") {
		t.Fatalf("/health while draining: %d %s", rec.Code, rec.Body)
	}
}
