package control

import (
	"fmt"
	"strings"
	"testing"

	"pgregory.net/rapid"
)

// join assigns a claim and commits it, as the coordinator does once the
// node serves.
func join(t *testing.T, r Roster, node string, count int) (Roster, Hold) {
	t.Helper()
	r, h, err := r.Assign(Claim{Node: node, Start: -1, Count: count}, nil, 1)
	if err != nil {
		t.Fatal(err)
	}
	r, ok := r.Commit(node, 1)
	if !ok {
		t.Fatalf("%s had no joining hold to commit", node)
	}
	h.Joining = false
	return r, h
}

func TestAssignTakesTheLowestFreeRanks(t *testing.T) {
	var r Roster
	r, a, err := r.Assign(Claim{Node: "a", Start: -1, Count: 2}, nil, 1)
	if err != nil || a != (Hold{Node: "a", Start: 0, Count: 2, Joining: true}) || r.Version != 1 || r.Size() != 0 || r.Has(0) {
		t.Fatalf("first node: %+v, roster %+v, %v", a, r, err)
	}
	// Its ranks join the deployment once it serves them.
	r, _ = r.Commit("a", 1)
	if r.Version != 2 || r.Size() != 2 || !r.Has(1) {
		t.Fatalf("a committed: %+v", r)
	}
	r, b := join(t, r, "b", 2)
	r, c := join(t, r, "c", 2)
	if b.Start != 2 || c.Start != 4 || r.Size() != 6 || r.Span() != 6 || r.Version != 6 {
		t.Fatalf("b %+v c %+v roster %+v", b, c, r)
	}
	// b leaves: a hole at 2-3, which the next node fills; the size
	// follows the holds, not the span.
	r, ok := r.Release("b", 1)
	if !ok || r.Size() != 4 || r.Span() != 6 || r.Has(2) || !r.Has(4) {
		t.Fatalf("after b left: %+v (released %v)", r, ok)
	}
	r, d := join(t, r, "d", 2)
	if d.Start != 2 {
		t.Fatalf("d took %+v, want the hole at 2", d)
	}
	// A node that comes back (it crashed) keeps its ranks, and nothing
	// changes.
	again, c2, err := r.Assign(Claim{Node: "c", Start: -1, Count: 2}, nil, 1)
	if err != nil || c2 != c || again.Version != r.Version {
		t.Fatalf("c back: %+v, version %d -> %d, %v", c2, r.Version, again.Version, err)
	}
	// A member that hosts ranks the roster does not record (it gave them
	// back and has not left yet) keeps them from others.
	_, e, _ := r.Assign(Claim{Node: "e", Start: -1, Count: 1}, []Member{{Name: "x", StartRank: 6, LocalSize: 1}}, 1)
	if e.Start != 7 {
		t.Fatalf("e took %+v, want 7 (6 is busy)", e)
	}
}

func TestAssignRefusesWhatCannotBe(t *testing.T) {
	fixed, _ := join(t, Roster{Fixed: 4}, "a", 2)
	for _, tc := range []struct {
		name  string
		r     Roster
		c     Claim
		busy  []Member
		wants string
	}{
		{"full", fixed, Claim{Node: "b", Start: -1, Count: 3}, nil, "no 3 free consecutive ranks below 4"},
		{"past the end", fixed, Claim{Node: "b", Start: 3, Count: 2}, nil, "ranks end at 3"},
		{"held", fixed, Claim{Node: "b", Start: 1, Count: 1}, nil, "already held"},
		{"busy", fixed, Claim{Node: "b", Start: 2, Count: 1}, []Member{{StartRank: 2, LocalSize: 2}}, "already held"},
		{"no ranks", Roster{}, Claim{Node: "b", Start: -1}, nil, "at least one"},
		{"experts", Roster{Holds: []Hold{{Node: "a", Count: 2}}}, Claim{Node: "b", Start: -1, Count: 1, Experts: 128}, nil, "does not divide the model's 128 experts"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, _, err := tc.r.Assign(tc.c, tc.busy, 2)
			if err == nil || !strings.Contains(err.Error(), tc.wants) {
				t.Fatalf("err = %v, want one saying %q", err, tc.wants)
			}
			if got.Version != tc.r.Version {
				t.Fatalf("a refused claim changed the roster: version %d -> %d", tc.r.Version, got.Version)
			}
		})
	}
	// Growing by steps that divide the experts is fine.
	r := Roster{Holds: []Hold{{Node: "a", Count: 2}}}
	if _, h, err := r.Assign(Claim{Node: "b", Start: -1, Count: 2, Experts: 128}, nil, 1); err != nil || h.Start != 2 {
		t.Fatalf("2 -> 4 ranks of 128 experts: %+v, %v", h, err)
	}
}

