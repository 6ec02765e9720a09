package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	mrand "math/rand/v2"
	"net"
	"os"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/asynkron/protoactor-go/remote"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/dpnode/dpnode/actors"
	"github.com/dpnode/dpnode/control"
	"github.com/dpnode/dpnode/dp"
	"github.com/dpnode/dpnode/engine/registry"
	"github.com/dpnode/dpnode/gpu"
	httpapi "github.com/dpnode/dpnode/http"
)

// Start checks the options, discovers the GPUs, starts the node's actors
// and its actor transport, joins the cluster, and serves HTTP unless
// headless. Every flag problem is reported before anything starts; a node
// whose ranks another node hosts is refused at the join, before it serves.
func Start(o Options) (*Running, error) { return StartContext(context.Background(), o) }

// StartContext is Start that gives up waiting for seeds and for ranks when
// ctx is done (SIGTERM while a pod waits to join). The steps: check
// everything, listen (HTTP, then the actor transport), join gossip and
// claim ranks when they are given out, start the engines, serve. What each
// step starts is stopped, in reverse order, when a later one fails.
func StartContext(ctx context.Context, o Options) (*Running, error) {
	s, err := prepare(o)
	if err != nil {
		return nil, err
	}
	s.r = &Running{served: make(chan error, 1), logger: s.o.Logger, drain: s.o.DrainTimeout, drainRequested: make(chan struct{}),
		leaveRequested: make(chan struct{}), leaveOnTerminate: s.o.LeaveOnTerminate}
	started := false
	defer func() {
		if !started {
			s.undo.run()
		}
	}()
	for _, step := range []func(context.Context) error{s.listen, s.join, s.startEngines, s.serve} {
		if err := step(ctx); err != nil {
			return nil, err
		}
	}
	started = true
	return s.r, nil
}

// startup is a node's start in progress: what the checks found, what the
// steps have started, and how to undo it.
type startup struct {
	o         Options
	p         *plan
	inv       gpu.Inventory
	topo      dp.Topology
	devices   []gpu.Device
	bindHost  string
	advHost   string
	secret    []byte
	transport *remote.Config

	r        *Running
	undo     cleanups
	httpAddr string
	cfg      actors.NodeConfig
	mcfg     control.MembershipConfig
	eng      *registry.Opened
	reg      *prometheus.Registry
}

// prepare checks the options and finds the GPUs and addresses, starting
// nothing.
func prepare(o Options) (*startup, error) {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	p, err := o.check()
	if err != nil {
		return nil, err
	}
	o.Bind = p.opts.Bind // resolved
	s := &startup{o: o, p: p}
	if p.engine.Devices != nil {
		// The engine's ranks are servers, not GPUs of this machine.
		s.inv = gpu.Inventory{Devices: p.engine.Devices, Source: gpu.SourceServers}
	} else if s.inv, err = gpu.Discover(gpu.Config{VirtualCount: o.GPUs, Logger: o.Logger}); err != nil {
		return nil, err
	}
	if s.topo, err = p.topology(len(s.inv.Devices)); err != nil {
		return nil, err
	}
	if s.topo.LocalSize > 0 {
		if s.devices, err = s.inv.Select(s.topo.LocalSize); err != nil {
			return nil, err
		}
	}
	s.bindHost, _, _ = control.SplitHostPort(o.Bind, 7946)
	if s.advHost, err = advertiseHost(s.bindHost, o.Advertise); err != nil {
		return nil, err
	}
	if s.secret, err = transportSecret(p.gossipKey, o.bindsLoopback()); err != nil {
		if len(o.Seeds) > 0 {
			return nil, fmt.Errorf("%w; a node that joins others needs one: set --gossip-key (or $DPNODE_GOSSIP_KEY)", err)
		}
		o.Logger.Warn(err.Error())
	}
	if s.transport, err = transportConfig(s.bindHost, s.advHost, o.RPCPort, o.TLS, s.secret); err != nil {
		return nil, err
	}
	if !o.TLS.Set() && !o.bindsLoopback() {
		o.Logger.Warn("actor traffic between nodes is plaintext and unauthenticated (--insecure-cluster); set --cluster-tls-cert, --cluster-tls-key and --cluster-tls-ca (dpnode certs writes them)")
	}
	if s.o.Hostname == "" {
		s.o.Hostname, _ = os.Hostname()
	}
	return s, nil
}

