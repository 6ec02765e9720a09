package httpapi

import (
	"context"
	"encoding/json"
	"log/slog"
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

// TestAdminRoutesNeedTheAdminKey: without an admin key the admin routes
// are off, for callers on the machine too (a same-host proxy, Istio's
// sidecar at 127.0.0.6, a browser's page); with one, its holder may call
// them from anywhere, but not in the shapes a web page sends.
func TestAdminRoutesNeedTheAdminKey(t *testing.T) {
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
			Gatherer: prometheus.NewRegistry(), APIKeys: api, AdminKeys: admin, OnDrain: func() { drained++ },
			Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	cases := []struct {
		name, apiKey, adminKey, remote, auth string
		header                               map[string]string
		code                                 int
	}{
		{"no key, remote caller", "", "", "10.1.2.3:5000", "", nil, http.StatusForbidden},
		{"no key, local caller", "", "", "127.0.0.1:5000", "", nil, http.StatusForbidden},
		{"no key, a sidecar proxy on loopback", "", "", "127.0.0.6:5000", "", nil, http.StatusForbidden},
		{"no key, a page in a local browser", "", "", "127.0.0.1:5000", "", map[string]string{"Origin": "https://evil.example", "Content-Type": "text/plain"}, http.StatusForbidden},
		{"API key only, remote caller with the API key", "k", "", "10.1.2.3:5000", "Bearer k", nil, http.StatusForbidden},
		{"admin key, no token", "k", "a", "127.0.0.1:5000", "", nil, http.StatusUnauthorized},
		{"admin key, a client's API key", "k", "a", "10.1.2.3:5000", "Bearer k", nil, http.StatusUnauthorized},
		{"admin key, remote caller with it", "k", "a", "10.1.2.3:5000", "Bearer a", nil, http.StatusAccepted},
		{"admin key, with it, from another site's page", "k", "a", "127.0.0.1:5000", "Bearer a", map[string]string{"Origin": "https://evil.example"}, http.StatusForbidden},
		{"admin key, with it, a cross-site fetch", "k", "a", "127.0.0.1:5000", "Bearer a", map[string]string{"Sec-Fetch-Site": "cross-site"}, http.StatusForbidden},
		{"admin key, with it, a form body", "k", "a", "127.0.0.1:5000", "Bearer a", map[string]string{"Content-Type": "application/x-www-form-urlencoded"}, http.StatusForbidden},
		{"admin key, with it, a text body", "k", "a", "127.0.0.1:5000", "Bearer a", map[string]string{"Content-Type": "text/plain;charset=UTF-8"}, http.StatusForbidden},
		{"admin key, with it, curl's JSON", "k", "a", "127.0.0.1:5000", "Bearer a", map[string]string{"Content-Type": "application/json"}, http.StatusAccepted},
		{"admin key, with it, the same origin", "k", "a", "127.0.0.1:5000", "Bearer a", map[string]string{"Origin": "http://example.com"}, http.StatusAccepted},
	}
	for _, tc := range cases {
		before := drained
		req := httptest.NewRequest(http.MethodPost, "/admin/drain", nil)
		req.RemoteAddr = tc.remote
		if tc.auth != "" {
			req.Header.Set("Authorization", tc.auth)
		}
		for k, v := range tc.header {
			req.Header.Set(k, v)
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
		for k, v := range tc.header {
			req.Header.Set(k, v)
		}
		rec = httptest.NewRecorder()
		newServer(tc.apiKey, tc.adminKey).Handler().ServeHTTP(rec, req)
		want := tc.code
		if want == http.StatusAccepted {
			want = http.StatusOK
		}
		if strings.HasPrefix(tc.header["Content-Type"], "application/x-www") || strings.HasPrefix(tc.header["Content-Type"], "text/plain") {
			if tc.auth == "Bearer a" {
				want = http.StatusOK // a GET's content type says nothing: it has no body
			}
		}
		if rec.Code != want || (want == http.StatusOK) != strings.Contains(rec.Body.String(), "goroutine profile") {
			t.Errorf("%s: /debug/pprof/goroutine: %d; want %d", tc.name, rec.Code, want)
		}
	}
	// While draining, new work is refused and /health says so.
	s := newServer("", "a")
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
