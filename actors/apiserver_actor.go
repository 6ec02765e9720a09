package actors

import (
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/dpnode/dpnode/control"
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
	ErrEngineLost      = errors.New("actors: the engine serving the request was lost mid-stream, and request migration is off")
	ErrRankFailed      = errors.New("actors: the requested rank failed: its engine crashed too often and was stopped")
	ErrRankLost        = errors.New("actors: the requested rank is gone: the cluster declared its node dead")
	ErrDrained         = errors.New("actors: the node drained before the request finished; send it again to another node")
)

// RestartPolicy sets how a crashed engine comes back, and when it does not.
type RestartPolicy struct {
	// InitialBackoff is the wait before the first restart: long enough
	// that a crash loop does not spin, short enough that a one-off crash
	// costs little.
	InitialBackoff time.Duration
	// MaxBackoff caps the doubling of the wait after repeated crashes.
	MaxBackoff time.Duration
	// Window is how far back crashes count towards the backoff and the
	// limit: a rank that has been healthy this long starts afresh.
	Window time.Duration
	// MaxRestarts is how many crashes within Window a rank rides out; one
	// more and the engine is stopped and the rank marked failed, rather
	// than crash-loop (a GPU that is gone fails every start). 0 means no
	// limit.
	MaxRestarts int
}

// DefaultRestartPolicy restarts at 100 ms, doubling to 10 s, and gives up
// on a rank that crashes more than 5 times in a minute.
func DefaultRestartPolicy() RestartPolicy {
	return RestartPolicy{InitialBackoff: 100 * time.Millisecond, MaxBackoff: 10 * time.Second, Window: time.Minute, MaxRestarts: 5}
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
	// Node is the name of this node, for views and rank statuses.
	Node string
	// Engines are the node's engines, one per local rank.
	Engines []LocalEngine
	// Roster says which ranks the deployment has, when the API server
	// starts; the node actor tells it of newer ones.
	Roster control.Roster
	// BalanceRemote makes the API server send requests to other nodes'
	// ranks as well as its own (internal load balancing).
	BalanceRemote bool
	// ExpertParallel stamps requests with the wave and wakes the others
	// when the engines are idle.
	ExpertParallel bool
	Policy         dp.Policy
	// BlockSize is the engines' KV block size, for prefix affinity.
	BlockSize int
	// MaxNumSeqs is each engine's --max-num-seqs, for the balancer.
	MaxNumSeqs int
	Restart    RestartPolicy
	// ParkTimeout bounds how long a request waits for a rank to become
	// available (all ranks restarting, or its pinned rank down) before it
	// fails with ErrNoRank.
	ParkTimeout time.Duration
	// Migration moves a request that has produced output off a lost
	// engine, to continue from its tokens so far on another rank; without
	// it such a request fails (one with no output is always sent again).
	Migration bool
	// MaxMigrations bounds how many engine losses one request may ride
	// through; past it the request fails rather than crash engine after
	// engine if it is what crashes them.
	MaxMigrations int
	Metrics       *Metrics
	Logger        *slog.Logger
}

// LocalEngine is one of the node's engines as its API server sees it. The
// node actor spawned it and supervises it: the API server is not its
// parent, so that an API server crash leaves the engines running, with
// their models loaded. The node actor passes their crashes on, and the
// API server decides whether and when each restarts.
type LocalEngine struct {
	Config EngineConfig
	PID    *actor.PID
	// Epoch is the engine's incarnation, shared with its producer, which
	// reads it at every restart.
	Epoch *atomic.Uint64
}

