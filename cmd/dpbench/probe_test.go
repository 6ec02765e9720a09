package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

func TestProbeCountsAnswersThatAreNotOK(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/health" {
			w.WriteHeader(http.StatusOK)
			return
		}
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*probeInterval)
	defer cancel()
	ps := probe(ctx, srv.Client(), srv.URL, []string{"/health", "/busy"})
	if len(ps) != 2 || ps[0].Sent == 0 || ps[0].NotOK != 0 || ps[1].Sent == 0 || ps[1].NotOK != ps[1].Sent {
		t.Fatalf("probes: %+v; want /health all 200 and /busy none", ps)
	}
	if ps[0].Latency.Max <= 0 || ps[0].Latency.Max > float64(10*time.Second/time.Millisecond) {
		t.Fatalf("latency %+v", ps[0].Latency)
	}
}
