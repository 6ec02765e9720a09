package dp

import (
	"fmt"
	"strings"
)

// MaxRanks bounds the rank numbers of an elastic deployment, whose size
// has no fixed end: a peer that claimed rank four billion must not make a
// node loop or allocate over them.
const MaxRanks = 4096

// Mode says who balances requests over the ranks.
type Mode int

const (
	// Hybrid: each node's API server balances over its own ranks; requests
	// never cross the network. The default, and a single node is the case
	// where the node hosts every rank.
	Hybrid Mode = iota
	// Internal: API servers balance over every rank of the cluster; nodes
	// without an API server run --headless.
	Internal
	// External: one API server per rank, with a balancer outside dpnode.
	External
)

var modeNames = []string{"hybrid", "internal", "external"}

func (m Mode) String() string {
	if int(m) < len(modeNames) {
		return modeNames[m]
	}
	return fmt.Sprintf("Mode(%d)", int(m))
}

// ParseMode reads a --data-parallel-lb value.
func ParseMode(s string) (Mode, error) {
	for i, n := range modeNames {
		if strings.EqualFold(s, n) {
			return Mode(i), nil
		}
	}
	return 0, fmt.Errorf("dp: --data-parallel-lb must be one of %s, got %q", strings.Join(modeNames, ", "), s)
}

// Topology is a node's place in a data-parallel deployment.
type Topology struct {
	Mode Mode
	// Size is the number of ranks in the deployment (--data-parallel-size).
	Size int
	// LocalSize is the number of ranks this node hosts
	// (--data-parallel-size-local); 0 only for an internal-mode node that
	// serves the API over other nodes' ranks.
	LocalSize int
	// StartRank is the first rank this node hosts
	// (--data-parallel-start-rank); the node hosts StartRank up to
	// StartRank+LocalSize-1.
	StartRank int
	// Headless nodes host ranks and serve no API (internal mode only).
	Headless bool
	// Elastic: the deployment's size follows the cluster's roster
	// (--data-parallel-size auto); Size is then MaxRanks, the bound of
	// rank numbers.
	Elastic bool
	// AutoStart: the coordinator gives the node its ranks when it joins
	// (--data-parallel-start-rank auto); StartRank is 0 until then.
	AutoStart bool
}

// Auto is the value of a rank or size flag given as "auto".
const Auto = -2

// Validate rejects a topology that names impossible ranks or a mode it
// cannot work in, with a message that names the flags to change.
func (t Topology) Validate() error {
	switch {
	case t.Size < 1:
		return fmt.Errorf("dp: --data-parallel-size must be at least 1, got %d", t.Size)
	case t.LocalSize < 0:
		return fmt.Errorf("dp: --data-parallel-size-local must not be negative, got %d", t.LocalSize)
	case t.LocalSize == 0 && (t.Mode != Internal || t.Headless):
		return fmt.Errorf("dp: --data-parallel-size-local must be at least 1; only an API server in internal mode (--data-parallel-lb internal) may host no ranks")
	case t.LocalSize > t.Size:
		return fmt.Errorf("dp: --data-parallel-size-local (%d) cannot exceed --data-parallel-size (%d)", t.LocalSize, t.Size)
	case t.StartRank < 0:
		return fmt.Errorf("dp: --data-parallel-start-rank must be at least 0, got %d", t.StartRank)
	case t.StartRank+t.LocalSize > t.Size:
		return fmt.Errorf("dp: --data-parallel-start-rank (%d) plus --data-parallel-size-local (%d) exceeds --data-parallel-size (%d): this node would host ranks %d to %d, but ranks end at %d",
			t.StartRank, t.LocalSize, t.Size, t.StartRank, t.StartRank+t.LocalSize-1, t.Size-1)
	case t.Mode == External && t.LocalSize != 1:
		return fmt.Errorf("dp: external load balancing runs one rank per API server: --data-parallel-size-local must be 1, got %d", t.LocalSize)
	case t.Headless && t.Mode != Internal:
		return fmt.Errorf("dp: --headless is only for internal load balancing: a headless node has no API server, so %s balancing cannot use it", t.Mode)
	}
	return nil
}

// LocalRanks lists the ranks this node hosts.
func (t Topology) LocalRanks() []int {
	r := make([]int, t.LocalSize)
	for i := range r {
		r[i] = t.StartRank + i
	}
	return r
}

// Hosts reports whether this node hosts rank.
func (t Topology) Hosts(rank int) bool {
	return rank >= t.StartRank && rank < t.StartRank+t.LocalSize
}

// ServesAPI reports whether the node runs an API server.
func (t Topology) ServesAPI() bool { return !t.Headless }

// BalancesRemote reports whether the node's API server sends requests to
// other nodes' ranks.
func (t Topology) BalancesRemote() bool { return t.Mode == Internal && !t.Headless }

// Flags are the command-line flags that decide a node's topology. Each
// int is -1 when not given, so that a rule can tell "0" from "unset", and
// Auto when given as "auto".
type Flags struct {
	Size, LocalSize, StartRank int
	// Rank is --data-parallel-rank (external mode's one rank).
	Rank int
	// LB is --data-parallel-lb; empty when not given.
	LB         string
	HybridLB   bool // --data-parallel-hybrid-lb
	Headless   bool // --headless
	ExternalLB bool // --data-parallel-external-lb
	// PortSet is true when --port was given.
	PortSet bool
}