// Whatever the order of joins, restarts and leaves, holds never overlap,
// every rank below the span that is not held is one a join would take
// before growing the span, and the version rises exactly with changes.
func TestRosterProperties(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		var r Roster
		if rapid.Bool().Draw(t, "fixed") {
			r.Fixed = rapid.IntRange(1, 24).Draw(t, "size")
		}
		steps := rapid.IntRange(1, 40).Draw(t, "steps")
		for i := range steps {
			node := fmt.Sprint("n", rapid.IntRange(0, 7).Draw(t, "node"))
			before := r
			switch rapid.IntRange(0, 4).Draw(t, "op") {
			case 0:
				var ok bool
				r, ok = r.Commit(node, 1)
				old, held := before.Holding(node)
				if ok != (held && old.Joining) || (ok && r.Size() != before.Size()+old.Count && r.Elastic()) {
					t.Fatalf("step %d: commit of %s: committed %v, held %+v, size %d -> %d", i, node, ok, old, before.Size(), r.Size())
				}
			case 1:
				var ok bool
				r, ok = r.Release(node, 1)
				_, held := before.Holding(node)
				if ok != held || (ok && r.Version != before.Version+1) || (!ok && r.Version != before.Version) {
					t.Fatalf("step %d: release of %s: released %v, held %v, version %d -> %d", i, node, ok, held, before.Version, r.Version)
				}
			default:
				count := rapid.IntRange(1, 4).Draw(t, "count")
				next, h, err := r.Assign(Claim{Node: node, Start: -1, Count: count}, nil, 1)
				if err != nil {
					if next.Version != r.Version {
						t.Fatalf("step %d: a refused claim changed the roster", i)
					}
					continue
				}
				r = next
				if old, ok := before.Holding(node); ok && old.Count == count {
					if h != old || r.Version != before.Version {
						t.Fatalf("step %d: %s came back and moved from %v to %v", i, node, old, h)
					}
					continue
				}
				// Lowest free: no run of count free ranks starts below h.
				for s := 0; s < h.Start; s++ {
					free := true
					for k := s; k < s+count; k++ {
						if other, ok := r.Holder(k); ok && other.Node != node {
							free = false
						}
					}
					if free {
						t.Fatalf("step %d: %s got %v, but ranks %d to %d were free", i, node, h, s, s+count-1)
					}
				}
			}
			seen := map[int]string{}
			size := 0
			for _, h := range r.Holds {
				for k := h.Start; k < h.End(); k++ {
					if seen[k] != "" {
						t.Fatalf("step %d: rank %d held by %s and %s", i, k, seen[k], h.Node)
					}
					seen[k] = h.Node
				}
				if !h.Joining {
					size += h.Count
				}
			}
			if r.Elastic() && r.Size() != size {
				t.Fatalf("step %d: size %d, holds cover %d", i, r.Size(), size)
			}
			if !r.Elastic() && r.Span() > r.Fixed {
				t.Fatalf("step %d: ranks past the fixed size %d", i, r.Fixed)
			}
		}
	})
}

func TestNewerOrdersVersionThenEpoch(t *testing.T) {
	a, b := Roster{Version: 3, Epoch: 9}, Roster{Version: 4, Epoch: 1}
	if !b.Newer(a) || a.Newer(b) || a.Newer(a) {
		t.Fatal("a later version must supersede an earlier one, whatever its epoch")
	}
	if c := (Roster{Version: 3, Epoch: 10}); !c.Newer(a) {
		t.Fatal("of one version, the later epoch's roster wins")
	}
}

func TestElectCountsOnlyTheRostersRanks(t *testing.T) {
	r := Roster{Holds: []Hold{{Node: "a", Start: 0, Count: 2}, {Node: "b", Start: 2, Count: 2}, {Node: "c", Start: 6, Count: 2}}}
	// b gave its ranks back? Not here: a and c see each other, 4 of 6.
	e := Elect([]Member{{Name: "a", Boot: 1, StartRank: 0, LocalSize: 2}, {Name: "c", Boot: 2, StartRank: 6, LocalSize: 2}}, r)
	if !e.Quorum || e.RanksSeen != 4 {
		t.Fatalf("a and c: %+v, want a quorum of 4 of 6", e)
	}
	// A member hosting ranks the roster does not have counts for nothing.
	e = Elect([]Member{{Name: "a", Boot: 1, StartRank: 0, LocalSize: 2}, {Name: "x", Boot: 2, StartRank: 4, LocalSize: 2}}, r)
	if e.Quorum || e.RanksSeen != 2 {
		t.Fatalf("a and x: %+v, want 2 of 6 and no quorum", e)
	}
}

func TestAFixedDeploymentGrowsFromItsFirstNode(t *testing.T) {
	// Ranks 0-1 of a fixed 4 given out: the first node holds all of the
	// roster and decides, though it has no quorum of the size.
	r := Roster{Version: 1, Fixed: 4, Holds: []Hold{{Node: "a", Start: 0, Count: 2}}}
	e := Elect([]Member{{Name: "a", Boot: 1, StartRank: 0, LocalSize: 2, Key: "a"}}, r)
	if e.Quorum || !e.Decides {
		t.Fatalf("%+v: want no quorum of 4, and the roster decided by a", e)
	}
	// Once b holds 2-3, neither half decides alone.
	r.Holds = append(r.Holds, Hold{Node: "b", Start: 2, Count: 2})
	if e := Elect([]Member{{Name: "a", Boot: 1, StartRank: 0, LocalSize: 2, Key: "a"}}, r); e.Decides {
		t.Fatalf("%+v: half of the given ranks decides", e)
	}
	// A pending member counts for its ranks but never leads.
	e = Elect([]Member{{Name: "b", Boot: 0, Key: "b", Pending: true}, {Name: "a", Boot: 1, StartRank: 0, LocalSize: 2, Key: "a"}}, r)
	if e.Leader.Name != "a" || !e.Quorum || !e.Decides {
		t.Fatalf("%+v: want a leading 4 of 4", e)
	}
}
