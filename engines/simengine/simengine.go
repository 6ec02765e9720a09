// Package simengine registers the calibrated simulated engine (--engine
// sim): dpnode's scheduler over the simulated executor of a GPU and model
// profile, with modelled step times and deterministic text.
package simengine

import (
	"context"
	"fmt"
	"io/fs"
	"math"

	"github.com/spf13/pflag"

	"github.com/dpnode/dpnode"
	"github.com/dpnode/dpnode/engine"
	"github.com/dpnode/dpnode/engine/registry"
	"github.com/dpnode/dpnode/engine/sim"
	"github.com/dpnode/dpnode/gpu"
	httpapi "github.com/dpnode/dpnode/http"
)

// Engine is the simulated engine.
var Engine = registry.Engine{
	Name:       "sim",
	Summary:    "the calibrated simulated executor",
	NewOptions: func() registry.Options { return DefaultOptions() },
}

// Options are the simulated engine's flags.
type Options struct {
	// Profile is a built-in profile's name or a profile file's path.
	Profile string
	// TimeScale multiplies the modelled step times; 0 runs steps at no
	// cost.
	TimeScale float64
	// Profiles holds the built-in profiles.
	Profiles fs.FS
}

// DefaultProfile is the profile a node simulates unless told.
const DefaultProfile = "llama-3.1-8b-h100"

// DefaultOptions are the simulated engine's defaults.
func DefaultOptions() *Options {
	return &Options{Profile: DefaultProfile, TimeScale: 1, Profiles: dpnode.SimProfiles}
}

func (o *Options) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.Profile, "sim-profile", o.Profile, "sim: simulated GPU+model profile: a built-in name or a path to a profile .json")
	fs.Float64Var(&o.TimeScale, "sim-time-scale", o.TimeScale, "sim: multiply simulated step times by this (0 runs steps at no cost)")
}

// Plan resolves the profile and the scheduler's flags against it.
func (o *Options) Plan(n registry.Node) (*registry.Plan, error) {
	switch {
	case o.TimeScale < 0 || math.IsNaN(o.TimeScale) || math.IsInf(o.TimeScale, 0):
		return nil, fmt.Errorf("--sim-time-scale must be a finite number at least 0, got %v", o.TimeScale)
	case n.ChatTemplate != "":
		return nil, fmt.Errorf("--chat-template is not used by --engine sim, which renders chats with Llama 3's template")
	}
	profile, err := sim.LoadProfile(o.Profiles, o.Profile)
	if err != nil {
		return nil, fmt.Errorf("--sim-profile: %w", err)
	}
	p := &registry.Plan{
		Served:       profile.Model,
		Profile:      profile.Name,
		Capabilities: sim.Capabilities(profile),
		Simulated:    true,
	}
	if n.Model != "" {
		p.Served = n.Model
	}
	if n.ExpertParallel {
		if profile.Kind != sim.KindMoE {
			return nil, fmt.Errorf("--enable-expert-parallel needs a mixture-of-experts model; the profile %s is %s (try --sim-profile qwen3-30b-a3b-h200)", profile.Name, profile.Kind)
		}
		// An elastic group is checked at each join, by the coordinator.
		if n.Size > 0 {
			if err := profile.CheckExpertParallel(n.Size); err != nil {
				return nil, fmt.Errorf("--enable-expert-parallel: %w", err)
			}
		}
		p.Experts = profile.MoE.NumExperts
	}
	sc := profile.SchedulerConfig()
	sc.MaxNumSeqs = orDefault(n.MaxNumSeqs, profile.MaxNumSeqs)
	sc.MaxNumBatchedTokens = orDefault(n.MaxNumBatchedTokens, profile.MaxNumBatchedTokens)
	sc.MaxModelLen = orDefault(n.MaxModelLen, profile.MaxModelLen)
	sc.EnablePrefixCaching = n.PrefixCaching
	if err := sc.Validate(); err != nil {
		return nil, err
	}
	p.Scheduler = sc
	scale := o.TimeScale
	p.Open = func(context.Context, registry.Start) (*registry.Opened, error) {
		tok := sim.NewTokenizer(0)
		return &registry.Opened{
			Tokenizer: tok,
			Template:  httpapi.Llama3Template{},
			Describe:  []any{"sim_profile", profile.Name, "sim_time_scale", scale},
			NewCore: func(context.Context, int, gpu.Device) (engine.Core, error) {
				return sim.NewCore(sc, sim.ExecutorConfig{Profile: profile, Tokenizer: tok, Clock: engine.RealClock{}, TimeScale: scale})
			},
		}, nil
	}
	return p, nil
}

func orDefault(v, d int) int {
	if v > 0 {
		return v
	}
	return d
}

// Of returns the simulated engine's options among a node's (node.Options'
// Engines).
func Of(all map[string]registry.Options) *Options { return all[Engine.Name].(*Options) }