// APIServerActor routes requests to the ranks it balances over: its own,
// and in internal mode every rank of the cluster. It picks a rank per
// request from live state (its exact in-flight counts plus the engines'
// own stats), honours pinned ranks, forwards each step's outputs to the
// requests' streams, restarts crashed local engines with backoff, and
// moves the requests of a crashed engine or a dead node to other ranks. A
// node without an HTTP server (headless) runs one too, to restart its
// engines.
type APIServerActor struct {
	cfg  APIServerConfig
	self *actor.PID
	root *actor.RootContext
	// ranks is every rank this API server knows, local ones first;
	// byRank indexes it.
	ranks  []*rankState
	byRank map[int]*rankState
	calls  map[string]*call
	// local are the node's ranks. Like calls they outlive incarnations:
	// the engines, their restart bookkeeping and their readiness do not
	// change when the API server crashes.
	local  []*rankState
	parked []*call
	// parkTimer is armed while requests are parked.
	parkTimer *time.Timer
	loads     []dp.RankLoad

	// coordinator is where snapshots come from, and coordEpoch its epoch.
	coordinator *actor.PID
	coordEpoch  uint64
	snapshot    *dpnodev1.LoadSnapshot
	// waves is this API server's belief about the wave (expert
	// parallelism).
	waves dp.FrontendWave

	// hosts are the other nodes whose ranks this API server balances
	// over, by node name; subscribers are the API servers of other nodes
	// that balance over this node's ranks.
	hosts       map[string]*actor.PID
	subscribers []*actor.PID
	// retry holds members whose connection broke, to subscribe to again;
	// unanswered, hosts subscribed to that have not yet sent their ranks'
	// statuses, and when. A subscription can be lost with a connection
	// that breaks as it is sent, and then no Terminated comes either: it
	// is sent again until the host answers or leaves.
	retry      map[string]*actor.PID
	unanswered map[string]time.Time
	retryTimer *time.Timer
	// reconcileTimer is armed while calls run on remote ranks.
	reconcileTimer *time.Timer

	// readyWaiters are answered once every local rank has been ready.
	readyWaiters []*actor.PID
	allReady     bool
	// served outlives incarnations, like calls: once every local rank has
	// been ready, a rank that cannot start is restarted, not given up on,
	// even by an incarnation that has not yet seen its ranks ready.
	served *bool
	// stopping is set while the API server and its engines stop.
	stopping bool
	// roster says which ranks the deployment has: a request pinned to
	// one of them that is down waits for it, one pinned to any other
	// rank fails.
	roster control.Roster
}

// maxOutputReserve bounds the room a call's output is given at once: the
// room for a typical answer, one allocation instead of one per doubling.
const maxOutputReserve = 512

// rosterUpdate tells the API server of a newer roster.
type rosterUpdate struct {
	roster control.Roster
}

// call is one request in flight.
type call struct {
	sub *Submission
	// rank is where the call runs; nil while parked.
	rank *rankState
	// dispatchedAt is when the call was last sent to its rank.
	dispatchedAt time.Time
	// p is what the call has produced so far; sink is the attempt that
	// runs at rank, nil while the call waits for one.
	p        *progress
	sink     *sink
	parkedAt time.Time
	moves    int
	// placing describes the request to the policy; made at its first pick.
	placing *dp.Request
	// cached is what the last pick expected the rank to hold of the
	// prompt; prefill is the tokens the rank has to prefill for the call,
	// counted in its account until the first output.
	cached, prefill int
}

// NewAPIServerProducer returns the producer of an APIServerActor. The
// calls in flight belong to the producer, not to one incarnation: when the
// actor crashes, its supervisor restarts it with the same producer, and
// the new incarnation finds the calls and carries them on (a request's
// state must not be lost with the actor that routes it). Incarnations
// never run at once, so the map needs no lock.
func NewAPIServerProducer(cfg APIServerConfig) actor.Producer {
	calls := make(map[string]*call)
	served := new(bool)
	local := make([]*rankState, len(cfg.Engines))
	for i, e := range cfg.Engines {
		local[i] = &rankState{rank: e.Config.Rank, local: true, node: cfg.Node, cfg: e.Config, pid: e.PID, epoch: e.Epoch, metrics: e.Config.Metrics}
	}
	return func() actor.Actor {
		return &APIServerActor{cfg: cfg, calls: calls, local: local, served: served, roster: cfg.Roster, byRank: make(map[int]*rankState),
			hosts: make(map[string]*actor.PID), retry: make(map[string]*actor.PID),
			unanswered: make(map[string]time.Time)}
	}
}

