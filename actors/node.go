package actors

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/dpnode/dpnode/dp"
	"github.com/dpnode/dpnode/engine"
	"github.com/dpnode/dpnode/gpu"
)

// NodeConfig is everything a node runs with.
type NodeConfig struct {
	// Model is the served model name requests must name.
	Model    string
	Topology dp.Topology
	// Devices are the GPUs of the local ranks, one each, in rank order.
	Devices   []gpu.Device
	Scheduler engine.SchedulerConfig
	// NewExecutor builds a local rank's executor; it is called again each
	// time the rank's engine restarts.
	NewExecutor func(rank int, dev gpu.Device) (engine.Executor, error)
	// Policy picks ranks; nil means dp.LiveLoad.
	Policy        dp.Policy
	Restart       RestartPolicy
	ParkTimeout   time.Duration
	MaxMigrations int
	Publish       dp.PublishConfig
	// StartTimeout bounds how long StartNode waits for the engines.
	StartTimeout time.Duration
	// Registry receives the node's metrics.
	Registry prometheus.Registerer
	Logger   *slog.Logger
}

// DefaultNodeConfig fills everything but the model, topology, devices and
// executor.
func DefaultNodeConfig() NodeConfig {
	return NodeConfig{
		Scheduler: engine.DefaultSchedulerConfig(),
		Restart:   DefaultRestartPolicy(),
		// Long enough to ride out a few restarts with backoff; shorter
		// than a client's usual timeout, so the client hears why.
		ParkTimeout:   30 * time.Second,
		MaxMigrations: 3,
		Publish:       dp.DefaultPublishConfig(),
		StartTimeout:  time.Minute,
		Logger:        slog.Default(),
	}
}

func (c *NodeConfig) validate() error {
	if err := c.Topology.Validate(); err != nil {
		return err
	}
	switch {
	case c.Model == "":
		return errors.New("actors: the node needs a model name")
	case len(c.Devices) != c.Topology.LocalSize:
		return fmt.Errorf("actors: %d local ranks but %d devices", c.Topology.LocalSize, len(c.Devices))
	case c.NewExecutor == nil:
		return errors.New("actors: the node needs an executor factory")
	case c.Registry == nil:
		return errors.New("actors: the node needs a metrics registry")
	}
	if c.Policy == nil {
		c.Policy = &dp.LiveLoad{}
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c.Scheduler.Validate()
}

// Node is a running node: its actor system and the PIDs the HTTP server
// talks to.
type Node struct {
	cfg         NodeConfig
	system      *actor.ActorSystem
	root        *actor.PID
	apiServer   *actor.PID
	coordinator *actor.PID
	// failed is closed when the node can no longer serve: an actor it
	// cannot do without was stopped for good by its supervisor.
	failed   chan struct{}
	failOnce sync.Once
	failErr  error
}

// StartNode starts a node's actors and returns once they run.
func StartNode(cfg NodeConfig) (*Node, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	system := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger {
		// protoactor logs every dead letter and lifecycle step at Info;
		// only its warnings concern an operator.
		return slog.New(minLevel{cfg.Logger.Handler(), slog.LevelWarn}).With("component", "protoactor")
	}))
	metrics := NewMetrics(cfg.Registry, cfg.Model)
	n := &Node{cfg: cfg, system: system, failed: make(chan struct{})}
	props := actor.PropsFromProducer(func() actor.Actor { return &nodeActor{cfg: cfg, metrics: metrics, fail: n.fail} },
		actor.WithSupervisor(actor.NewOneForOneStrategy(10, time.Minute, actor.DefaultDecider)))
	pid, err := system.Root.SpawnNamed(props, "node")
	if err != nil {
		return nil, fmt.Errorf("actors: starting the node actor: %w", err)
	}
	res, err := system.Root.RequestFuture(pid, &getChildren{}, 10*time.Second).Result()
	if err != nil {
		return nil, fmt.Errorf("actors: the node actor did not start: %w", err)
	}
	ch := res.(*children)
	n.root, n.apiServer, n.coordinator = pid, ch.apiServer, ch.coordinator
	// Serving before every engine is up would send the first burst to
	// whichever rank started first.
	if _, err := system.Root.RequestFuture(n.apiServer, &awaitReady{}, cfg.StartTimeout).Result(); err != nil {
		n.Stop()
		return nil, fmt.Errorf("actors: the engines did not start within %v: %w", cfg.StartTimeout, err)
	}
	return n, nil
}

// Model is the served model name.
func (n *Node) Model() string { return n.cfg.Model }

// Topology is the node's place in the deployment.
func (n *Node) Topology() dp.Topology { return n.cfg.Topology }

// Submit hands a request to the API server; its events arrive on
// s.Stream.
func (n *Node) Submit(s *Submission) {
	select {
	case <-n.failed:
		s.Stream.push(Event{Index: s.Index, Finish: engine.FinishedError, Err: n.failErr})
	default:
		n.system.Root.Send(n.apiServer, s)
	}
}

