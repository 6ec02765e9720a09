package cluster

import (
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

// Options are a node's settings, as given on the command line. A zero
// value means "use the default", which for sizes comes from the GPUs found
// and the simulated profile.
type Options struct {
	Host string
	// Port is the HTTP port; 0 picks a free one (tests).
	Port int

	DataParallelSize      int
	DataParallelSizeLocal int
	DataParallelStartRank int

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
		Host:         "0.0.0.0",
		Port:         8000,
		Engine:       "sim",
		SimProfile:   "llama-3.1-8b-h100",
		SimTimeScale: 1,
		GPUs:         2,
		DrainTimeout: 30 * time.Second,
	}
}

// errFlags prefixes every error about the command line.
var errFlags = errors.New("invalid flags")

func flagError(format string, args ...any) error {
	return fmt.Errorf("%w: %s", errFlags, fmt.Sprintf(format, args...))
}

// plan is a checked Options, with defaults resolved except the ones that
// need the GPUs.
type plan struct {
	opts      Options
	profile   *sim.Profile
	scheduler engine.SchedulerConfig
	model     string
	served    string
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
	case o.Host != "" && net.ParseIP(o.Host) == nil && o.Host != "localhost":
		return nil, flagError("--host must be an IP address or localhost, got %q", o.Host)
	case o.GPUs < 1:
		return nil, flagError("--gpus must be at least 1, got %d", o.GPUs)
	case o.DataParallelSize < 0, o.DataParallelSizeLocal < 0, o.DataParallelStartRank < 0:
		return nil, flagError("--data-parallel-size, --data-parallel-size-local and --data-parallel-start-rank must not be negative")
	case o.MaxNumSeqs < 0, o.MaxNumBatchedTokens < 0, o.MaxModelLen < 0:
		return nil, flagError("--max-num-seqs, --max-num-batched-tokens and --max-model-len must not be negative")
	case o.DrainTimeout < 0:
		return nil, flagError("--drain-timeout must not be negative, got %v", o.DrainTimeout)
	}
	if o.DataParallelSize > 0 {
		// The GPU count is not known yet; check what the flags alone say.
		topo := dp.Topology{Size: o.DataParallelSize, LocalSize: max(o.DataParallelSizeLocal, 1), StartRank: o.DataParallelStartRank}
		if o.DataParallelSizeLocal == 0 {
			topo.LocalSize = o.DataParallelSize - o.DataParallelStartRank
		}
		if err := topo.Validate(); err != nil {
			return nil, fmt.Errorf("%w: %w", errFlags, err)
		}
	}
	profile, err := sim.LoadProfile(o.Profiles, o.SimProfile)
	if err != nil {
		return nil, fmt.Errorf("%w: --sim-profile: %w", errFlags, err)
	}
	p := &plan{opts: o, profile: profile, model: o.Model, served: o.ServedModelName}
	if p.model == "" {
		p.model = profile.Model
	}
	if p.served == "" {
		p.served = p.model
	}
	p.scheduler = engine.SchedulerConfig{
		MaxNumSeqs:          orDefault(o.MaxNumSeqs, profile.MaxNumSeqs),
		MaxNumBatchedTokens: orDefault(o.MaxNumBatchedTokens, profile.MaxNumBatchedTokens),
		BlockSize:           profile.BlockSize,
		NumBlocks:           profile.KVCacheBlocks,
		MaxModelLen:         orDefault(o.MaxModelLen, profile.MaxModelLen),
		EnablePrefixCaching: !o.NoPrefixCaching,
		EOSTokenID:          sim.EOSToken,
	}
	if err := p.scheduler.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", errFlags, err)
	}
	return p, nil
}

// topology resolves the data-parallel sizes given the local GPU count:
// with no sizes, one rank per GPU; with only a total size, a single node
// hosts it all.
func (p *plan) topology(gpus int) (dp.Topology, error) {
	o := p.opts
	t := dp.Topology{Size: o.DataParallelSize, LocalSize: o.DataParallelSizeLocal, StartRank: o.DataParallelStartRank}
	switch {
	case t.Size == 0 && t.LocalSize == 0:
		t.LocalSize = gpus
		t.Size = t.StartRank + gpus
	case t.Size == 0:
		t.Size = t.StartRank + t.LocalSize
	case t.LocalSize == 0:
		t.LocalSize = t.Size - t.StartRank
	}
	if err := t.Validate(); err != nil {
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
