package actors

import (
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/dpnode/dpnode/dp"
	"github.com/dpnode/dpnode/engine"
	dpnodev1 "github.com/dpnode/dpnode/proto/dpnode/v1"
)

// Errors a request can end with on its stream.
var (
	ErrNoRank          = errors.New("actors: no rank became available in time")
	ErrRankNotServed   = errors.New("actors: the requested rank is not served by this node")
	ErrAPIServerGone   = errors.New("actors: the API server stopped; the request was lost with it")
	ErrTooManyRestarts = errors.New("actors: the request's engines crashed too often")
)

// RestartPolicy sets how a crashed engine comes back.
type RestartPolicy struct {
	// InitialBackoff is the wait before the first restart: long enough
	// that a crash loop does not spin, short enough that a one-off crash
	// costs little.
	InitialBackoff time.Duration
	// MaxBackoff caps the doubling of the wait after repeated crashes.
	MaxBackoff time.Duration
	// Window is how far back crashes count towards the backoff: a rank
	// that has been healthy this long restarts at InitialBackoff again.
	Window time.Duration
}

// DefaultRestartPolicy restarts at 100 ms, doubling to 10 s.
func DefaultRestartPolicy() RestartPolicy {
	return RestartPolicy{InitialBackoff: 100 * time.Millisecond, MaxBackoff: 10 * time.Second, Window: time.Minute}
}

// delay is the backoff after the n-th crash within the window (n >= 1).
func (p RestartPolicy) delay(n int) time.Duration {
	d := p.InitialBackoff
	for i := 1; i < n && d < p.MaxBackoff; i++ {
		d *= 2
	}
	return min(d, p.MaxBackoff)
}

// APIServerConfig sets up an APIServerActor.
type APIServerConfig struct {
	// Engines configures one engine per local rank.
	Engines []EngineConfig
	// Coordinator publishes load snapshots; nil for none.
	Coordinator *actor.PID
	Policy      dp.Policy
	Restart     RestartPolicy
	// ParkTimeout bounds how long a request waits for a rank to become
	// available (all ranks restarting, or its pinned rank down) before it
	// fails with ErrNoRank.
	ParkTimeout time.Duration
	// MaxMigrations bounds how many engine crashes one request may ride
	// through; past it the request fails rather than crash engine after
	// engine if it is what crashes them.
	MaxMigrations int
	Metrics       *Metrics
	Logger        *slog.Logger
}

// APIServerActor supervises the local engines and routes requests to them.
// It picks a rank per request from live local state (its exact in-flight
// counts plus the engines' own stats), honours pinned ranks, forwards each
// step's outputs to the requests' streams, and restarts crashed engines
// with backoff, moving their requests to other ranks.
type APIServerActor struct {
	cfg    APIServerConfig
	self   *actor.PID
	root   *actor.RootContext
	ranks  []*rankState
	calls  map[string]*call
	parked []*call
	// parkTimer is armed while requests are parked.
	parkTimer *time.Timer
	// snapshot is the coordinator's latest.
	snapshot *dpnodev1.LoadSnapshot
	loads    []dp.RankLoad
	// readyWaiters are answered once every rank has been ready.
	readyWaiters []*actor.PID
	allReady     bool
}

type rankState struct {
	cfg   EngineConfig
	pid   *actor.PID
	epoch *atomic.Uint64
	ready bool
	// inflight counts calls dispatched to the rank and not finished.
	inflight int
	stats    *dpnodev1.EngineStats
	crashes  []time.Time
	timer    *time.Timer
	metrics  *rankMetrics
}

// call is one request in flight.
type call struct {
	sub *Submission
	// rank indexes APIServerActor.ranks; -1 while parked.
	rank     int
	output   []uint32
	firstAt  time.Time
	lastAt   time.Time
	parkedAt time.Time
	moves    int
}

// NewAPIServerProducer returns the producer of an APIServerActor.
func NewAPIServerProducer(cfg APIServerConfig) actor.Producer {
	return func() actor.Actor {
		return &APIServerActor{cfg: cfg, calls: make(map[string]*call)}
	}
}

