package dp

import (
	"slices"
	"strings"
	"testing"
)

func TestTopologyValidate(t *testing.T) {
	cases := []struct {
		topo Topology
		want string // substring of the error; empty for valid
	}{
		{Topology{Size: 1, LocalSize: 1}, ""},
		{Topology{Size: 4, LocalSize: 2, StartRank: 2}, ""},
		{Topology{Size: 0, LocalSize: 1}, "--data-parallel-size must be at least 1"},
		{Topology{Size: 2, LocalSize: 0}, "--data-parallel-size-local must be at least 1"},
		{Topology{Size: 2, LocalSize: 3}, "cannot exceed --data-parallel-size (2)"},
		{Topology{Size: 2, LocalSize: 1, StartRank: -1}, "--data-parallel-start-rank must be at least 0"},
		{Topology{Size: 4, LocalSize: 2, StartRank: 3}, "would host ranks 3 to 4, but ranks end at 3"},
	}
	for _, tc := range cases {
		err := tc.topo.Validate()
		if tc.want == "" {
			if err != nil {
				t.Errorf("%+v: %v", tc.topo, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: error %v, want one containing %q", tc.topo, err, tc.want)
		}
	}
}

func TestTopologyRanks(t *testing.T) {
	topo := Topology{Size: 8, LocalSize: 3, StartRank: 4}
	if got := topo.LocalRanks(); !slices.Equal(got, []int{4, 5, 6}) {
		t.Fatalf("LocalRanks = %v", got)
	}
	for rank, want := range map[int]bool{3: false, 4: true, 6: true, 7: false} {
		if topo.Hosts(rank) != want {
			t.Errorf("Hosts(%d) = %v", rank, !want)
		}
	}
}
