package dp

import (
	"maps"
	"slices"
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
			if got := p.Pick(nil, tc.ranks); got != tc.want {
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
		counts[p.Pick(nil, ranks)]++
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
			i := p.Pick(nil, ranks)
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

func prompt(prefix, n int) []uint32 {
	p := make([]uint32, n)
	for i := range p {
		p[i] = uint32(prefix*100000 + i)
	}
	return p
}

func available(n int) []RankLoad {
	ranks := make([]RankLoad, n)
	for i := range ranks {
		ranks[i] = RankLoad{Rank: i, Available: true}
	}
	return ranks
}

func TestLiveLoadFollowsACachedPrefix(t *testing.T) {
	p := &LiveLoad{Affinity: 2}
	ranks := available(4)
	shared := NewRequest(prompt(7, 160), 16, "")
	first := p.Pick(shared, ranks)
	ranks[first].InFlight++
	// Up to two requests more here than elsewhere: the prefix wins.
	for range 2 {
		if got := p.Pick(shared, ranks); got != first {
			t.Fatalf("a request with the prefix sent to rank %d went to %d (loads %+v)", first, got, ranks)
		}
		ranks[first].InFlight++
	}
	// Three more than the least loaded, and the prefix is worth two: the
	// imbalance affinity may cause is bounded.
	if got := p.Pick(shared, ranks); got == first {
		t.Fatalf("rank %d holds 3 requests against 0 elsewhere and still got the prefix's request", first)
	}
	// Another prefix is not drawn to that rank.
	other := NewRequest(prompt(8, 160), 16, "")
	if got := p.Pick(other, ranks); got == first {
		t.Fatalf("an unrelated prompt went to the loaded rank %d", first)
	}
}

func TestLiveLoadForgetsARestartedRank(t *testing.T) {
	p := &LiveLoad{Affinity: 2}
	ranks := available(2)
	shared := NewRequest(prompt(1, 64), 16, "")
	first := p.Pick(shared, ranks)
	ranks[first].InFlight = 1
	p.Forget(ranks[first].Rank)
	if got := p.Pick(shared, ranks); got == first {
		t.Fatalf("the prefix still drew the request to rank %d after its engine restarted", first)
	}
}

// TestAffinityBoundsImbalance: however the prompts share prefixes, no rank
// gets more than Affinity+1 requests beyond the least loaded one.
func TestAffinityBoundsImbalance(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(2, 8).Draw(t, "ranks")
		p := &LiveLoad{Affinity: rapid.Float64Range(0, 4).Draw(t, "affinity")}
		ranks := available(n)
		for range rapid.IntRange(1, 200).Draw(t, "burst") {
			req := NewRequest(prompt(rapid.IntRange(0, 3).Draw(t, "prefix"), rapid.IntRange(1, 100).Draw(t, "len")), 16, "")
			ranks[p.Pick(req, ranks)].InFlight++
			lo, hi := ranks[0].InFlight, ranks[0].InFlight
			for _, r := range ranks {
				lo, hi = min(lo, r.InFlight), max(hi, r.InFlight)
			}
			if float64(hi-lo) > p.Affinity+1 {
				t.Fatalf("in-flight spread %d..%d with affinity %v", lo, hi, p.Affinity)
			}
		}
	})
}

func TestSnapshotScoreIsVLLMs(t *testing.T) {
	p := &SnapshotScore{ClientCount: 1}
	ranks := available(3)
	// The snapshot: rank 0 has 2 waiting (score 8), rank 1 runs 5 (5),
	// rank 2 runs 6 (6).
	ranks[0].SnapshotWaiting = 2
	ranks[1].SnapshotRunning = 5
	ranks[2].SnapshotRunning = 6
	for i := range ranks {
		ranks[i].SnapshotSeq = 1
		// Live state the policy must not see.
		ranks[i].InFlight = 100 * (3 - i)
	}
	var got []int
	for range 4 {
		got = append(got, p.Pick(nil, ranks))
	}
	// 1 (5→9), 2 (6→10), 0 (8→12), 1 (9→13).
	if want := []int{1, 2, 0, 1}; !slices.Equal(got, want) {
		t.Fatalf("picks %v, want %v", got, want)
	}
	// A new snapshot replaces the local bumps.
	for i := range ranks {
		ranks[i].SnapshotSeq = 2
	}
	if got := p.Pick(nil, ranks); got != 1 {
		t.Fatalf("after a new snapshot picked %d, want 1", got)
	}
}

func TestRoundRobinSkipsUnavailable(t *testing.T) {
	var p RoundRobin
	ranks := available(4)
	ranks[2].Available = false
	var got []int
	for range 6 {
		got = append(got, p.Pick(nil, ranks))
	}
	if want := []int{0, 1, 3, 0, 1, 3}; !slices.Equal(got, want) {
		t.Fatalf("picks %v, want %v", got, want)
	}
	if got := p.Pick(nil, make([]RankLoad, 3)); got != -1 {
		t.Fatalf("no rank available, picked %d", got)
	}
}

func TestPowerOfTwoTakesTheLesserOfTwo(t *testing.T) {
	p := NewPowerOfTwo(1)
	ranks := available(2)
	ranks[0].InFlight = 5
	for range 20 {
		if got := p.Pick(nil, ranks); got != 1 {
			t.Fatalf("of two ranks, picked the busier %d", got)
		}
	}
	// The busiest of many is never picked: it loses every pair.
	ranks = available(5)
	for i := range ranks {
		ranks[i].InFlight = i
	}
	ranks[1].Available = false
	counts := make([]int, 5)
	for range 1000 {
		counts[p.Pick(nil, ranks)]++
	}
	if counts[4] != 0 || counts[1] != 0 || counts[0] == 0 {
		t.Fatalf("picks per rank %v", counts)
	}
}

