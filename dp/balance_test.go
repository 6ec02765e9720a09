package dp

import (
	"testing"

	"pgregory.net/rapid"
)

func TestLiveLoadPrefersTheLeastLoaded(t *testing.T) {
	cases := []struct {
		name  string
		ranks []RankLoad
		want  int
	}{
		{"fewer in flight", []RankLoad{{Available: true, InFlight: 3, Running: 3}, {Available: true, InFlight: 1, Running: 1}}, 1},
		{"a saturated engine's queue weighs four times", []RankLoad{{Available: true, InFlight: 6, Running: 4, Waiting: 2, Capacity: 4}, {Available: true, InFlight: 9, Running: 9, Capacity: 16}}, 1},
		{"waiting at an unsaturated engine is no queue", []RankLoad{{Available: true, InFlight: 6, Running: 4, Waiting: 2, Capacity: 16}, {Available: true, InFlight: 7, Running: 7, Capacity: 16}}, 0},
		{"fresh dispatches count before the engine reports them", []RankLoad{{Available: true, InFlight: 4}, {Available: true, InFlight: 2}}, 1},
		{"an unreported dispatch is not queue", []RankLoad{{Available: true, InFlight: 6, Running: 2, Capacity: 2}, {Available: true, InFlight: 5, Running: 1, Waiting: 1, Capacity: 1}}, 0},
		{"a full KV cache makes waiting queue", []RankLoad{{Available: true, InFlight: 10, Running: 8, Waiting: 2, KVUsage: 0.95}, {Available: true, InFlight: 11, Running: 9, Waiting: 2, KVUsage: 0.2}}, 1},
		{"unavailable ranks are skipped", []RankLoad{{Available: false}, {Available: true, InFlight: 50}}, 1},
		{"none available", []RankLoad{{Available: false}, {Available: false}}, -1},
		{"no ranks", nil, -1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var p LiveLoad
			if got := p.Pick(tc.ranks); got != tc.want {
				t.Fatalf("Pick = %d, want %d", got, tc.want)
			}
		})
	}
}

func TestLiveLoadTiesRotate(t *testing.T) {
	var p LiveLoad
	ranks := make([]RankLoad, 3)
	counts := make([]int, 3)
	for i := range ranks {
		ranks[i].Available = true
	}
	for range 30 {
		counts[p.Pick(ranks)]++
	}
	for i, c := range counts {
		if c != 10 {
			t.Fatalf("rank %d picked %d of 30 equal-load ties, want 10 (%v)", i, c, counts)
		}
	}
}

// TestLiveLoadBurstStaysBalanced sends a burst to ranks whose engines never
// report (the worst case for stale stats): exact in-flight counts alone
// keep any two ranks within one request of each other.
func TestLiveLoadBurstStaysBalanced(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(1, 16).Draw(t, "ranks")
		burst := rapid.IntRange(0, 500).Draw(t, "burst")
		ranks := make([]RankLoad, n)
		for i := range ranks {
			ranks[i] = RankLoad{Rank: i, Available: true}
		}
		var p LiveLoad
		for range burst {
			i := p.Pick(ranks)
			ranks[i].InFlight++
		}
		lo, hi := burst, 0
		for _, r := range ranks {
			lo, hi = min(lo, r.InFlight), max(hi, r.InFlight)
		}
		if n > 0 && burst > 0 && hi-lo > 1 {
			t.Fatalf("in-flight spread %d..%d after a burst of %d over %d ranks", lo, hi, burst, n)
		}
	})
}
