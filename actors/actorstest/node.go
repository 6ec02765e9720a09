// Package actorstest starts in-process nodes of simulated engines, for
// the tests of the packages that build on the actors.
package actorstest

import (
	"context"
	"fmt"
	"log/slog"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	dpnode "github.com/dpnode/dpnode"
	"github.com/dpnode/dpnode/actors"
	"github.com/dpnode/dpnode/dp"
	"github.com/dpnode/dpnode/engine"
	"github.com/dpnode/dpnode/engine/sim"
	"github.com/dpnode/dpnode/gpu"
)

// Config is the node to start.
type Config struct {
	// Name is the node's name ("local" when empty); Model the served
	// model's ("test-model").
	Name, Model string
	Topology    dp.Topology
	// MaxModelLen is the engines' context length (the profile's when 0).
	MaxModelLen int
}

// StartSimNode starts a node whose local ranks run the simulated 8B
// profile at no cost per step, with no transport, metrics of its own and
// no logs. The caller stops it.
func StartSimNode(t testing.TB, c Config) (*actors.Node, *sim.Tokenizer) {
	t.Helper()
	profile, err := sim.LoadProfile(dpnode.SimProfiles, "llama-3.1-8b-h100")
	if err != nil {
		t.Fatal(err)
	}
	tok := sim.NewTokenizer(0)
	cfg := actors.DefaultNodeConfig()
	if c.Name != "" {
		cfg.Name = c.Name
	}
	cfg.Model = c.Model
	if cfg.Model == "" {
		cfg.Model = "test-model"
	}
	cfg.Topology = c.Topology
	for i := range c.Topology.LocalSize {
		cfg.Devices = append(cfg.Devices, gpu.Device{Index: i, UUID: fmt.Sprint("GPU-test-", i), Name: "test-gpu", Virtual: true})
	}
	cfg.Scheduler = profile.SchedulerConfig()
	if c.MaxModelLen > 0 {
		cfg.Scheduler.MaxModelLen = c.MaxModelLen
	}
	cfg.Registry = prometheus.NewRegistry()
	cfg.Logger = slog.New(slog.DiscardHandler)
	cfg.NewCore = func(context.Context, int, gpu.Device) (engine.Core, error) {
		return sim.NewCore(cfg.Scheduler, sim.ExecutorConfig{Profile: profile, Tokenizer: tok, Clock: engine.RealClock{}})
	}
	n, err := actors.StartNode(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return n, tok
}