// Receive implements actor.Actor.
func (a *APIServerActor) Receive(ctx actor.Context) {
	if faultHook != nil && faultHook(ctx) {
		return
	}
	switch msg := ctx.Message().(type) {
	case *actor.Started:
		a.start(ctx)
	case *actor.Stopping:
		a.stopping = true
		a.stop()
		for _, r := range a.local {
			if r.timer != nil {
				r.timer.Stop()
			}
		}
	case *actor.Restarting:
		// A crash: the next incarnation takes the calls over.
		a.stopping = true
		a.detach(ctx)
	case *Submission:
		a.submit(ctx, msg)
	case *Abort:
		a.abort(ctx, msg)
	case *dpnodev1.StepOutputs:
		a.stepOutputs(msg)
	case *localOutputs:
		a.localOutputs(msg)
	case *dpnodev1.EngineStats:
		if r := a.byRank[int(msg.Rank)]; r != nil && r.local && msg.EngineEpoch == r.epoch.Load() {
			a.applyStats(r, msg)
		}
	case *dpnodev1.EngineReady:
		a.engineReady(ctx, msg)
	case *engineFailed:
		a.engineFailed(ctx, msg)
	case *rosterUpdate:
		a.roster = msg.roster
		a.pruneRanks()
	case *expireParked:
		a.expireParked()
	case *dpnodev1.CoordinatorChanged:
		a.coordinatorChanged(ctx, msg)
	case *dpnodev1.LoadSnapshot:
		a.loadSnapshot(msg)
	case *dpnodev1.SubscribeRanks:
		a.subscribeRanks(ctx)
	case *dpnodev1.RankStatuses:
		a.remoteStatuses(ctx, ctx.Sender(), msg.Ranks)
	case *dpnodev1.RankStatus:
		a.remoteStatuses(ctx, ctx.Sender(), []*dpnodev1.RankStatus{msg})
	case *groupStatus:
		a.groupStatus(ctx, msg)
	case *failAll:
		a.failAll(ctx, msg.err)
	case *nodeUp:
		a.nodeUp(ctx, msg)
	case *nodeDown:
		a.nodeDown(ctx, msg.name)
	case *retryHosts:
		a.retryHosts(ctx)
	case *reconcile:
		a.reconcile(ctx)
	case *dpnodev1.RequestList:
		a.requestList(ctx, msg)
	case *actor.Terminated:
		a.terminated(ctx, msg.Who)
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

// submit takes a client's request in and sends it to a rank.
func (a *APIServerActor) submit(ctx actor.Context, msg *Submission) {
	if old, dup := a.calls[msg.ID]; dup {
		if !old.p.done() {
			msg.Stream.push(Event{Index: msg.Index, Finish: engine.FinishedError, Err: fmt.Errorf("actors: request id %q is already in flight", msg.ID)})
			return
		}
		// Ended at a local engine, whose word of it is on its way.
		a.ended(old)
	}
	c := &call{sub: msg, p: &progress{}}
	if n := min(msg.Sampling.MaxTokens, maxOutputReserve); n > 0 {
		c.p.output = make([]uint32, 0, n)
	}
	a.calls[msg.ID] = c
	a.dispatch(ctx, c)
}

// loadSnapshot takes a load snapshot in. Only the coordinator this node
// elected is heard: a deposed one (an older epoch, or one across a healed
// partition) is not.
func (a *APIServerActor) loadSnapshot(msg *dpnodev1.LoadSnapshot) {
	if a.coordinator == nil || msg.CoordinatorEpoch != a.coordEpoch {
		return
	}
	a.snapshot = msg
	a.waves.Observe(msg.CurrentWave, msg.EnginesRunning)
	for _, l := range msg.Ranks {
		if r := a.byRank[int(l.Rank)]; r != nil {
			r.snap, r.snapSeq = l, msg.Seq
		}
	}
}

// failAll ends every call with err, aborted where it runs: the drain
// timeout passed.
func (a *APIServerActor) failAll(ctx actor.Context, err error) {
	for _, c := range a.calls {
		if c.rank != nil {
			ctx.Send(c.rank.pid, &dpnodev1.AbortRequests{RequestIds: []string{c.sub.ID}})
		}
		a.parked = slices.DeleteFunc(a.parked, func(p *call) bool { return p == c })
		a.fail(c, err, "drained")
	}
	a.cfg.Metrics.parked.Set(float64(len(a.parked)))
}

// nodeDown: gossip declared the node dead or gone. Unlike a broken
// connection, its ranks will not come back until a node that hosts them
// joins, and requests pinned to them fail now.
func (a *APIServerActor) nodeDown(ctx actor.Context, name string) {
	a.nodeGone(ctx, name)
	delete(a.retry, name)
	// Its ranks left balancing when it left, or earlier, when its
	// connection broke.
	for _, r := range a.ranks {
		if !r.local && r.node == name {
			r.lost = true
			a.failPinned(r)
		}
	}
	a.pruneRanks()
}

// stop ends every call: the streams' readers must not wait for an actor
// that is gone.
func (a *APIServerActor) stop() {
	a.stopTimers()
	for id, c := range a.calls {
		c.p.end(c.sub.Stream, Event{Index: c.sub.Index, Finish: engine.FinishedError, Err: ErrAPIServerGone})
		delete(a.calls, id)
	}
}

// detach readies the calls for the next incarnation of a crashed API
// server. The calls map outlives the actor (see NewAPIServerProducer), and
// so do the engines, local and remote; but the crash may have lost a
// remote engine's output on its way to a stream, and the new incarnation
// starts its counts afresh, so each call is taken off its rank and
// aborted there, and the next incarnation sends it again, from its tokens
// so far (see resume).
func (a *APIServerActor) detach(ctx actor.Context) {
	a.stopTimers()
	for _, c := range a.calls {
		c.p.detach()
		if r := c.rank; r != nil {
			ctx.Send(r.pid, &dpnodev1.AbortRequests{RequestIds: []string{c.sub.ID}})
		}
		c.rank, c.prefill, c.sink = nil, 0, nil
	}
}

// stopTimers ends what the incarnation armed. A local rank's restart
// timer is the engine's, not the incarnation's: it is stopped only when
// the API server stops for good. A local rank stays ready: its engine
// lives on.
func (a *APIServerActor) stopTimers() {
	for _, r := range a.ranks {
		if !r.local {
			r.ready = false
		}
		r.acct = dp.Account{}
		r.metrics.inflight.Set(0)
	}
	if a.parkTimer != nil {
		a.parkTimer.Stop()
	}
	if a.retryTimer != nil {
		a.retryTimer.Stop()
	}
	if a.reconcileTimer != nil {
		a.reconcileTimer.Stop()
	}
	a.parked = nil
	a.cfg.Metrics.parked.Set(0)
}

// resume takes over the calls of a crashed incarnation: each moves, as
// off a lost engine, and waits for a rank. Their streams go on: a client
// sees at most a pause, and the tokens continue where they were.
func (a *APIServerActor) resume(ctx actor.Context) {
	if len(a.calls) == 0 {
		return
	}
	calls := slices.SortedFunc(maps.Values(a.calls), func(x, y *call) int { return x.sub.Arrival.Compare(y.sub.Arrival) })
	resumed, ended := 0, 0
	for _, c := range calls {
		tokens, done := c.p.detach()
		if done {
			// It ended at a local engine while the API server restarted.
			delete(a.calls, c.sub.ID)
			ended++
			continue
		}
		c.moves++
		c.parkedAt = time.Time{}
		switch {
		case c.moves > a.cfg.MaxMigrations:
			// A request that crashes the API server each time it is
			// handled must not crash it for good.
			a.fail(c, fmt.Errorf("%w: %d crashes", ErrTooManyRestarts, c.moves), "too_many_restarts")
		case tokens > 0 && !a.cfg.Migration:
			a.fail(c, fmt.Errorf("%w (the API server restarted after %d tokens)", ErrEngineLost, tokens), "engine_lost")
		default:
			resumed++
			a.dispatch(ctx, c)
		}
	}
	a.cfg.Logger.Warn("the API server restarted after a crash; its requests continue", "requests", resumed, "failed", len(calls)-resumed-ended)
}

// pick chooses the rank for c; nil with no error means c must wait.
func (a *APIServerActor) pick(c *call) (*rankState, error) {
	if rank := c.sub.Rank; rank != AnyRank {
		r := a.byRank[rank]
		c.cached = 0
		switch {
		case r != nil && (r.failed || r.lost):
			_, err := r.gone()
			return nil, err
		case r != nil && r.ready:
			return r, nil
		case r != nil || (a.cfg.BalanceRemote && a.roster.Has(rank)):
			// Down, or on a node that has not joined yet: wait for it.
			return nil, nil
		}
		return nil, fmt.Errorf("%w: rank %d", ErrRankNotServed, rank)
	}
	a.loads = a.loads[:0]
	for _, r := range a.ranks {
		var latest, snap dp.EngineCounts
		if r.stats != nil {
			latest = dp.EngineCounts{Waiting: int(r.stats.NumWaiting), Running: int(r.stats.NumRunning), KVUsage: float64(r.stats.KvCacheUsage)}
		}
		if r.snap != nil {
			snap = dp.EngineCounts{Waiting: int(r.snap.NumWaiting), Running: int(r.snap.NumRunning)}
		}
		a.loads = append(a.loads, r.acct.Load(r.rank, r.ready && !r.draining, a.cfg.MaxNumSeqs, latest, snap, r.snapSeq))
	}
	if c.placing == nil {
		c.placing = dp.NewRequest(c.sub.Prompt, max(a.cfg.BlockSize, 1), c.sub.CacheSalt)
	}
	if i := a.cfg.Policy.Pick(c.placing, a.loads); i >= 0 {
		c.cached = c.placing.Cached
		return a.ranks[i], nil
	}
	return nil, nil
}

func (a *APIServerActor) dispatch(ctx actor.Context, c *call) {
	r, err := a.pick(c)
	if err != nil {
		reason := "rank_not_served"
		if pinned := a.byRank[c.sub.Rank]; pinned != nil && (pinned.failed || pinned.lost) {
			reason, _ = pinned.gone()
		}
		a.fail(c, err, reason)
		return
	}
	if r == nil {
		a.park(c)
		return
	}
	s := &sink{id: c.sub.ID, index: c.sub.Index, whole: c.sub.Whole, stream: c.sub.Stream, arrival: c.sub.Arrival, rank: r.rank,
		metrics: r.metrics, owner: a.self, first: c.moves == 0, moves: c.moves, p: c.p}
	output, ok := c.p.next(s)
	if !ok {
		// Its end is on its way from a local engine.
		delete(a.calls, c.sub.ID)
		return
	}
	c.rank, c.sink, c.parkedAt, c.dispatchedAt = r, s, time.Time{}, time.Now()
	a.armReconcile()
	c.prefill = dp.Prefill(len(c.sub.Prompt)+len(output), c.cached)
	r.acct.Send(c.prefill)
	r.metrics.inflight.Set(float64(r.acct.InFlight))
	add := &dpnodev1.AddRequest{
		RequestId:       c.sub.ID,
		PromptTokenIds:  c.sub.Prompt,
		Sampling:        samplingToWire(c.sub.Sampling),
		OutputTokenIds:  output,
		EngineEpoch:     r.epoch.Load(),
		ArrivalUnixNano: c.sub.Arrival.UnixNano(),
		Attempt:         uint32(c.moves),
		CacheSalt:       c.sub.CacheSalt,
	}
	if r.local && c.placing != nil {
		// The engine in this process takes the blocks' hashes as the
		// balancer computed them; another node's computes its own, which
		// costs less than sending 32 bytes per block.
		add.PromptBlockHashes = packHashes(c.placing.Blocks)
	}
	notify := false
	if a.cfg.ExpertParallel {
		add.Wave, notify = a.waves.Dispatch()
	}
	if r.local {
		// Its outputs go straight to the stream (see sink).
		ctx.Request(r.pid, &localAdd{add: add, sink: s})
	} else {
		ctx.Request(r.pid, add)
	}
	if notify && a.coordinator != nil {
		// After the request, never before: the notice wakes the other
		// ranks, and their step reports wake the target too. A target that
		// hears them before its request steps empty-handed, the wave ends
		// on that first step, and the request, now stamped with an ended
		// wave, starts a second one: a needless step on every rank. Sent
		// first, the request is ahead in the target's mailbox of anything
		// the notice causes, and ahead on the connection to its node.
		ctx.Send(a.coordinator, &dpnodev1.FirstRequest{TargetRank: uint32(r.rank), Wave: add.Wave, ArrivalUnixNano: add.ArrivalUnixNano})
	}
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
	c.p.detach()
	r := c.rank
	if r == nil {
		a.parked = slices.DeleteFunc(a.parked, func(p *call) bool { return p == c })
		a.cfg.Metrics.parked.Set(float64(len(a.parked)))
		return
	}
	ctx.Send(r.pid, &dpnodev1.AbortRequests{RequestIds: []string{msg.ID}})
	a.release(c)
}

// release takes a call off its rank's count.
func (a *APIServerActor) release(c *call) {
	if r := c.rank; r != nil {
		r.acct.Release(c.prefill)
		r.metrics.inflight.Set(float64(r.acct.InFlight))
		c.rank, c.prefill = nil, 0
	}
	c.sink = nil
}

// ended takes a call that has ended off the books.
func (a *APIServerActor) ended(c *call) {
	delete(a.calls, c.sub.ID)
	a.release(c)
}

// fail ends c with an error.
func (a *APIServerActor) fail(c *call, err error, reason string) {
	a.ended(c)
	c.p.end(c.sub.Stream, Event{Index: c.sub.Index, Finish: engine.FinishedError, Err: err})
	a.cfg.Metrics.failedWith(reason)
}

// stepOutputs delivers a remote engine's outputs.
func (a *APIServerActor) stepOutputs(msg *dpnodev1.StepOutputs) {
	r := a.byRank[int(msg.Rank)]
	if r == nil || msg.EngineEpoch != r.epoch.Load() {
		return
	}
	if msg.Stats != nil {
		a.applyStats(r, msg.Stats)
	}
	now := time.Now()
	for _, o := range msg.Outputs {
		c := a.calls[o.RequestId]
		if c == nil || c.rank != r || c.sink == nil || o.Attempt != uint32(c.moves) {
			continue
		}
		out := engine.Output{ID: o.RequestId, NewTokens: o.NewTokenIds, Finish: finishFromWire(o.FinishReason), NumCachedTokens: int(o.NumCachedTokens),
			Queued: time.Duration(o.QueuedNs), Logprobs: logprobsFromWire(o.Logprobs), PromptLogprobs: logprobsFromWire(o.PromptLogprobs), Refused: o.Refused}
		prefilled, ended := c.sink.deliver(&out, o.Error, now)
		a.delivered(c, prefilled, ended, out.Finish == engine.FinishedError)
	}
}

// localOutputs takes what a local engine says of the outputs it delivered.
func (a *APIServerActor) localOutputs(msg *localOutputs) {
	if r := a.byRank[msg.rank]; r != nil && msg.stats != nil && msg.epoch == r.epoch.Load() {
		a.applyStats(r, msg.stats)
	}
	for _, s := range msg.prefilled {
		if c := a.attempt(s); c != nil {
			a.delivered(c, true, false, false)
		}
	}
	for _, s := range msg.ended {
		if c := a.attempt(s); c != nil {
			a.delivered(c, false, true, false)
		}
	}
	for _, s := range msg.refused {
		if c := a.attempt(s); c != nil {
			a.delivered(c, false, true, true)
		}
	}
}

// attempt returns the call whose current attempt s is; nil when there is
// none (it was moved, aborted or failed since).
func (a *APIServerActor) attempt(s *sink) *call {
	if c := a.calls[s.id]; c != nil && c.sink == s {
		return c
	}
	return nil
}

// delivered keeps the books of a call's output: its prompt is prefilled,
// it ended, or the engine refused it.
func (a *APIServerActor) delivered(c *call, prefilled, ended, refused bool) {
	if prefilled && c.rank != nil {
		c.rank.acct.Prefilled(c.prefill)
		c.prefill = 0
	}
	if ended {
		a.ended(c)
	}
	if refused {
		a.cfg.Metrics.failedWith("engine_refused")
	}
}

// coordinatorChanged follows the node actor's election: every node follows
// the coordinator its own membership view elects, and hears only that
// one. In a failover the new coordinator's epoch is the higher (it booted
// after the dead one, the oldest).
func (a *APIServerActor) coordinatorChanged(ctx actor.Context, msg *dpnodev1.CoordinatorChanged) {
	if msg.Epoch != a.coordEpoch {
		a.snapshot = nil
	}
	a.coordEpoch = msg.Epoch
	a.coordinator = nil
	if msg.ActorAddress != "" {
		a.coordinator = actor.NewPID(msg.ActorAddress, coordinatorID)
		// Every snapshot: /v1/cluster shows all ranks, not only those
		// balanced here.
		ctx.Request(a.coordinator, &dpnodev1.SubscribeLoad{})
	}
	for _, r := range a.ranks {
		if r.local {
			ctx.Send(r.pid, &setCoordinator{pid: a.coordinator, epoch: a.coordEpoch})
		}
	}
}