// Receive implements actor.Actor.
func (a *APIServerActor) Receive(ctx actor.Context) {
	switch msg := ctx.Message().(type) {
	case *actor.Started:
		a.start(ctx)
	case *actor.Stopping, *actor.Restarting:
		a.stop()
	case *Submission:
		c := &call{sub: msg, rank: -1}
		if _, dup := a.calls[msg.ID]; dup {
			msg.Stream.push(Event{Index: msg.Index, Finish: engine.FinishedError, Err: fmt.Errorf("actors: request id %q is already in flight", msg.ID)})
			return
		}
		a.calls[msg.ID] = c
		a.dispatch(ctx, c)
	case *Abort:
		a.abort(ctx, msg)
	case *dpnodev1.StepOutputs:
		a.stepOutputs(msg)
	case *dpnodev1.EngineStats:
		if r := a.rankOf(msg.Rank); r != nil && msg.EngineEpoch == r.epoch.Load() {
			a.applyStats(r, msg)
		}
	case *dpnodev1.EngineReady:
		a.engineReady(ctx, msg)
	case *engineFailed:
		a.engineFailed(ctx, msg)
	case *expireParked:
		a.expireParked()
	case *dpnodev1.LoadSnapshot:
		if a.snapshot == nil || msg.CoordinatorEpoch >= a.snapshot.CoordinatorEpoch {
			a.snapshot = msg
		}
	case *getView:
		ctx.Respond(a.view())
	case *awaitReady:
		if a.allReady {
			ctx.Respond(&ready{})
		} else {
			a.readyWaiters = append(a.readyWaiters, ctx.Sender())
		}
	}
}

func (a *APIServerActor) start(ctx actor.Context) {
	a.self, a.root = ctx.Self(), ctx.ActorSystem().Root
	a.ranks = make([]*rankState, len(a.cfg.Engines))
	a.loads = make([]dp.RankLoad, len(a.cfg.Engines))
	for i, ec := range a.cfg.Engines {
		r := &rankState{cfg: ec, epoch: new(atomic.Uint64), metrics: a.cfg.Metrics.forRank(ec.Rank)}
		r.epoch.Store(1)
		props := actor.PropsFromProducer(NewEngineProducer(ec, r.epoch))
		pid, err := ctx.SpawnNamed(props, fmt.Sprintf("engine-%d", ec.Rank))
		if err != nil {
			panic(fmt.Errorf("actors: spawning the engine of rank %d: %w", ec.Rank, err))
		}
		r.pid = pid
		a.ranks[i] = r
	}
	if a.cfg.Coordinator != nil {
		sub := &dpnodev1.SubscribeLoad{}
		for _, r := range a.ranks {
			sub.Ranks = append(sub.Ranks, uint32(r.cfg.Rank))
		}
		ctx.Request(a.cfg.Coordinator, sub)
	}
}

// stop ends every call: the streams' readers must not wait for an actor
// that is gone. On a restart the engines are stopped with it and come
// back fresh.
func (a *APIServerActor) stop() {
	for _, r := range a.ranks {
		if r.timer != nil {
			r.timer.Stop()
		}
		r.ready = false
		r.metrics.ready.Set(0)
		r.metrics.inflight.Set(0)
	}
	if a.parkTimer != nil {
		a.parkTimer.Stop()
	}
	for id, c := range a.calls {
		c.sub.Stream.push(Event{Index: c.sub.Index, Finish: engine.FinishedError, Err: ErrAPIServerGone})
		delete(a.calls, id)
	}
	a.parked = nil
	a.cfg.Metrics.parked.Set(0)
}

// HandleFailure makes the API server the supervisor of its engines (an
// actor that implements actor.SupervisorStrategy supervises its own
// children). It runs on the API server's mailbox goroutine; the work is
// done in Receive, where the actor can send with itself as sender.
func (a *APIServerActor) HandleFailure(_ *actor.ActorSystem, sup actor.Supervisor, child *actor.PID, _ *actor.RestartStatistics, reason, _ any) {
	for i, r := range a.ranks {
		if r.pid.Equal(child) {
			a.root.Send(a.self, &engineFailed{rank: i, reason: reason, restart: func() { sup.RestartChildren(child) }})
			return
		}
	}
	sup.EscalateFailure(reason, nil)
}

