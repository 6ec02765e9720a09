package cluster

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"os"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/asynkron/protoactor-go/remote"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"google.golang.org/protobuf/proto"

	"github.com/dpnode/dpnode/actors"
	"github.com/dpnode/dpnode/control"
	"github.com/dpnode/dpnode/dp"
	"github.com/dpnode/dpnode/gpu"
	httpapi "github.com/dpnode/dpnode/http"
	dpnodev1 "github.com/dpnode/dpnode/proto/dpnode/v1"
)

// Running is a started node.
type Running struct {
	node       *actors.Node
	membership *Membership
	// api, server and ln are nil on a headless node; server serves
	// starting, which answers for api once the node runs.
	api      *httpapi.Server
	server   *http.Server
	starting *httpapi.Starting
	ln       net.Listener
	// conns caps the connections of server.
	conns *httpapi.ConnCap
	// metrics serves the --metrics-port, when set, with metricsAPI's
	// routes.
	metrics    *http.Server
	metricsAPI *httpapi.Server
	metricsLn  net.Listener
	// drainRequested is closed by POST /admin/drain, leaveRequested by
	// POST /admin/leave.
	drainRequested chan struct{}
	drainOnce      sync.Once
	leaveRequested chan struct{}
	leaveOnce      sync.Once
	// leaveOnTerminate makes a stop a leave (--leave-on-terminate).
	leaveOnTerminate bool
	served           chan error
	logger           *slog.Logger
	drain            time.Duration

	// closeEngine stops what the engine runs beside the actors: the
	// llama.cpp tokenizer's worker.
	closeEngine func()

	shutdownOnce sync.Once
	shutdownErr  error
}

// Start checks the options, discovers the GPUs, starts the node's actors
// and its actor transport, joins the cluster, and serves HTTP unless
// headless. Every flag problem is reported before anything starts; a node
// whose ranks another node hosts is refused at the join, before it serves.
func Start(o Options) (*Running, error) { return StartContext(context.Background(), o) }