func TestNewPolicyNames(t *testing.T) {
	for _, name := range PolicyNames {
		if _, err := NewPolicy(name, PolicyConfig{APIServers: 1, StepTokens: 8192, Seed: 1}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := NewPolicy("least-conn", PolicyConfig{}); err == nil {
		t.Fatal("an unknown policy was accepted")
	}
}

// TestNewPolicyTakesTheEnginesPrefillWeight: an engine's own weight of
// waiting prefill replaces the default. 512 tokens waiting at a rank weigh
// 2 requests at the default and 8 at 32; the other rank runs 4.
func TestNewPolicyTakesTheEnginesPrefillWeight(t *testing.T) {
	for _, tc := range []struct {
		weight float64
		want   int
	}{{0, 0}, {32, 1}} {
		pol, err := NewPolicy(PolicyLive, PolicyConfig{StepTokens: 2048, PrefillWeight: tc.weight})
		if err != nil {
			t.Fatal(err)
		}
		ranks := available(2)
		ranks[0].InFlight, ranks[0].PendingPrefill = 1, 512
		ranks[1].InFlight = 4
		if got := pol.Pick(NewRequest(prompt(5, 32), 16, ""), ranks); got != tc.want {
			t.Errorf("prefill weight %g: picked rank %d, want %d", tc.weight, got, tc.want)
		}
	}
}

// TestLiveLoadWeighsPendingPrefill: a rank with a long prompt still to
// prefill delays every first token behind it, so a new request goes to a
// rank with more requests but no prefill queued.
func TestLiveLoadWeighsPendingPrefill(t *testing.T) {
	p := NewLiveLoad(8192)
	ranks := available(2)
	ranks[0].InFlight, ranks[0].PendingPrefill = 1, 16000
	ranks[1].InFlight = 3
	req := NewRequest(prompt(3, 100), 16, "")
	if got := p.Pick(req, ranks); got != 1 {
		t.Fatalf("picked rank %d, behind 16,000 tokens of prefill", got)
	}
	// The request's own cached share counts too: a rank that holds the
	// prefix has less to prefill, and Pick says how much.
	long := NewRequest(prompt(4, 8192), 16, "")
	ranks = available(2)
	first := p.Pick(long, ranks)
	ranks[first].InFlight++
	ranks[1-first].InFlight++
	if got := p.Pick(long, ranks); got != first || long.Cached != 8192 {
		t.Fatalf("picked %d with %d cached; want %d, which holds all 8,192 tokens", got, long.Cached, first)
	}
}

// TestPrefixIndexMatchesEachRanksMemory: the shortcut for prompts no rank
// has seen never hides a prefix that some rank remembers, through records,
// trims and forgets.
func TestPrefixIndexMatchesEachRanksMemory(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(1, 5).Draw(t, "ranks")
		x := &PrefixIndex{Capacity: rapid.IntRange(1, 12).Draw(t, "capacity")}
		ranks := available(n)
		for range rapid.IntRange(1, 60).Draw(t, "ops") {
			req := NewRequest(prompt(rapid.IntRange(0, 4).Draw(t, "prefix"), rapid.IntRange(0, 120).Draw(t, "len")), 16, "")
			rank := rapid.IntRange(0, n-1).Draw(t, "rank")
			switch rapid.IntRange(0, 4).Draw(t, "op") {
			case 0:
				x.Forget(rank)
			default:
				x.Record(rank, req.Blocks)
			}
			got := x.Match(req.Blocks, ranks, nil)
			for i, r := range ranks {
				want := 0
				if rb := x.ranks[r.Rank]; rb != nil {
					for _, h := range req.Blocks {
						if _, ok := rb.used[h.Key()]; !ok {
							break
						}
						want++
					}
				}
				if got[i] != want {
					t.Fatalf("rank %d: matched %d blocks, remembers %d", r.Rank, got[i], want)
				}
			}
			// Each prompt's first block is counted once per rank that
			// remembers it, and nothing else is counted.
			count := map[uint64]int{}
			for rank, rb := range x.ranks {
				for k := range rb.firsts {
					if rb.used[k] == 0 {
						t.Fatalf("rank %d counts a first block it no longer remembers", rank)
					}
					count[k]++
				}
			}
			if !maps.Equal(count, x.holders) {
				t.Fatalf("holders %v; the ranks remember first blocks %v", x.holders, count)
			}
		}
	})
}

// TestAccountCountsWhatWasSent follows two requests through a rank's
// account: one prefilled then ended, one released before its first token
// (moved away); both leave nothing counted.
func TestAccountCountsWhatWasSent(t *testing.T) {
	var a Account
	p1, p2 := Prefill(1000, 256), Prefill(64, 128)
	if p1 != 744 || p2 != 0 {
		t.Fatalf("Prefill gave %d and %d, want 744 and 0 (a cached prefix longer than the prompt counts nothing)", p1, p2)
	}
	a.Send(p1)
	a.Send(500)
	l := a.Load(3, true, 256, EngineCounts{Waiting: 1, Running: 2, KVUsage: 0.5}, EngineCounts{Waiting: 4, Running: 5}, 9)
	want := RankLoad{Rank: 3, Available: true, InFlight: 2, Capacity: 256, Waiting: 1, Running: 2, KVUsage: 0.5,
		SnapshotWaiting: 4, SnapshotRunning: 5, SnapshotSeq: 9, PendingPrefill: 1244}
	if l != want {
		t.Fatalf("load %+v, want %+v", l, want)
	}
	a.Prefilled(p1)
	a.Release(0)
	a.Release(500)
	if a != (Account{}) {
		t.Fatalf("after every request left, the account still holds %+v", a)
	}
}