// UnsetFlags has nothing given.
func UnsetFlags() Flags {
	return Flags{Size: -1, LocalSize: -1, StartRank: -1, Rank: -1}
}

// resolveMode is the load-balancing mode the flags select, or why they
// contradict each other.
func resolveMode(f Flags) (Mode, error) {
	mode := Hybrid
	if f.LB != "" {
		m, err := ParseMode(f.LB)
		if err != nil {
			return 0, err
		}
		mode = m
	}
	external := f.ExternalLB || f.Rank >= 0 || f.Rank == Auto
	switch {
	case f.HybridLB && f.LB != "" && mode != Hybrid:
		return 0, fmt.Errorf("dp: --data-parallel-hybrid-lb contradicts --data-parallel-lb %s", f.LB)
	case f.HybridLB && external:
		return 0, fmt.Errorf("dp: --data-parallel-hybrid-lb and external load balancing (--data-parallel-rank or --data-parallel-external-lb) cannot both be set")
	case external && f.LB != "" && mode != External:
		return 0, fmt.Errorf("dp: --data-parallel-rank and --data-parallel-external-lb select external load balancing, which contradicts --data-parallel-lb %s", f.LB)
	case f.Headless && (f.HybridLB || (f.LB != "" && mode == Hybrid)):
		return 0, fmt.Errorf("dp: hybrid load balancing is not applicable with --headless: a headless node has no API server")
	case f.Headless && external:
		return 0, fmt.Errorf("dp: --headless contradicts external load balancing (--data-parallel-rank): a headless node has no API server")
	case f.Headless && f.PortSet:
		return 0, fmt.Errorf("dp: --headless serves no API, so --port cannot be set with it")
	}
	if external {
		mode = External
	}
	if f.Headless {
		mode = Internal
	}
	return mode, nil
}

// Resolve turns flags into a topology, with one clear error for a
// contradictory combination. localGPUs is the number of GPUs on the node:
// with no sizes given, the node hosts one rank per GPU.
//
// Unlike vLLM, one set of flags means the same everywhere: hybrid is the
// default whatever the sizes, and a single node is hybrid with every rank
// local (vLLM silently switches that case to internal).
func Resolve(f Flags, localGPUs int) (Topology, error) {
	mode, err := resolveMode(f)
	if err != nil {
		return Topology{}, err
	}
	switch {
	case f.LocalSize == Auto:
		return Topology{}, fmt.Errorf("dp: --data-parallel-size-local takes a number, not auto (leave it out for one rank per GPU)")
	case f.Rank >= 0 && f.StartRank == Auto:
		return Topology{}, fmt.Errorf("dp: --data-parallel-start-rank auto contradicts --data-parallel-rank %d", f.Rank)
	case mode == External && f.LocalSize > 1:
		return Topology{}, fmt.Errorf("dp: --data-parallel-rank runs one rank per API server: --data-parallel-size-local must be 1 or unset, got %d", f.LocalSize)
	case f.Rank == Auto || f.StartRank == Auto || f.Size == Auto:
		if f.Size == Auto && f.StartRank >= 0 && f.LocalSize < 0 && mode != External {
			return Topology{}, fmt.Errorf("dp: with --data-parallel-size auto, --data-parallel-start-rank needs --data-parallel-size-local")
		}
		local := f.LocalSize
		if local < 0 {
			local = localGPUs
		}
		t := Topology{Mode: mode, Headless: f.Headless, Size: f.Size, LocalSize: local, StartRank: max(f.StartRank, 0),
			Elastic: f.Size == Auto, AutoStart: f.StartRank < 0}
		if mode == External {
			// One rank per API server: a number, or one given out.
			t.StartRank, t.LocalSize, t.AutoStart = max(f.Rank, 0), 1, f.Rank == Auto
		}
		if t.Elastic {
			t.Size = MaxRanks
		} else if t.Size < 0 {
			return Topology{}, fmt.Errorf("dp: ranks given out (auto) need the deployment's size: --data-parallel-size N, or auto to follow the cluster")
		}
		return t, t.Validate()
	}
	t := Topology{Mode: mode, Headless: f.Headless, Size: f.Size, LocalSize: f.LocalSize, StartRank: max(f.StartRank, 0)}
	if mode == External {
		switch {
		case f.Rank < 0:
			return Topology{}, fmt.Errorf("dp: external load balancing needs the node's rank: set --data-parallel-rank")
		case f.LocalSize > 1:
			return Topology{}, fmt.Errorf("dp: --data-parallel-rank runs one rank per API server: --data-parallel-size-local must be 1 or unset, got %d", f.LocalSize)
		case f.StartRank >= 0 && f.StartRank != f.Rank:
			return Topology{}, fmt.Errorf("dp: --data-parallel-start-rank (%d) contradicts --data-parallel-rank (%d)", f.StartRank, f.Rank)
		}
		t.StartRank, t.LocalSize = f.Rank, 1
	}
	switch {
	case t.Size < 0 && t.LocalSize < 0:
		t.LocalSize = localGPUs
		t.Size = t.StartRank + localGPUs
	case t.Size < 0:
		t.Size = t.StartRank + t.LocalSize
	case t.LocalSize < 0:
		t.LocalSize = t.Size - t.StartRank
	}
	if mode == External && t.Size <= t.StartRank {
		return Topology{}, fmt.Errorf("dp: --data-parallel-rank (%d) must be below --data-parallel-size (%d)", f.Rank, t.Size)
	}
	return t, t.Validate()
}