func (a *APIServerActor) rankOf(rank uint32) *rankState {
	for _, r := range a.ranks {
		if r.cfg.Rank == int(rank) {
			return r
		}
	}
	return nil
}

// pick chooses the rank index for c, or -1 when c must wait.
func (a *APIServerActor) pick(c *call) (int, error) {
	if c.sub.Rank != AnyRank {
		for i, r := range a.ranks {
			if r.cfg.Rank == c.sub.Rank {
				if !r.ready {
					return -1, nil
				}
				return i, nil
			}
		}
		return -1, fmt.Errorf("%w: rank %d", ErrRankNotServed, c.sub.Rank)
	}
	for i, r := range a.ranks {
		l := &a.loads[i]
		*l = dp.RankLoad{Rank: r.cfg.Rank, Available: r.ready, InFlight: r.inflight}
		if r.stats != nil {
			l.Waiting, l.Running, l.KVUsage = int(r.stats.NumWaiting), int(r.stats.NumRunning), float64(r.stats.KvCacheUsage)
		}
	}
	return a.cfg.Policy.Pick(a.loads), nil
}

func (a *APIServerActor) dispatch(ctx actor.Context, c *call) {
	i, err := a.pick(c)
	if err != nil {
		a.fail(c, err, "rank_not_served")
		return
	}
	if i < 0 {
		a.park(c)
		return
	}
	r := a.ranks[i]
	c.rank, c.parkedAt = i, time.Time{}
	r.inflight++
	r.metrics.inflight.Set(float64(r.inflight))
	ctx.Request(r.pid, &dpnodev1.AddRequest{
		RequestId:       c.sub.ID,
		PromptTokenIds:  c.sub.Prompt,
		Sampling:        samplingToWire(c.sub.Sampling),
		OutputTokenIds:  c.output,
		EngineEpoch:     r.epoch.Load(),
		ArrivalUnixNano: c.sub.Arrival.UnixNano(),
	})
}

func (a *APIServerActor) park(c *call) {
	// A call re-parked after an unsuccessful wake-up keeps its first park
	// time: its deadline must not move each time some rank restarts.
	if c.parkedAt.IsZero() {
		c.parkedAt = time.Now()
	}
	a.parked = append(a.parked, c)
	a.cfg.Metrics.parked.Set(float64(len(a.parked)))
	if a.parkTimer == nil {
		a.armParkTimer(a.cfg.ParkTimeout)
	}
}

func (a *APIServerActor) armParkTimer(d time.Duration) {
	self, root := a.self, a.root
	a.parkTimer = time.AfterFunc(d, func() { root.Send(self, &expireParked{}) })
}

func (a *APIServerActor) unpark(ctx actor.Context) {
	waiting := a.parked
	a.parked = nil
	for _, c := range waiting {
		a.dispatch(ctx, c)
	}
	a.cfg.Metrics.parked.Set(float64(len(a.parked)))
	if len(a.parked) == 0 && a.parkTimer != nil {
		a.parkTimer.Stop()
		a.parkTimer = nil
	}
}

func (a *APIServerActor) expireParked() {
	a.parkTimer = nil
	now := time.Now()
	a.parked = slices.DeleteFunc(a.parked, func(c *call) bool {
		if now.Sub(c.parkedAt) < a.cfg.ParkTimeout {
			return false
		}
		a.fail(c, fmt.Errorf("%w: waited %v", ErrNoRank, a.cfg.ParkTimeout), "no_rank")
		return true
	})
	a.cfg.Metrics.parked.Set(float64(len(a.parked)))
	if len(a.parked) > 0 {
		a.armParkTimer(a.cfg.ParkTimeout - now.Sub(a.parked[0].parkedAt))
	}
}

func (a *APIServerActor) abort(ctx actor.Context, msg *Abort) {
	c := a.calls[msg.ID]
	if c == nil {
		return
	}
	delete(a.calls, msg.ID)
	if c.rank < 0 {
		a.parked = slices.DeleteFunc(a.parked, func(p *call) bool { return p == c })
		a.cfg.Metrics.parked.Set(float64(len(a.parked)))
		return
	}
	r := a.ranks[c.rank]
	ctx.Send(r.pid, &dpnodev1.AbortRequests{RequestIds: []string{msg.ID}})
	a.release(c)
	if msg.Reason == engine.FinishedStop {
		// A stop string matched: the request succeeded.
		a.finished(r, c, engine.FinishedStop, time.Now())
		return
	}
	r.metrics.abort.Inc()
}

