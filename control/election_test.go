package control

import (
	"slices"
	"strings"
	"testing"

	"pgregory.net/rapid"
)

func TestElectOldestWithQuorum(t *testing.T) {
	a := Member{Name: "a", Boot: 100, StartRank: 0, LocalSize: 2}
	b := Member{Name: "b", Boot: 200, StartRank: 2, LocalSize: 2}
	c := Member{Name: "c", Boot: 300, StartRank: 4, LocalSize: 1}
	cases := []struct {
		name    string
		members []Member
		size    int
		leader  string
		quorum  bool
	}{
		{"oldest leads", []Member{b, a}, 4, "a", true},
		{"after the oldest dies", []Member{b}, 4, "b", false},
		{"a majority of ranks", []Member{b, c}, 5, "b", true},
		{"half is not a majority", []Member{a}, 4, "a", false},
		{"one node is the whole cluster", []Member{{Name: "solo", Boot: 1, LocalSize: 2}}, 2, "solo", true},
		{"a rankless API node counts for nothing", []Member{{Name: "api", Boot: 1}, c}, 5, "api", false},
		{"ties go by name", []Member{{Name: "y", Boot: 5, LocalSize: 1}, {Name: "x", Boot: 5, StartRank: 1, LocalSize: 1}}, 2, "x", true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := Elect(tc.members, Roster{Fixed: tc.size})
			if e.Leader.Name != tc.leader || e.Quorum != tc.quorum || e.Epoch != uint64(e.Leader.Boot) {
				t.Fatalf("Elect = %+v; want leader %s, quorum %v", e, tc.leader, tc.quorum)
			}
		})
	}
}

// TestEpochsOnlyGrowAsLeadersDie kills the leader again and again: each
// new leader's epoch is above the last.
func TestEpochsOnlyGrowAsLeadersDie(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(1, 12).Draw(t, "members")
		var ms []Member
		for i := range n {
			ms = append(ms, Member{Name: string(rune('a' + i)), Boot: rapid.Int64Range(0, 50).Draw(t, "boot"), StartRank: i, LocalSize: 1})
		}
		last := uint64(0)
		for len(ms) > 0 {
			e := Elect(ms, Roster{Fixed: n})
			if e.Epoch < last {
				t.Fatalf("epoch went from %d down to %d", last, e.Epoch)
			}
			last = e.Epoch
			ms = slices.DeleteFunc(ms, func(m Member) bool { return m.Name == e.Leader.Name })
		}
	})
}

func TestRankConflictNamesTheFirstClaimant(t *testing.T) {
	members := []Member{{Name: "node-a", StartRank: 0, LocalSize: 2}, {Name: "node-b", StartRank: 2, LocalSize: 2}}
	err := RankConflict(Member{Name: "node-c", StartRank: 3, LocalSize: 1}, members)
	if err == nil || !strings.Contains(err.Error(), "rank 3 is already served by node node-b") {
		t.Fatalf("error %v", err)
	}
	if err := RankConflict(Member{Name: "node-c", StartRank: 4, LocalSize: 2}, members); err != nil {
		t.Fatal(err)
	}
	if err := RankConflict(Member{Name: "node-a", StartRank: 0, LocalSize: 2}, members); err != nil {
		t.Fatalf("a node conflicts with itself: %v", err)
	}
}