// listen opens the HTTP port, answering "starting" until the node serves,
// and the actor transport.
func (s *startup) listen(context.Context) error {
	o, r := s.o, s.r
	if s.topo.ServesAPI() {
		var err error
		if r.ln, err = net.Listen("tcp", o.address()); err != nil {
			return fmt.Errorf("cluster: listening for HTTP on %s: %w (is another server on that port? choose one with --port)", o.address(), err)
		}
		s.httpAddr = r.ln.Addr().String()
		// Served from now on: the join and the model's load can take
		// minutes, and a port that accepts and never answers reads as a
		// hung node to a probe.
		r.starting = &httpapi.Starting{}
		r.server = httpapi.NewHTTPServer(r.starting, o.HTTPTimeouts)
		r.conns = httpapi.NewConnCap(s.p.maxConnections)
		ln := r.conns.Apply(r.server, r.ln)
		go func() { r.served <- r.server.Serve(ln) }()
		// Its listener, and the connections it answered "starting" on.
		s.undo.push(func() { r.server.Close() })
	}
	// The actor transport listens before the node joins: a node that asks
	// for its ranks shows its certificate and its name there while it
	// waits.
	var err error
	for attempt := 1; ; attempt++ {
		r.node, err = actors.Listen(nodeName(o.Hostname, s.transport), s.transport, o.Logger)
		// A port found free can be taken before the transport listens on
		// it, by another process or as an outgoing connection's ephemeral
		// port: when dpnode chose it, it chooses again.
		if err == nil || o.RPCPort != 0 || attempt == 5 || !errors.Is(err, syscall.EADDRINUSE) {
			break
		}
		if s.transport, err = transportConfig(s.bindHost, s.advHost, o.RPCPort, o.TLS, s.secret); err != nil {
			break
		}
	}
	if err != nil {
		return err
	}
	s.undo.push(r.node.Stop)
	return nil
}

// join prepares the node's and the gossip's configuration and, when the
// node's ranks are given out, joins gossip and claims them.
func (s *startup) join(ctx context.Context) error {
	o, p, r := s.o, s.p, s.r
	cfg := actors.DefaultNodeConfig()
	cfg.Name = r.node.Name()
	cfg.NodeID = o.NodeID
	cfg.Model = p.served
	cfg.Topology = s.topo
	cfg.ExpertParallel = o.ExpertParallel
	cfg.Engine, cfg.Profile = o.Engine, p.engine.Profile
	s.mcfg = control.MembershipConfig{
		Name:      cfg.Name,
		Bind:      o.Bind,
		Advertise: o.Advertise,
		Seeds:     o.Seeds,
		Resolver:  o.Resolver,
		Founder:   o.founds(),
		// The join waits for a seed up to JoinTimeout; the claim that
		// follows has its own.
		JoinTimeout: o.JoinTimeout,
		SecretKey:   p.gossipKey,
		Profile:     o.GossipProfile,
		SendClaim:   r.node.SendClaim,
		Logger:      o.Logger,
	}
	if o.TLS.Set() {
		var err error
		s.mcfg.VerifyPeer, err = o.TLS.Verifier(r.node.Identify)
		if err == nil {
			s.mcfg.Seal, err = o.TLS.GossipSeal()
		}
		if err != nil {
			return err
		}
	}
	s.cfg = cfg
	if !(s.topo.AutoStart || s.topo.Elastic) || s.topo.LocalSize == 0 {
		// The node's ranks are its own: it joins once it serves them.
		return nil
	}
	// The leader gives the node its ranks: it joins gossip first, without
	// ranks, and asks.
	s.mcfg.Meta = cfg.PendingMeta()
	s.mcfg.Meta.JoiningActorAddress = r.node.Address()
	var err error
	if r.membership, err = control.StartMembership(ctx, s.mcfg); err != nil {
		return err
	}
	s.undo.push(func() { r.membership.Leave(time.Second) })
	start := s.topo.StartRank
	if s.topo.AutoStart {
		start = -1
	}
	o.Logger.Info("joined; asking the leader for ranks", "ranks", s.topo.LocalSize, "gossip", r.membership.Address())
	claimCtx, cancel := context.WithTimeout(ctx, o.JoinTimeout)
	hold, err := r.membership.Claim(claimCtx, control.Claim{Start: start, Count: s.topo.LocalSize, Experts: p.engine.Experts}, s.mcfg.Founder)
	cancel()
	if err != nil {
		return fmt.Errorf("cluster: this node got no ranks: %w", err)
	}
	s.topo.StartRank = hold.Start
	s.cfg.Topology, s.cfg.Key = s.topo, r.membership.Key()
	o.Logger.Info("the leader gave this node its ranks", "ranks", hold.String())
	return nil
}

