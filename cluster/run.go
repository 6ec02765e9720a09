package cluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/dpnode/dpnode/actors"
	"github.com/dpnode/dpnode/engine"
	"github.com/dpnode/dpnode/engine/sim"
	"github.com/dpnode/dpnode/gpu"
	httpapi "github.com/dpnode/dpnode/http"
)

// Running is a started node.
type Running struct {
	node   *actors.Node
	server *http.Server
	ln     net.Listener
	served chan error
	logger *slog.Logger
	drain  time.Duration
}

// Start checks the options, discovers the GPUs, starts the node's actors
// and begins serving HTTP. Every flag problem is reported before anything
// starts.
func Start(o Options) (*Running, error) {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	p, err := o.check()
	if err != nil {
		return nil, err
	}
	inv, err := gpu.Discover(gpu.Config{VirtualCount: o.GPUs, Logger: o.Logger})
	if err != nil {
		return nil, err
	}
	topo, err := p.topology(len(inv.Devices))
	if err != nil {
		return nil, err
	}
	devices, err := inv.Select(topo.LocalSize)
	if err != nil {
		return nil, err
	}
	tok := sim.NewTokenizer(0)
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	cfg := actors.DefaultNodeConfig()
	cfg.Model = p.served
	cfg.Topology = topo
	cfg.Devices = devices
	cfg.Scheduler = p.scheduler
	cfg.Registry = reg
	cfg.Logger = o.Logger
	cfg.NewExecutor = func(int, gpu.Device) (engine.Executor, error) {
		return sim.NewExecutor(sim.ExecutorConfig{Profile: p.profile, Tokenizer: tok, Clock: engine.RealClock{}, TimeScale: o.SimTimeScale})
	}
	ln, err := net.Listen("tcp", o.address())
	if err != nil {
		return nil, fmt.Errorf("cluster: listening for HTTP on %s: %w (is another server on that port? choose one with --port)", o.address(), err)
	}
	node, err := actors.StartNode(cfg)
	if err != nil {
		ln.Close()
		return nil, err
	}
	api, err := httpapi.New(httpapi.Config{
		Backend:     node,
		Tokenizer:   tok,
		MaxModelLen: p.scheduler.MaxModelLen,
		APIKey:      o.APIKey,
		Gatherer:    reg,
		Version:     o.Version,
		Logger:      o.Logger,
	})
	if err != nil {
		node.Stop()
		ln.Close()
		return nil, err
	}
	r := &Running{
		node:   node,
		server: &http.Server{Handler: api.Handler(), ReadHeaderTimeout: 10 * time.Second},
		ln:     ln,
		served: make(chan error, 1),
		logger: o.Logger,
		drain:  o.DrainTimeout,
	}
	go func() { r.served <- r.server.Serve(ln) }()
	o.Logger.Info("dpnode serving",
		"url", "http://"+ln.Addr().String(), "model", p.served, "engine", o.Engine, "sim_profile", p.profile.Name,
		"sim_time_scale", o.SimTimeScale, "ranks", fmt.Sprintf("%d-%d of %d", topo.StartRank, topo.StartRank+topo.LocalSize-1, topo.Size),
		"gpus", inv.Source, "max_model_len", p.scheduler.MaxModelLen)
	return r, nil
}

// Addr is the HTTP listener's address.
func (r *Running) Addr() string { return r.ln.Addr().String() }

// Node is the node's actors.
func (r *Running) Node() *actors.Node { return r.node }

// Shutdown drains: it stops taking requests, lets those in flight finish
// within the drain timeout (cutting off the rest after it), then stops the
// actors.
func (r *Running) Shutdown() error {
	ctx, cancel := context.WithTimeout(context.Background(), r.drain)
	defer cancel()
	r.logger.Info("draining: no new requests; waiting for those in flight", "timeout", r.drain)
	err := r.server.Shutdown(ctx)
	if errors.Is(err, context.DeadlineExceeded) {
		r.logger.Warn("drain timeout passed; closing the connections still open")
		err = r.server.Close()
	}
	r.node.Stop()
	if serveErr := <-r.served; serveErr != nil && !errors.Is(serveErr, http.ErrServerClosed) {
		return serveErr
	}
	r.logger.Info("stopped")
	return err
}

// Run starts a node and serves until ctx is done, then drains.
func Run(ctx context.Context, o Options) error {
	r, err := Start(o)
	if err != nil {
		return err
	}
	select {
	case <-ctx.Done():
	case err := <-r.served:
		r.node.Stop()
		return fmt.Errorf("cluster: the HTTP server stopped: %w", err)
	case <-r.node.Failed():
		_ = r.Shutdown()
		return fmt.Errorf("cluster: the node cannot serve: %w", r.node.Err())
	}
	return r.Shutdown()
}

// IsFlagError reports whether err is about the command line.
func IsFlagError(err error) bool { return errors.Is(err, errFlags) }