// Abort cancels a request; reason is FinishedStop when a stop string
// matched, FinishedAbort otherwise.
func (n *Node) Abort(id string, reason engine.FinishReason) {
	n.system.Root.Send(n.apiServer, &Abort{ID: id, Reason: reason})
}

// Failed is closed when the node can no longer serve; Err says why.
func (n *Node) Failed() <-chan struct{} { return n.failed }

// Err is why the node failed, once Failed is closed.
func (n *Node) Err() error {
	select {
	case <-n.failed:
		return n.failErr
	default:
		return nil
	}
}

func (n *Node) fail(err error) {
	n.failOnce.Do(func() {
		n.failErr = err
		close(n.failed)
	})
}

// View returns the API server's view of its ranks.
func (n *Node) View(ctx context.Context) (*APIServerView, error) {
	timeout := 5 * time.Second
	if d, ok := ctx.Deadline(); ok {
		timeout = time.Until(d)
	}
	res, err := n.system.Root.RequestFuture(n.apiServer, &getView{}, timeout).Result()
	if err != nil {
		return nil, fmt.Errorf("actors: the API server did not answer: %w", err)
	}
	return res.(*APIServerView), nil
}

// Stop stops every actor of the node and waits for them.
func (n *Node) Stop() {
	_ = n.system.Root.StopFuture(n.root).Wait()
	n.system.Shutdown()
}

// System is the node's actor system, for tests that inject faults.
func (n *Node) System() *actor.ActorSystem { return n.system }

// APIServer is the API server actor's PID.
func (n *Node) APIServer() *actor.PID { return n.apiServer }

type getChildren struct{}

type children struct {
	apiServer, coordinator *actor.PID
}

// nodeActor is the root of a node: it starts the coordinator and the API
// server and restarts them if they crash.
type nodeActor struct {
	cfg      NodeConfig
	metrics  *Metrics
	children children
	// fail reports that the node cannot serve any more.
	fail     func(error)
	stopping bool
}

func (n *nodeActor) Receive(ctx actor.Context) {
	switch msg := ctx.Message().(type) {
	case *actor.Started:
		n.start(ctx)
	case *actor.Stopping:
		n.stopping = true
	case *actor.Terminated:
		// A child stops only with the node, or when its supervisor gives
		// up on it after repeated crashes; then the node is broken, and
		// saying so (the process exits) beats serving nothing.
		if !n.stopping {
			n.cfg.Logger.Error("an actor the node needs crashed too often and was stopped", "actor", msg.Who.Id)
			n.fail(fmt.Errorf("%w (%s crashed too often)", ErrAPIServerGone, msg.Who.Id))
		}
	case *getChildren:
		ctx.Respond(&n.children)
	}
}

func (n *nodeActor) start(ctx actor.Context) {
	cfg := n.cfg
	coord, err := ctx.SpawnNamed(actor.PropsFromProducer(NewCoordinatorProducer(CoordinatorConfig{
		Epoch:   1,
		Publish: cfg.Publish,
		Metrics: n.metrics,
		Logger:  cfg.Logger,
	})), "coordinator")
	if err != nil {
		panic(fmt.Errorf("actors: spawning the coordinator: %w", err))
	}
	engines := make([]EngineConfig, cfg.Topology.LocalSize)
	for i := range engines {
		rank, dev := cfg.Topology.StartRank+i, cfg.Devices[i]
		engines[i] = EngineConfig{
			Rank:        rank,
			Device:      fmt.Sprintf("%d:%s (%s)", dev.Index, dev.UUID, dev.Name),
			Scheduler:   cfg.Scheduler,
			NewExecutor: func() (engine.Executor, error) { return cfg.NewExecutor(rank, dev) },
			Coordinator: coord,
			Logger:      cfg.Logger.With("rank", rank),
		}
	}
	api, err := ctx.SpawnNamed(actor.PropsFromProducer(NewAPIServerProducer(APIServerConfig{
		Engines:       engines,
		Coordinator:   coord,
		Policy:        cfg.Policy,
		Restart:       cfg.Restart,
		ParkTimeout:   cfg.ParkTimeout,
		MaxMigrations: cfg.MaxMigrations,
		Metrics:       n.metrics,
		Logger:        cfg.Logger,
	})), "api-server")
	if err != nil {
		panic(fmt.Errorf("actors: spawning the API server: %w", err))
	}
	n.children = children{apiServer: api, coordinator: coord}
}

// minLevel drops records below a level.
type minLevel struct {
	slog.Handler
	level slog.Level
}

func (h minLevel) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= h.level && h.Handler.Enabled(ctx, l)
}

func (h minLevel) WithAttrs(attrs []slog.Attr) slog.Handler {
	return minLevel{h.Handler.WithAttrs(attrs), h.level}
}

func (h minLevel) WithGroup(name string) slog.Handler {
	return minLevel{h.Handler.WithGroup(name), h.level}
}
