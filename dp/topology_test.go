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

func TestResolveModesAndFlagRules(t *testing.T) {
	flags := func(mutate func(*Flags)) Flags {
		f := UnsetFlags()
		mutate(&f)
		return f
	}
	ok := []struct {
		name string
		f    Flags
		gpus int
		want Topology
	}{
		{"defaults: one rank per GPU", UnsetFlags(), 2, Topology{Size: 2, LocalSize: 2}},
		{"hybrid, second node", flags(func(f *Flags) { f.Size, f.LocalSize, f.StartRank = 4, 2, 2 }), 2, Topology{Size: 4, LocalSize: 2, StartRank: 2}},
		{"hybrid spelt out, local = size", flags(func(f *Flags) { f.Size, f.LocalSize, f.HybridLB = 2, 2, true }), 2, Topology{Size: 2, LocalSize: 2}},
		{"internal head with no ranks", flags(func(f *Flags) { f.LB, f.Size, f.LocalSize = "internal", 4, 0 }), 2, Topology{Mode: Internal, Size: 4}},
		{"headless", flags(func(f *Flags) { f.Headless, f.Size, f.LocalSize, f.StartRank = true, 4, 2, 2 }), 2, Topology{Mode: Internal, Headless: true, Size: 4, LocalSize: 2, StartRank: 2}},
		{"external by rank", flags(func(f *Flags) { f.Size, f.Rank = 2, 1 }), 2, Topology{Mode: External, Size: 2, LocalSize: 1, StartRank: 1}},
		{"external spelt out", flags(func(f *Flags) { f.LB, f.Size, f.Rank, f.LocalSize = "external", 2, 0, 1 }), 2, Topology{Mode: External, Size: 2, LocalSize: 1}},
		{"elastic: ranks given out, one per GPU", flags(func(f *Flags) { f.Size = Auto }), 2, Topology{Size: MaxRanks, LocalSize: 2, Elastic: true, AutoStart: true}},
		{"elastic headless", flags(func(f *Flags) { f.Size, f.StartRank, f.LocalSize, f.Headless = Auto, Auto, 1, true }), 2,
			Topology{Mode: Internal, Headless: true, Size: MaxRanks, LocalSize: 1, Elastic: true, AutoStart: true}},
		{"elastic with fixed ranks", flags(func(f *Flags) { f.Size, f.StartRank, f.LocalSize = Auto, 4, 2 }), 2, Topology{Size: MaxRanks, LocalSize: 2, StartRank: 4, Elastic: true}},
		{"elastic internal API server", flags(func(f *Flags) { f.Size, f.LB, f.LocalSize = Auto, "internal", 0 }), 2, Topology{Mode: Internal, Size: MaxRanks, Elastic: true, AutoStart: true}},
		{"fixed size, ranks given out", flags(func(f *Flags) { f.Size, f.StartRank = 8, Auto }), 2, Topology{Size: 8, LocalSize: 2, AutoStart: true}},
		{"external, rank given out", flags(func(f *Flags) { f.Size, f.Rank = Auto, Auto }), 2, Topology{Mode: External, Size: MaxRanks, LocalSize: 1, Elastic: true, AutoStart: true}},
		{"external of a fixed size, rank given out", flags(func(f *Flags) { f.Size, f.Rank = 4, Auto }), 2, Topology{Mode: External, Size: 4, LocalSize: 1, AutoStart: true}},
		{"elastic external with a fixed rank", flags(func(f *Flags) { f.Size, f.Rank = Auto, 3 }), 2, Topology{Mode: External, Size: MaxRanks, LocalSize: 1, StartRank: 3, Elastic: true}},
	}
	for _, tc := range ok {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Resolve(tc.f, tc.gpus)
			if err != nil || got != tc.want {
				t.Fatalf("Resolve = %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
	bad := []struct {
		name string
		f    Flags
		want string
	}{
		{"headless with a port", flags(func(f *Flags) { f.Headless, f.PortSet, f.Size = true, true, 4 }), "--port cannot be set"},
		{"headless hybrid", flags(func(f *Flags) { f.Headless, f.HybridLB = true, true }), "not applicable with --headless"},
		{"headless external", flags(func(f *Flags) { f.Headless, f.Rank = true, 1 }), "--headless contradicts external"},
		{"hybrid and external", flags(func(f *Flags) { f.HybridLB, f.Rank = true, 0 }), "cannot both be set"},
		{"external with local size 2", flags(func(f *Flags) { f.Size, f.Rank, f.LocalSize = 4, 1, 2 }), "--data-parallel-size-local must be 1 or unset"},
		{"external without a rank", flags(func(f *Flags) { f.LB, f.Size = "external", 2 }), "set --data-parallel-rank"},
		{"rank past the size", flags(func(f *Flags) { f.Size, f.Rank = 2, 2 }), "must be below --data-parallel-size"},
		{"start plus local above size", flags(func(f *Flags) { f.Size, f.LocalSize, f.StartRank = 4, 2, 3 }), "would host ranks 3 to 4"},
		{"local above size", flags(func(f *Flags) { f.Size, f.LocalSize = 2, 3 }), "cannot exceed"},
		{"rankless hybrid", flags(func(f *Flags) { f.Size, f.LocalSize = 2, 0 }), "only an API server in internal mode"},
		{"unknown mode", flags(func(f *Flags) { f.LB = "random" }), "must be one of hybrid, internal, external"},
		{"lb contradicts rank", flags(func(f *Flags) { f.LB, f.Rank = "internal", 1 }), "contradicts --data-parallel-lb internal"},
		{"auto start without a size", flags(func(f *Flags) { f.StartRank = Auto }), "need the deployment's size"},
		{"auto rank without a size", flags(func(f *Flags) { f.Rank = Auto }), "need the deployment's size"},
		{"auto start and a rank", flags(func(f *Flags) { f.Size, f.Rank, f.StartRank = Auto, 1, Auto }), "contradicts --data-parallel-rank 1"},
		{"auto local size", flags(func(f *Flags) { f.LocalSize = Auto }), "takes a number, not auto"},
		{"elastic fixed start without local size", flags(func(f *Flags) { f.Size, f.StartRank = Auto, 2 }), "needs --data-parallel-size-local"},
		{"elastic headless with no ranks", flags(func(f *Flags) { f.Size, f.Headless, f.LocalSize = Auto, true, 0 }), "must be at least 1"},
	}
	for _, tc := range bad {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Resolve(tc.f, 2)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v; want one containing %q", err, tc.want)
			}
		})
	}
}
