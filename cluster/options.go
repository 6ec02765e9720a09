package cluster

import (
	"encoding/base64"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"math"
	"net"
	"strconv"
	"time"

	"github.com/dpnode/dpnode/dp"
	"github.com/dpnode/dpnode/engine"
	"github.com/dpnode/dpnode/engine/sim"
)

// Options are a node's settings, as given on the command line. For the
// data-parallel sizes, -1 means "not given" (see dp.Flags); other zero
// values mean "use the default".
type Options struct {
	Host string
	// Port is the HTTP port; 0 picks a free one (tests).
	Port int
	// MetricsPort, when not -1, also serves /metrics, /health and
	// /v1/cluster on that port: what a headless node, which has no API
	// port, offers its operators.
	MetricsPort int
	// PortSet is true when --port was given explicitly.
	PortSet bool

	DataParallelSize      int
	DataParallelSizeLocal int
	DataParallelStartRank int
	// DataParallelRank selects external load balancing for one rank.
	DataParallelRank int
	LB               string
	HybridLB         bool
	ExternalLB       bool
	Headless         bool

	// Seeds are members to join; none starts a new cluster.
	Seeds []string
	// Bind is the gossip address (host:port); its host is also where the
	// actor transport listens.
	Bind string
	// Advertise is where other nodes reach this one (host[:port]).
	Advertise string
	// RPCPort is the actor transport's port (vLLM's
	// --data-parallel-rpc-port); 0 picks a free one.
	RPCPort int
	// GossipKey is the base64 gossip encryption key.
	GossipKey     string
	GossipProfile string
	TLS           TLSFiles

	// Model is the model to serve; ServedModelName the name clients use
	// (Model when empty).
	Model           string
	ServedModelName string
	// Engine selects the executor; "sim" is the only one so far.
	Engine       string
	SimProfile   string
	SimTimeScale float64
	// GPUs is the number of virtual GPUs when NVML is absent.
	GPUs int

	// BalancePolicy names the policy that picks a rank per request (see
	// dp.PolicyNames).
	BalancePolicy string

	// Migration moves requests mid-stream off a lost engine; MaxMigrations
	// bounds how often one request may move.
	Migration     bool
	MaxMigrations int
	// EngineMaxRestarts crashes within EngineRestartWindow stop a rank
	// for good.
	EngineMaxRestarts   int
	EngineRestartWindow time.Duration

	// ExpertParallel steps the ranks in lockstep waves (a MoE model);
	// CollectiveTimeout bounds a step's wait for the other ranks.
	ExpertParallel    bool
	CollectiveTimeout time.Duration

	APIKey              string
	MaxNumSeqs          int
	MaxNumBatchedTokens int
	MaxModelLen         int
	NoPrefixCaching     bool
	// DrainTimeout bounds how long a stopping node waits for requests in
	// flight.
	DrainTimeout time.Duration

	// Profiles holds the built-in simulated profiles.
	Profiles fs.FS
	Version  string
	Logger   *slog.Logger
}

// DefaultOptions are the defaults of `dpnode join`.
func DefaultOptions() Options {
	return Options{
		Host:                  "0.0.0.0",
		Port:                  8000,
		MetricsPort:           -1,
		DataParallelSize:      -1,
		DataParallelSizeLocal: -1,
		DataParallelStartRank: -1,
		DataParallelRank:      -1,
		Bind:                  "0.0.0.0:7946",
		RPCPort:               29550,
		GossipProfile:         "lan",
		Engine:                "sim",
		SimProfile:            "llama-3.1-8b-h100",
		SimTimeScale:          1,
		GPUs:                  2,
		CollectiveTimeout:     5 * time.Second,
		BalancePolicy:         dp.PolicyLive,
		Migration:             true,
		MaxMigrations:         3,
		EngineMaxRestarts:     5,
		EngineRestartWindow:   time.Minute,
		DrainTimeout:          30 * time.Second,
	}
}

// errFlags prefixes every error about the command line.
var errFlags = errors.New("invalid flags")

func flagError(format string, args ...any) error {
	return fmt.Errorf("%w: %s", errFlags, fmt.Sprintf(format, args...))
}

// IsFlagError reports whether err is about the command line.
func IsFlagError(err error) bool { return errors.Is(err, errFlags) }

// plan is a checked Options, with defaults resolved except the ones that
// need the GPUs.
type plan struct {
	opts      Options
	flags     dp.Flags
	profile   *sim.Profile
	scheduler engine.SchedulerConfig
	served    string
	gossipKey []byte
}

func (o Options) dpFlags() dp.Flags {
	return dp.Flags{
		Size: o.DataParallelSize, LocalSize: o.DataParallelSizeLocal, StartRank: o.DataParallelStartRank,
		Rank: o.DataParallelRank, LB: o.LB, HybridLB: o.HybridLB, Headless: o.Headless, ExternalLB: o.ExternalLB,
		PortSet: o.PortSet,
	}
}