// finished records a successful finish.
func (a *APIServerActor) finished(r *rankState, c *call, reason engine.FinishReason, now time.Time) {
	if reason == engine.FinishedLength {
		r.metrics.length.Inc()
	} else {
		r.metrics.stop.Inc()
	}
	r.metrics.promptTokens.Add(float64(len(c.sub.Prompt)))
	r.metrics.e2e.Observe(now.Sub(c.sub.Arrival).Seconds())
}

// release takes a finished call off its rank's count.
func (a *APIServerActor) release(c *call) {
	if c.rank < 0 {
		return
	}
	r := a.ranks[c.rank]
	r.inflight--
	r.metrics.inflight.Set(float64(r.inflight))
	c.rank = -1
}

// fail ends c with an error.
func (a *APIServerActor) fail(c *call, err error, reason string) {
	delete(a.calls, c.sub.ID)
	a.release(c)
	c.sub.Stream.push(Event{Index: c.sub.Index, Finish: engine.FinishedError, Err: err})
	a.cfg.Metrics.failedWith(reason)
}

func (a *APIServerActor) stepOutputs(msg *dpnodev1.StepOutputs) {
	r := a.rankOf(msg.Rank)
	if r == nil || msg.EngineEpoch != r.epoch.Load() {
		return
	}
	if msg.Stats != nil {
		a.applyStats(r, msg.Stats)
	}
	now := time.Now()
	for _, o := range msg.Outputs {
		c := a.calls[o.RequestId]
		if c == nil || c.rank < 0 || a.ranks[c.rank] != r {
			continue
		}
		if n := len(o.NewTokenIds); n > 0 {
			if c.firstAt.IsZero() {
				c.firstAt = now
				r.metrics.ttft.Observe(now.Sub(c.sub.Arrival).Seconds())
			} else {
				r.metrics.itl.Observe(now.Sub(c.lastAt).Seconds() / float64(n))
			}
			c.lastAt = now
			c.output = append(c.output, o.NewTokenIds...)
			r.metrics.generation.Add(float64(n))
		}
		ev := Event{Index: c.sub.Index, Tokens: o.NewTokenIds, Finish: o.FinishReason, Rank: r.cfg.Rank}
		if c.moves == 0 {
			// After a move the new engine's cache hit covers the tokens
			// generated before; the client's prompt hit was the first.
			ev.NumCachedTokens = int(o.NumCachedTokens)
		}
		switch o.FinishReason {
		case engine.NotFinished:
			c.sub.Stream.push(ev)
			continue
		case engine.FinishedError:
			a.fail(c, fmt.Errorf("engine rank %d: %s", r.cfg.Rank, o.Error), "engine_refused")
			continue
		}
		a.finished(r, c, o.FinishReason, now)
		delete(a.calls, c.sub.ID)
		a.release(c)
		c.sub.Stream.push(ev)
	}
}

func (a *APIServerActor) applyStats(r *rankState, st *dpnodev1.EngineStats) {
	m := r.metrics
	// Counters restart with each engine incarnation.
	prev := r.stats
	if prev == nil || prev.EngineEpoch != st.EngineEpoch {
		prev = &dpnodev1.EngineStats{}
	}
	m.steps.Add(float64(st.Step - prev.Step))
	m.prefixQueries.Add(float64(st.PrefixCacheQueries - prev.PrefixCacheQueries))
	m.prefixHits.Add(float64(st.PrefixCacheHits - prev.PrefixCacheHits))
	m.preemptions.Add(float64(st.NumPreemptions - prev.NumPreemptions))
	r.stats = st
	m.running.Set(float64(st.NumRunning))
	m.waiting.Set(float64(st.NumWaiting))
	m.kvUsage.Set(float64(st.KvCacheUsage))
}