// startEngines opens the engine (a llama.cpp model loads here) and starts
// the node's actors, returning once every local rank is ready.
func (s *startup) startEngines(ctx context.Context) error {
	o, p, r := s.o, s.p, s.r
	var loading *rankSet
	if r.starting != nil {
		// /health says which ranks still load their model (or wait
		// for their servers).
		loading = newRankSet(s.topo.StartRank, s.topo.LocalSize)
		r.starting.Loading(loading.list)
	}
	var err error
	if s.eng, err = p.openEngine(ctx, o, s.topo); err != nil {
		return err
	}
	r.closeEngine = s.eng.Close
	s.undo.push(s.eng.Close)
	s.reg = prometheus.NewRegistry()
	s.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if r.conns != nil {
		if err := r.conns.Register(s.reg); err != nil {
			return err
		}
	}
	cfg := &s.cfg
	cfg.Devices = s.devices
	cfg.Scheduler = p.scheduler
	cfg.Registry = s.reg
	cfg.Logger = o.Logger
	cfg.HTTPAddress = s.httpAddr
	cfg.AwaitMembership = true
	cfg.Migration, cfg.MaxMigrations = o.Migration, o.MaxMigrations
	if s.topo.Elastic {
		cfg.Experts = p.engine.Experts
	}
	if r.membership != nil {
		cfg.Roster = r.membership.Roster()
	}
	// The membership starts after the node when the node's ranks are its
	// own; the leader only publishes once gossip is attached.
	cfg.PublishRoster = func(ro control.Roster, claimant string) { r.membership.Publish(ro, claimant) }
	cfg.RefuseClaim = func(node string, err error) { r.membership.Refuse(node, err) }
	// Each API server counts its own picks: vLLM's policy bumps a rank by
	// the number of API servers, which a node does not know in advance.
	if cfg.Policy, err = dp.NewPolicy(o.BalancePolicy, dp.PolicyConfig{APIServers: 1, StepTokens: p.scheduler.MaxNumBatchedTokens,
		PrefillWeight: p.engine.PrefillWeight, Seed: mrand.Uint64()}); err != nil {
		return err
	}
	cfg.Restart.MaxRestarts, cfg.Restart.Window = o.EngineMaxRestarts, o.EngineRestartWindow
	cfg.CollectiveTimeout = o.CollectiveTimeout
	cfg.NewCore = s.eng.NewCore
	if loading != nil {
		cfg.RankReady = loading.remove
	}
	if s.eng.StartTimeout > 0 {
		cfg.StartTimeout = s.eng.StartTimeout
	}
	return r.node.Start(*cfg)
}