// check rejects contradictory or impossible flags, all before anything
// starts, and resolves the defaults that do not depend on the GPUs.
func (o Options) check() (*plan, error) {
	switch {
	case o.Engine != "sim":
		return nil, flagError("--engine %q is not available; the engines are: sim", o.Engine)
	case o.SimTimeScale < 0 || math.IsNaN(o.SimTimeScale) || math.IsInf(o.SimTimeScale, 0):
		return nil, flagError("--sim-time-scale must be a finite number at least 0, got %v", o.SimTimeScale)
	case o.Port < 0 || o.Port > 65535:
		return nil, flagError("--port must be between 0 and 65535, got %d", o.Port)
	case o.MetricsPort < -1 || o.MetricsPort > 65535:
		return nil, flagError("--metrics-port must be between 0 and 65535, got %d", o.MetricsPort)
	case o.RPCPort < 0 || o.RPCPort > 65535:
		return nil, flagError("--data-parallel-rpc-port must be between 0 and 65535, got %d", o.RPCPort)
	case o.Host != "" && net.ParseIP(o.Host) == nil && o.Host != "localhost":
		return nil, flagError("--host must be an IP address or localhost, got %q", o.Host)
	case o.GPUs < 1:
		return nil, flagError("--gpus must be at least 1, got %d", o.GPUs)
	case o.MaxNumSeqs < 0, o.MaxNumBatchedTokens < 0, o.MaxModelLen < 0:
		return nil, flagError("--max-num-seqs, --max-num-batched-tokens and --max-model-len must not be negative")
	case o.MaxMigrations < 0 || o.EngineMaxRestarts < 0:
		return nil, flagError("--max-migrations and --engine-max-restarts must not be negative")
	case o.EngineRestartWindow <= 0:
		return nil, flagError("--engine-restart-window must be positive, got %v", o.EngineRestartWindow)
	case o.CollectiveTimeout <= 0:
		return nil, flagError("--ep-collective-timeout must be positive, got %v", o.CollectiveTimeout)
	case o.DrainTimeout < 0:
		return nil, flagError("--drain-timeout must not be negative, got %v", o.DrainTimeout)
	case o.Headless && o.APIKey != "":
		return nil, flagError("--headless serves no API, so --api-key has no effect there")
	case o.GossipProfile != "lan" && o.GossipProfile != "local":
		return nil, flagError("--gossip-profile must be lan or local, got %q", o.GossipProfile)
	}
	if _, _, err := splitHostPort(o.Bind, 7946); err != nil {
		return nil, flagError("--bind %q: %v", o.Bind, err)
	}
	if err := o.TLS.check(); err != nil {
		return nil, err
	}
	p := &plan{opts: o, flags: o.dpFlags()}
	if _, err := dp.NewPolicy(o.BalancePolicy, dp.PolicyConfig{}); err != nil {
		return nil, flagError("--balance-policy: %v", err)
	}
	if o.GossipKey != "" {
		key, err := base64.StdEncoding.DecodeString(o.GossipKey)
		if err != nil || (len(key) != 16 && len(key) != 24 && len(key) != 32) {
			return nil, flagError("--gossip-key must be 16, 24 or 32 bytes in base64 (for example: head -c 32 /dev/urandom | base64)")
		}
		p.gossipKey = key
	}
	// The GPU count is not known yet; every rule between flags can be
	// checked with any count that the flags themselves allow.
	if _, err := dp.Resolve(p.flags, max(o.GPUs, 1)); err != nil {
		return nil, fmt.Errorf("%w: %w", errFlags, err)
	}
	profile, err := sim.LoadProfile(o.Profiles, o.SimProfile)
	if err != nil {
		return nil, fmt.Errorf("%w: --sim-profile: %w", errFlags, err)
	}
	p.profile = profile
	if o.ExpertParallel {
		if profile.Kind != sim.KindMoE {
			return nil, flagError("--enable-expert-parallel needs a mixture-of-experts model; the profile %s is %s (try --sim-profile qwen3-30b-a3b-h200)", profile.Name, profile.Kind)
		}
		// The group is every rank of the deployment.
		size, _ := dp.Resolve(p.flags, max(o.GPUs, 1))
		if err := profile.CheckExpertParallel(size.Size); err != nil {
			return nil, fmt.Errorf("%w: --enable-expert-parallel: %w", errFlags, err)
		}
	}
	p.served = o.ServedModelName
	if p.served == "" {
		p.served = o.Model
	}
	if p.served == "" {
		p.served = profile.Model
	}
	p.scheduler = profile.SchedulerConfig()
	p.scheduler.MaxNumSeqs = orDefault(o.MaxNumSeqs, profile.MaxNumSeqs)
	p.scheduler.MaxNumBatchedTokens = orDefault(o.MaxNumBatchedTokens, profile.MaxNumBatchedTokens)
	p.scheduler.MaxModelLen = orDefault(o.MaxModelLen, profile.MaxModelLen)
	p.scheduler.EnablePrefixCaching = !o.NoPrefixCaching
	if err := p.scheduler.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", errFlags, err)
	}
	return p, nil
}

// topology resolves the data-parallel flags given the local GPU count:
// with no sizes, one rank per GPU.
func (p *plan) topology(gpus int) (dp.Topology, error) {
	t, err := dp.Resolve(p.flags, gpus)
	if err != nil {
		return t, fmt.Errorf("%w: %w", errFlags, err)
	}
	return t, nil
}

func (o Options) address() string {
	return net.JoinHostPort(o.Host, strconv.Itoa(o.Port))
}

func orDefault(v, d int) int {
	if v > 0 {
		return v
	}
	return d
}