func (a *APIServerActor) engineReady(ctx actor.Context, msg *dpnodev1.EngineReady) {
	r := a.rankOf(msg.Rank)
	if r == nil || msg.EngineEpoch != r.epoch.Load() {
		return
	}
	r.ready = true
	r.metrics.ready.Set(1)
	if !a.allReady && !slices.ContainsFunc(a.ranks, func(r *rankState) bool { return !r.ready }) {
		a.allReady = true
		for _, w := range a.readyWaiters {
			ctx.Send(w, &ready{})
		}
		a.readyWaiters = nil
	}
	a.unpark(ctx)
}

// engineFailed moves a crashed engine's requests elsewhere and schedules
// its restart. The epoch goes up first, so that the new incarnation drops
// the requests still queued in its mailbox: they are being moved here.
func (a *APIServerActor) engineFailed(ctx actor.Context, msg *engineFailed) {
	r := a.ranks[msg.rank]
	r.epoch.Add(1)
	r.ready = false
	r.stats = nil
	r.metrics.ready.Set(0)
	r.metrics.restarts.Inc()
	r.metrics.running.Set(0)
	r.metrics.waiting.Set(0)
	r.metrics.kvUsage.Set(0)

	now := time.Now()
	r.crashes = slices.DeleteFunc(append(r.crashes, now), func(t time.Time) bool { return now.Sub(t) > a.cfg.Restart.Window })
	delay := a.cfg.Restart.delay(len(r.crashes))

	var moved []*call
	for _, c := range a.calls {
		if c.rank == msg.rank {
			moved = append(moved, c)
		}
	}
	// Oldest first, so that the re-dispatch keeps arrival order.
	slices.SortFunc(moved, func(x, y *call) int { return x.sub.Arrival.Compare(y.sub.Arrival) })
	a.cfg.Logger.Error("engine crashed; restarting it and moving its requests",
		"rank", r.cfg.Rank, "reason", fmt.Sprint(msg.reason), "requests", len(moved), "restart_in", delay)
	for _, c := range moved {
		a.release(c)
		c.moves++
		if c.moves > a.cfg.MaxMigrations {
			a.fail(c, fmt.Errorf("%w: %d crashes", ErrTooManyRestarts, c.moves), "too_many_restarts")
			continue
		}
		if len(c.output) == 0 {
			r.metrics.redispatched.Inc()
		} else {
			r.metrics.migrated.Inc()
		}
		a.dispatch(ctx, c)
	}
	if r.timer != nil {
		r.timer.Stop()
	}
	r.timer = time.AfterFunc(delay, msg.restart)
}

// RankView is one rank as the API server sees it.
type RankView struct {
	Rank     int     `json:"rank"`
	Ready    bool    `json:"ready"`
	InFlight int     `json:"in_flight"`
	Waiting  int     `json:"waiting"`
	Running  int     `json:"running"`
	KVUsage  float64 `json:"kv_cache_usage"`
	Restarts int     `json:"restarts_last_window"`
	Steps    uint64  `json:"steps"`
	Device   string  `json:"device,omitempty"`
}

// APIServerView is the API server's state for /v1/cluster.
type APIServerView struct {
	Ranks     []RankView             `json:"ranks"`
	Parked    int                    `json:"parked"`
	InFlight  int                    `json:"in_flight"`
	Snapshot  *dpnodev1.LoadSnapshot `json:"-"`
	Timestamp time.Time              `json:"-"`
}

func (a *APIServerActor) view() *APIServerView {
	now := time.Now()
	v := &APIServerView{Parked: len(a.parked), InFlight: len(a.calls), Snapshot: a.snapshot, Timestamp: now}
	for _, r := range a.ranks {
		rv := RankView{Rank: r.cfg.Rank, Ready: r.ready, InFlight: r.inflight, Device: r.cfg.Device}
		for _, t := range r.crashes {
			if now.Sub(t) <= a.cfg.Restart.Window {
				rv.Restarts++
			}
		}
		if r.stats != nil {
			rv.Waiting, rv.Running, rv.KVUsage, rv.Steps = int(r.stats.NumWaiting), int(r.stats.NumRunning), float64(r.stats.KvCacheUsage), r.stats.Step
		}
		v.Ranks = append(v.Ranks, rv)
	}
	return v
}
