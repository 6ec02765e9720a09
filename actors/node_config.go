package actors

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/asynkron/protoactor-go/remote"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/dpnode/dpnode/control"
	"github.com/dpnode/dpnode/dp"
	"github.com/dpnode/dpnode/engine"
	"github.com/dpnode/dpnode/gpu"
	dpnodev1 "github.com/dpnode/dpnode/proto/dpnode/v1"
)

// NodeConfig is everything a node runs with.
type NodeConfig struct {
	// Name is unique per process incarnation.
	Name string
	// Model is the served model name requests must name.
	Model    string
	Topology dp.Topology
	// Devices are the GPUs of the local ranks, one each, in rank order.
	Devices []gpu.Device
	// RankReady, when set, hears of each local rank's engine that has
	// started (again, after a restart); it must not block.
	RankReady func(rank int)
	Scheduler engine.SchedulerConfig
	// NewCore opens a local rank's engine; it is called again each time
	// the rank's engine restarts, off the engine's mailbox, and must
	// return when ctx is done.
	NewCore func(ctx context.Context, rank int, dev gpu.Device) (engine.Core, error)
	// Policy picks ranks; nil means dp.LiveLoad.
	Policy      dp.Policy
	Restart     RestartPolicy
	ParkTimeout time.Duration
	// Migration moves requests with output off a lost engine (see
	// APIServerConfig.Migration); MaxMigrations bounds it.
	Migration     bool
	MaxMigrations int
	Publish       dp.PublishConfig
	// StartTimeout bounds how long StartNode waits for the engines.
	StartTimeout time.Duration
	// Remote, when set, serves the node's actors to other nodes; nil keeps
	// them in the process (a node that will never have peers).
	Remote *remote.Config
	// HTTPAddress is gossiped for views; empty for a headless node.
	HTTPAddress string
	// ExpertParallel makes the ranks step in lockstep waves
	// (--enable-expert-parallel, a MoE model).
	ExpertParallel bool
	// Engine and Profile say what the ranks run, for other nodes to check
	// that they run the same (dpnodev1.NodeMeta).
	Engine, Profile string
	// CollectiveTimeout bounds a step's wait for the other ranks' reports
	// before the group re-forms without the late ones; vLLM waits for
	// NCCL's timeout, minutes, with the whole group stuck.
	CollectiveTimeout time.Duration
	// Roster is which node holds which ranks when the node starts:
	// control.Roster{Fixed: size} for a fixed size and no assigned ranks.
	Roster control.Roster
	// PublishRoster spreads a roster this node's coordinator decided, and
	// RefuseClaim tells a node why it gets no ranks; nil on a node with
	// no peers.
	PublishRoster func(r control.Roster, claimant string)
	RefuseClaim   func(node string, err error)
	// Key is this node's identity in the roster (its --node-id, or else
	// its gossip address); empty for a node that holds no ranks there.
	Key string
	// NodeID is the --node-id this node gossips; empty when its gossip
	// address is its identity.
	NodeID string
	// Experts is the model's expert count under expert parallelism: an
	// elastic deployment's size must divide it. 0 when not checked.
	Experts int
	// AwaitMembership holds the coordinator election until
	// MembershipReady: a node that has not yet heard of the cluster it
	// joins would elect itself. Off for a node that has no peers.
	AwaitMembership bool
	// Registry receives the node's metrics.
	Registry prometheus.Registerer
	Logger   *slog.Logger
}

// DefaultNodeConfig fills everything but the model, topology, devices and
// executor.
func DefaultNodeConfig() NodeConfig {
	return NodeConfig{
		Name:      "local",
		Scheduler: engine.DefaultSchedulerConfig(),
		Restart:   DefaultRestartPolicy(),
		// Long enough to ride out a few restarts with backoff; shorter
		// than a client's usual timeout, so the client hears why.
		ParkTimeout:   30 * time.Second,
		Migration:     true,
		MaxMigrations: 3,
		Publish:       dp.DefaultPublishConfig(),
		StartTimeout:  time.Minute,
		// Far above a step (tens of ms on GPUs), far below a client's
		// patience.
		CollectiveTimeout: 5 * time.Second,
		Logger:            slog.Default(),
	}
}

func (c *NodeConfig) validate() error {
	if err := c.Topology.Validate(); err != nil {
		return err
	}
	switch {
	case c.Model == "":
		return errors.New("actors: the node needs a model name")
	case c.Name == "":
		return errors.New("actors: the node needs a name")
	case len(c.Devices) != c.Topology.LocalSize:
		return fmt.Errorf("actors: %d local ranks but %d devices", c.Topology.LocalSize, len(c.Devices))
	case c.NewCore == nil && c.Topology.LocalSize > 0:
		return errors.New("actors: the node needs an engine factory")
	case c.Registry == nil:
		return errors.New("actors: the node needs a metrics registry")
	}
	if c.Policy == nil {
		c.Policy = dp.NewLiveLoad(c.Scheduler.MaxNumBatchedTokens)
	}
	if c.Roster.Elastic() && c.Roster.Version == 0 && !c.Topology.Elastic {
		// No roster given: the topology's fixed size.
		c.Roster = control.Roster{Fixed: c.Topology.Size}
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c.Scheduler.Validate()
}

// PendingMeta is what the node gossips before its actors run: what it
// serves and how, without ranks or addresses. A node whose ranks are
// given out at the join joins so, and gossips its whole metadata once its
// actors run.
func (c *NodeConfig) PendingMeta() *dpnodev1.NodeMeta {
	topo := c.Topology
	size := uint32(topo.Size)
	if topo.Elastic {
		size = 0
	}
	return &dpnodev1.NodeMeta{
		DataParallelSize: size,
		BootUnixNano:     time.Now().UnixNano(),
		Mode:             topo.Mode.String(),
		Headless:         topo.Headless,
		Model:            c.Model,
		ExpertParallel:   c.ExpertParallel,
		Engine:           c.Engine,
		Profile:          c.Profile,
		NodeId:           c.NodeID,
	}
}