// StartContext is Start that gives up waiting for seeds and for ranks when
// ctx is done (SIGTERM while a pod waits to join).
func StartContext(ctx context.Context, o Options) (*Running, error) {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	p, err := o.check()
	if err != nil {
		return nil, err
	}
	o.Bind = p.opts.Bind // resolved
	inv, err := gpu.Discover(gpu.Config{VirtualCount: o.GPUs, Logger: o.Logger})
	if err != nil {
		return nil, err
	}
	topo, err := p.topology(len(inv.Devices))
	if err != nil {
		return nil, err
	}
	var devices []gpu.Device
	if topo.LocalSize > 0 {
		if devices, err = inv.Select(topo.LocalSize); err != nil {
			return nil, err
		}
	}
	bindHost, _, _ := splitHostPort(o.Bind, 7946)
	advHost, err := advertiseHost(bindHost, o.Advertise)
	if err != nil {
		return nil, err
	}
	secret, err := transportSecret(p.gossipKey, o.bindsLoopback())
	if err != nil {
		if len(o.Seeds) > 0 {
			return nil, fmt.Errorf("%w; a node that joins others needs one: set --gossip-key (or $DPNODE_GOSSIP_KEY)", err)
		}
		o.Logger.Warn(err.Error())
	}
	transport, err := transportConfig(bindHost, advHost, o.RPCPort, o.TLS, secret)
	if err != nil {
		return nil, err
	}
	if !o.TLS.set() && !o.bindsLoopback() {
		o.Logger.Warn("actor traffic between nodes is plaintext and unauthenticated (--insecure-cluster); set --cluster-tls-cert, --cluster-tls-key and --cluster-tls-ca (dpnode certs writes them)")
	}

	r := &Running{served: make(chan error, 1), logger: o.Logger, drain: o.DrainTimeout, drainRequested: make(chan struct{}),
		leaveRequested: make(chan struct{}), leaveOnTerminate: o.LeaveOnTerminate}
	// What each step starts is stopped, in reverse order, when a later
	// step fails.
	var undo cleanups
	started := false
	defer func() {
		if !started {
			undo.run()
		}
	}()
	httpAddr := ""
	if topo.ServesAPI() {
		if r.ln, err = net.Listen("tcp", o.address()); err != nil {
			return nil, fmt.Errorf("cluster: listening for HTTP on %s: %w (is another server on that port? choose one with --port)", o.address(), err)
		}
		httpAddr = r.ln.Addr().String()
		// Served from now on: the join and the model's load can take
		// minutes, and a port that accepts and never answers reads as a
		// hung node to a probe.
		r.starting = &httpapi.Starting{}
		r.server = httpapi.NewHTTPServer(r.starting, o.HTTPTimeouts)
		r.conns = httpapi.NewConnCap(p.maxConnections)
		ln := r.conns.Apply(r.server, r.ln)
		go func() { r.served <- r.server.Serve(ln) }()
	}
	undo.push(func() {
		if r.server != nil {
			// Its listener, and the connections it answered "starting" on.
			r.server.Close()
		}
	})

	if o.Hostname == "" {
		o.Hostname, _ = os.Hostname()
	}
	// The actor transport listens first: a node that asks for its ranks
	// shows its certificate and its name there while it waits.
	for attempt := 1; ; attempt++ {
		r.node, err = actors.Listen(nodeName(o.Hostname, transport), transport, o.Logger)
		// A port found free can be taken before the transport listens on
		// it, by another process or as an outgoing connection's ephemeral
		// port: when dpnode chose it, it chooses again.
		if err == nil || o.RPCPort != 0 || attempt == 5 || !errors.Is(err, syscall.EADDRINUSE) {
			break
		}
		if transport, err = transportConfig(bindHost, advHost, o.RPCPort, o.TLS, secret); err != nil {
			break
		}
	}
	if err != nil {
		return nil, err
	}
	undo.push(r.node.Stop)
	cfg := actors.DefaultNodeConfig()
	cfg.Name = r.node.Name()
	cfg.NodeID = o.NodeID
	cfg.Model = p.served
	cfg.Topology = topo
	cfg.ExpertParallel = o.ExpertParallel
	cfg.Engine, cfg.Profile = o.Engine, p.servingProfile()
	mcfg := MembershipConfig{
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
	if o.TLS.set() {
		mcfg.VerifyPeer, err = o.TLS.verifier(r.node.Identify)
		if err == nil {
			mcfg.RosterSeal, err = o.TLS.RosterSeal()
		}
		if err != nil {
			return nil, err
		}
	}
	if (topo.AutoStart || topo.Elastic) && topo.LocalSize > 0 {
		// The leader gives the node its ranks: it joins gossip
		// first, without ranks, and asks.
		mcfg.Meta = cfg.PendingMeta()
		mcfg.Meta.JoiningActorAddress = r.node.Address()
		if r.membership, err = StartMembership(ctx, mcfg); err != nil {
			return nil, err
		}
		undo.push(func() { r.membership.Leave(time.Second) })
		start := topo.StartRank
		if topo.AutoStart {
			start = -1
		}
		o.Logger.Info("joined; asking the leader for ranks", "ranks", topo.LocalSize, "gossip", r.membership.Address())
		claimCtx, cancel := context.WithTimeout(ctx, o.JoinTimeout)
		hold, err := r.membership.Claim(claimCtx, control.Claim{Start: start, Count: topo.LocalSize, Experts: p.experts}, mcfg.Founder)
		cancel()
		if err != nil {
			return nil, fmt.Errorf("cluster: this node got no ranks: %w", err)
		}
		topo.StartRank = hold.Start
		cfg.Topology, cfg.Key = topo, r.membership.Key()
		o.Logger.Info("the leader gave this node its ranks", "ranks", hold.String())
	}
	eng, err := p.newEngine(o, inv, topo)
	if err != nil {
		return nil, err
	}
	r.closeEngine = eng.close
	undo.push(eng.close)
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if r.conns != nil {
		if err := r.conns.Register(reg); err != nil {
			return nil, err
		}
	}
	cfg.Devices = devices
	cfg.Scheduler = p.scheduler
	cfg.Registry = reg
	cfg.Logger = o.Logger
	cfg.HTTPAddress = httpAddr
	cfg.AwaitMembership = true
	cfg.Migration, cfg.MaxMigrations = o.Migration, o.MaxMigrations
	if topo.Elastic {
		cfg.Experts = p.experts
	}
	if r.membership != nil {
		cfg.Roster = r.membership.Roster()
	}
	// The membership starts after the node when the node's ranks are its
	// own; the coordinator only publishes once gossip is attached.
	cfg.PublishRoster = func(ro control.Roster, claimant string) { r.membership.Publish(ro, claimant) }
	cfg.RefuseClaim = func(node string, err error) { r.membership.Refuse(node, err) }
	// Each API server counts its own picks: vLLM's policy bumps a rank by
	// the number of API servers, which a node does not know in advance.
	if cfg.Policy, err = dp.NewPolicy(o.BalancePolicy, dp.PolicyConfig{APIServers: 1, StepTokens: p.scheduler.MaxNumBatchedTokens, Seed: mrand.Uint64()}); err != nil {
		return nil, err
	}
	cfg.Restart.MaxRestarts, cfg.Restart.Window = o.EngineMaxRestarts, o.EngineRestartWindow
	cfg.CollectiveTimeout = o.CollectiveTimeout
	cfg.NewExecutor = eng.newExecutor
	if eng.startTimeout > 0 {
		cfg.StartTimeout = eng.startTimeout
	}
	if err = r.node.Start(cfg); err != nil {
		return nil, err
	}
	if r.membership == nil {
		mcfg.Name, mcfg.Meta = cfg.Name, r.node.Meta()
		if r.membership, err = StartMembership(ctx, mcfg); err != nil {
			return nil, err
		}
		undo.push(func() { r.membership.Leave(time.Second) })
	} else if err = r.membership.SetMeta(r.node.Meta()); err != nil {
		return nil, err
	}
	r.membership.Attach(r.node)
	r.node.MembershipReady()

	if topo.ServesAPI() {
		api, err := httpapi.New(httpapi.Config{
			Backend:         r.node,
			Tokenizer:       eng.tokenizer,
			ChatTemplate:    eng.template,
			SimulatedEngine: eng.simulated,
			ToolCallParser:  o.ToolCallParser,
			AutoToolChoice:  o.EnableAutoToolChoice,
			ContentAsText:   o.TokenizeContentAsText,
			MaxModelLen:     p.scheduler.MaxModelLen,
			APIKeys:         p.apiKeys,
			AdminKeys:       p.adminKeys,
			MaxRequests:     p.maxRequests(topo),
			WriteTimeout:    o.HTTPTimeouts.Write,
			Gatherer:        reg,
			Registerer:      reg,
			OnDrain:         r.RequestDrain,
			OnLeave:         r.RequestLeave,
			Version:         o.Version,
			Logger:          o.Logger,
		})
		if err != nil {
			return nil, err
		}
		r.api = api
		r.starting.Ready(api.Handler())
	}
	metricsURL := "none"
	if o.MetricsPort >= 0 {
		addr := net.JoinHostPort(o.Host, strconv.Itoa(o.MetricsPort))
		m, err := httpapi.New(httpapi.Config{Backend: r.node, Tokenizer: eng.tokenizer, MaxModelLen: p.scheduler.MaxModelLen,
			APIKeys: p.apiKeys, AdminKeys: p.adminKeys, Gatherer: reg, OnDrain: r.RequestDrain, OnLeave: r.RequestLeave,
			MetricsOnly: true, Version: o.Version, Logger: o.Logger})
		if err == nil {
			r.metricsLn, err = net.Listen("tcp", addr)
		}
		if err != nil {
			return nil, fmt.Errorf("cluster: serving metrics on %s: %w", addr, err)
		}
		r.metricsAPI = m
		r.metrics = httpapi.NewHTTPServer(m.Handler(), o.HTTPTimeouts)
		ln := httpapi.NewConnCap(p.maxConnections).Apply(r.metrics, r.metricsLn)
		go func() { _ = r.metrics.Serve(ln) }()
		metricsURL = "http://" + r.metricsLn.Addr().String()
	}
	url := "none (headless)"
	if r.ln != nil {
		url = "http://" + r.ln.Addr().String()
	}
	o.Logger.Info("dpnode serving", append([]any{
		"url", url, "metrics_url", metricsURL, "node", cfg.Name, "mode", topo.Mode.String(), "model", p.served, "engine", o.Engine},
		append(eng.describe, "balance_policy", o.BalancePolicy, "ranks", rankRange(topo),
			"gpus", inv.Source, "gossip", r.membership.Address(), "actors", r.node.Meta().ActorAddress,
			"seeds", len(o.Seeds), "max_model_len", p.scheduler.MaxModelLen)...)...)
	started = true
	return r, nil
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

// nodeName is unique per incarnation: a restarted node is a new member,
// and the name says which machine and process it is.
func nodeName(hostname string, transport *remote.Config) string {
	return fmt.Sprintf("%s/%s/%s", hostname, transport.AdvertisedHost, rand.Text()[:6])
}

func rankRange(t dp.Topology) string {
	size := strconv.Itoa(t.Size)
	if t.Elastic {
		size = "auto"
	}
	if t.LocalSize == 0 {
		return "none of " + size
	}
	return fmt.Sprintf("%d-%d of %s", t.StartRank, t.StartRank+t.LocalSize-1, size)
}

// Addr is the HTTP listener's address; empty on a headless node.
func (r *Running) Addr() string {
	if r.ln == nil {
		return ""
	}
	return r.ln.Addr().String()
}

// Node is the node's actors.
func (r *Running) Node() *actors.Node { return r.node }

// RequestDrain asks Run to drain the node and return (POST /admin/drain).
func (r *Running) RequestDrain() { r.drainOnce.Do(func() { close(r.drainRequested) }) }

// RequestLeave asks Run to take the node out of the deployment and return
// (POST /admin/leave).
func (r *Running) RequestLeave() { r.leaveOnce.Do(func() { close(r.leaveRequested) }) }

// Shutdown drains, then stops. Draining, the node refuses new requests
// (503, and /health says draining) and gossips that it drains, so that
// other nodes' API servers send it nothing new; it waits, up to the drain
// timeout, until neither its API server nor its engines hold a request,
// and past the timeout ends those left with a clear error. Then it stops
// serving HTTP, leaves the cluster (the others drop its ranks at once),
// and stops the actors. Its ranks stay its own, for it to take back when
// it restarts. Calls after the first (or Leave) return its result.
func (r *Running) Shutdown() error {
	r.shutdownOnce.Do(func() { r.shutdownErr = r.shutdown(r.leaveOnTerminate) })
	return r.shutdownErr
}

// Leave is Shutdown that also gives the node's ranks back once it has
// drained: an elastic deployment shrinks by them, and a fixed one has
// them free for another node.
func (r *Running) Leave() error {
	r.shutdownOnce.Do(func() { r.shutdownErr = r.shutdown(true) })
	return r.shutdownErr
}

// releaseTimeout bounds a leaving node's wait for the coordinator to take
// its ranks back; past it the node goes anyway, and its ranks stay down.
const releaseTimeout = 10 * time.Second

func (r *Running) shutdown(leave bool) error {
	deadline := time.Now().Add(r.drain)
	r.logger.Info("draining: no new requests; waiting for those in flight", "timeout", r.drain)
	// Both ports' /health say so: a headless node's probes read its
	// metrics port.
	for _, s := range []*httpapi.Server{r.api, r.metricsAPI} {
		if s != nil {
			s.SetDraining()
		}
	}
	meta := proto.Clone(r.node.Meta()).(*dpnodev1.NodeMeta)
	meta.Draining = true
	if err := r.membership.SetMeta(meta); err != nil {
		r.logger.Warn("could not gossip that this node drains", "error", err)
	}
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		idle, err := r.node.Idle(ctx)
		cancel()
		if idle || err != nil {
			break
		}
		if time.Now().After(deadline) {
			r.logger.Warn("drain timeout passed; ending the requests still in flight with an error")
			r.node.FailInFlight()
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if leave {
		ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
		if err := r.membership.Release(ctx); err != nil {
			r.logger.Warn("could not give this node's ranks back; they stay down until a node takes them", "error", err)
		} else {
			r.logger.Info("gave this node's ranks back", "size", r.membership.Roster().Size())
		}
		cancel()
	}
	var err error
	if r.server != nil {
		// What is left are handlers writing their last bytes.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err = r.server.Shutdown(ctx); errors.Is(err, context.DeadlineExceeded) {
			err = r.server.Close()
		}
		if serveErr := <-r.served; serveErr != nil && !errors.Is(serveErr, http.ErrServerClosed) {
			err = serveErr
		}
	}
	r.membership.Leave(2 * time.Second)
	if r.metrics != nil {
		_ = r.metrics.Close()
	}
	r.node.Stop()
	r.closeEngine()
	r.logger.Info("stopped")
	return err
}

// Run starts a node and serves until ctx is done, then drains.
func Run(ctx context.Context, o Options) error {
	r, err := StartContext(ctx, o)
	if err != nil {
		if ctx.Err() != nil {
			// Stopped while it waited to join: nothing to drain.
			o.Logger.Info("stopped before serving", "error", err)
			return nil
		}
		return err
	}
	select {
	case <-ctx.Done():
	case <-r.drainRequested:
		r.logger.Info("drain requested over HTTP")
	case <-r.leaveRequested:
		r.logger.Info("leave requested over HTTP")
		return r.Leave()
	case err := <-r.served:
		r.membership.Leave(2 * time.Second)
		r.closeEngine()
		return fmt.Errorf("cluster: the HTTP server stopped: %w", err)
	case <-r.node.Failed():
		_ = r.Shutdown()
		return fmt.Errorf("cluster: the node cannot serve: %w", r.node.Err())
	}
	return r.Shutdown()
}