// serve joins gossip with the node's ranks (or gossips them, when they
// were given out), and serves the API and the metrics port.
func (s *startup) serve(ctx context.Context) error {
	o, p, r, eng := s.o, s.p, s.r, s.eng
	if r.membership == nil {
		s.mcfg.Name, s.mcfg.Meta = s.cfg.Name, r.node.Meta()
		var err error
		if r.membership, err = control.StartMembership(ctx, s.mcfg); err != nil {
			return err
		}
		s.undo.push(func() { r.membership.Leave(time.Second) })
	} else if err := r.membership.SetMeta(r.node.Meta()); err != nil {
		return err
	}
	r.membership.Attach(r.node)
	r.node.MembershipReady()

	if s.topo.ServesAPI() {
		api, err := httpapi.New(httpapi.Config{
			Backend:         r.node,
			Tokenizer:       eng.Tokenizer,
			ChatTemplate:    eng.Template,
			SimulatedEngine: p.engine.Simulated,
			Engine:          o.Engine,
			EngineLacks:     httpapi.LacksOf(p.engine.Capabilities),
			ToolCallParser:  o.ToolCallParser,
			AutoToolChoice:  o.EnableAutoToolChoice,
			ContentAsText:   o.TokenizeContentAsText,
			ModelAliases:    o.ServedModelAliases,
			LogRequests:     o.LogRequests,
			MaxModelLen:     p.scheduler.MaxModelLen,
			APIKeys:         p.apiKeys,
			AdminKeys:       p.adminKeys,
			MaxRequests:     p.maxRequests(s.topo),
			WriteTimeout:    o.HTTPTimeouts.Write,
			Gatherer:        s.reg,
			Registerer:      s.reg,
			OnDrain:         r.RequestDrain,
			OnLeave:         r.RequestLeave,
			Version:         o.Version,
			Build:           o.Build,
			Logger:          o.Logger,
		})
		if err != nil {
			return err
		}
		r.api = api
		r.starting.Ready(api.Handler())
	}
	metricsURL := "none"
	if o.MetricsPort >= 0 {
		addr := net.JoinHostPort(o.Host, strconv.Itoa(o.MetricsPort))
		m, err := httpapi.New(httpapi.Config{Backend: r.node, Tokenizer: eng.Tokenizer, MaxModelLen: p.scheduler.MaxModelLen,
			APIKeys: p.apiKeys, AdminKeys: p.adminKeys, Gatherer: s.reg, OnDrain: r.RequestDrain, OnLeave: r.RequestLeave,
			MetricsOnly: true, Version: o.Version, Build: o.Build, Logger: o.Logger})
		if err == nil {
			r.metricsLn, err = net.Listen("tcp", addr)
		}
		if err != nil {
			return fmt.Errorf("cluster: serving metrics on %s: %w", addr, err)
		}
		r.metricsAPI = m
		r.metrics = httpapi.NewHTTPServer(m.Handler(), o.HTTPTimeouts)
		ln := httpapi.NewConnCap(p.maxConnections).Apply(r.metrics, r.metricsLn)
		go func() { _ = r.metrics.Serve(ln) }()
		metricsURL = "http://" + r.metricsLn.Addr().String()
	}
	if !o.DisableLogStats {
		ctx, cancel := context.WithCancel(context.Background())
		r.stopStats = cancel
		s.undo.push(cancel)
		go (&statsLogger{gather: s.reg, logger: o.Logger}).run(ctx, StatsInterval)
	}
	url := "none (headless)"
	if r.ln != nil {
		url = "http://" + r.ln.Addr().String()
	}
	o.Logger.Info("dpnode serving", append([]any{
		"url", url, "metrics_url", metricsURL, "node", s.cfg.Name, "mode", s.topo.Mode.String(), "model", p.served, "engine", o.Engine},
		append(eng.Describe, "balance_policy", o.BalancePolicy, "ranks", rankRange(s.topo),
			"gpus", s.inv.Source, "gossip", r.membership.Address(), "actors", r.node.Meta().ActorAddress,
			"seeds", len(o.Seeds), "max_model_len", p.scheduler.MaxModelLen)...)...)
	return nil
}

// cleanups is a start's undo stack.
type cleanups []func()

func (c *cleanups) push(f func()) { *c = append(*c, f) }

// run calls the cleanups, the last pushed first.
func (c cleanups) run() {
	for i := len(c) - 1; i >= 0; i-- {
		c[i]()
	}
}

// rankSet is a set of ranks that goroutines share.
type rankSet struct {
	mu    sync.Mutex
	ranks map[int]bool
}

func newRankSet(start, n int) *rankSet {
	s := &rankSet{ranks: make(map[int]bool, n)}
	for r := start; r < start+n; r++ {
		s.ranks[r] = true
	}
	return s
}

func (s *rankSet) remove(rank int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.ranks, rank)
}

// list returns the ranks in order.
func (s *rankSet) list() []int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Sorted(maps.Keys(s.ranks))
}
