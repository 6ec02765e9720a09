package actors

import (
	"fmt"
	"maps"
	"slices"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/dpnode/dpnode/dp"
	dpnodev1 "github.com/dpnode/dpnode/proto/dpnode/v1"
)

// rankState is an API server's view of one rank.
type rankState struct {
	rank int
	// local ranks are this node's engines; the others are hosted by node,
	// and reached through the network.
	local bool
	node  string
	cfg   EngineConfig
	pid   *actor.PID
	// epoch is the engine incarnation requests are stamped with. A local
	// rank shares it with the engine's producer.
	epoch *atomic.Uint64
	ready bool
	// acct counts this API server's calls in flight at the rank and the
	// prompt tokens it has yet to prefill for them.
	acct  dp.Account
	stats *dpnodev1.EngineStats
	// snap is the rank's load in the coordinator's last snapshot.
	snap    *dpnodev1.RankLoad
	snapSeq uint64
	// draining is true while the rank's node drains: no new requests.
	draining bool
	// listAsked is when the rank's engine was last asked which requests
	// it holds.
	listAsked time.Time
	// crashes and timer are a local rank's restart bookkeeping; failed is
	// set when it crashed too often and was stopped.
	crashes []time.Time
	timer   *time.Timer
	failed  bool
	// lost is set when gossip declared the rank's node dead or gone, and
	// cleared when a node that hosts the rank says so.
	lost    bool
	metrics *rankMetrics
}

// Actor names, so that a node can address another node's actors.
const (
	nodeID        = "node"
	apiServerID   = nodeID + "/api-server"
	coordinatorID = nodeID + "/coordinator"
)

// engineID names a rank's engine. The node actor is the engine's parent,
// but the name is under the API server's, as it was when the API server
// was: other nodes address engines by it.
func engineID(rank int) string { return fmt.Sprintf("%s/engine-%d", apiServerID, rank) }

func (a *APIServerActor) start(ctx actor.Context) {
	a.self, a.root = ctx.Self(), ctx.ActorSystem().Root
	for _, r := range a.local {
		a.addRank(r)
		// An engine that stops for good (it crashed too often, or could
		// not start) takes its rank out of service; one that stopped
		// under an earlier incarnation is reported at once.
		ctx.Watch(r.pid)
		// The engine says it is ready, again if an earlier incarnation
		// heard it already: what it said may have been lost with it.
		ctx.Send(r.pid, &attachEngine{})
	}
	if len(a.cfg.Engines) == 0 {
		a.allReady, *a.served = true, true
	}
	// A restarted API server knows nothing of the cluster: its node tells
	// it the members and the coordinator again.
	ctx.Send(ctx.Parent(), &apiServerStarted{})
	a.resume(ctx)
}

func (a *APIServerActor) addRank(r *rankState) {
	a.ranks = append(a.ranks, r)
	a.byRank[r.rank] = r
	slices.SortStableFunc(a.ranks, func(x, y *rankState) int { return x.rank - y.rank })
}

func (a *APIServerActor) engineReady(ctx actor.Context, msg *dpnodev1.EngineReady) {
	r := a.byRank[int(msg.Rank)]
	if r == nil || !r.local || msg.EngineEpoch != r.epoch.Load() {
		return
	}
	r.ready = true
	r.metrics.ready.Set(1)
	// A restarted engine starts without a coordinator.
	ctx.Send(r.pid, &setCoordinator{pid: a.coordinator, epoch: a.coordEpoch})
	a.tellSubscribers(ctx, r)
	if !a.allReady && !slices.ContainsFunc(a.ranks, func(r *rankState) bool { return r.local && !r.ready }) {
		a.allReady, *a.served = true, true
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
	r := a.byRank[msg.rank]
	if startErr, ok := msg.reason.(*StartError); ok && !*a.served {
		// A rank that could not start before the node served at all would
		// fail the same way again: the node does not start.
		r.failed = true
		r.metrics.failed.Set(1)
		a.cfg.Logger.Error("engine could not start", "rank", r.rank, "error", startErr.Err)
		for _, w := range a.readyWaiters {
			ctx.Send(w, &ready{err: startErr})
		}
		a.readyWaiters = nil
		msg.stop()
		return
	}
	r.epoch.Add(1)
	r.ready = false
	r.stats = nil
	a.forgetRank(r.rank)
	r.metrics.ready.Set(0)
	r.metrics.restarts.Inc()
	r.metrics.running.Set(0)
	r.metrics.waiting.Set(0)
	r.metrics.kvUsage.Set(0)

	now := time.Now()
	r.crashes = slices.DeleteFunc(append(r.crashes, now), func(t time.Time) bool { return now.Sub(t) > a.cfg.Restart.Window })
	if limit := a.cfg.Restart.MaxRestarts; limit > 0 && len(r.crashes) > limit {
		// Past the limit the rank is given up on: it would only crash
		// again, taking the requests sent to it along.
		r.failed = true
		r.metrics.failed.Set(1)
		a.tellSubscribers(ctx, r)
		moved := a.move(ctx, r, "its engine crashed too often")
		a.cfg.Metrics.events.add(EventRankFailed, r.node, r.rank, fmt.Sprintf("crashed %d times in %v; out of service (last: %v)", len(r.crashes), a.cfg.Restart.Window, msg.reason))
		a.cfg.Logger.Error("engine crashed too often; the rank is stopped and out of service",
			"rank", r.rank, "crashes", len(r.crashes), "window", a.cfg.Restart.Window, "reason", fmt.Sprint(msg.reason), "requests_moved", moved)
		a.failPinned(r)
		msg.stop()
		return
	}
	delay := a.cfg.Restart.delay(len(r.crashes))
	a.tellSubscribers(ctx, r)
	moved := a.move(ctx, r, "its engine crashed")
	a.cfg.Metrics.events.add(EventRestart, r.node, r.rank, fmt.Sprintf("engine crashed (%v); restarting in %v", msg.reason, delay.Round(time.Millisecond)))
	a.cfg.Logger.Error("engine crashed; restarting it and moving its requests",
		"rank", r.rank, "reason", fmt.Sprint(msg.reason), "requests", moved, "restart_in", delay)
	if r.timer != nil {
		r.timer.Stop()
	}
	r.timer = time.AfterFunc(delay, msg.restart)
}

// gone is the reason label and the error of a request pinned to r that
// fails at once; for a rank that failed or was lost.
func (r *rankState) gone() (reason string, err error) {
	if r.failed {
		return "rank_failed", fmt.Errorf("%w: rank %d", ErrRankFailed, r.rank)
	}
	return "rank_lost", fmt.Errorf("%w: rank %d (node %s)", ErrRankLost, r.rank, r.node)
}

// failPinned ends the parked requests pinned to a rank that failed or was
// lost: it will not come back soon, and they would otherwise wait out the
// park timeout for nothing.
func (a *APIServerActor) failPinned(r *rankState) {
	a.parked = slices.DeleteFunc(a.parked, func(c *call) bool {
		if c.sub.Rank != r.rank {
			return false
		}
		reason, err := r.gone()
		a.fail(c, err, reason)
		return true
	})
	a.cfg.Metrics.parked.Set(float64(len(a.parked)))
}

// pruneRanks forgets the remote ranks that are gone and no longer the
// deployment's: an elastic deployment shrank by them. (A lost rank that is
// still the deployment's is down, and kept: its node may come back.)
func (a *APIServerActor) pruneRanks() {
	if !a.roster.Elastic() {
		return
	}
	a.ranks = slices.DeleteFunc(a.ranks, func(r *rankState) bool {
		if r.local || !r.lost || a.roster.Has(r.rank) {
			return false
		}
		delete(a.byRank, r.rank)
		r.metrics.inflight.Set(0)
		return true
	})
}

// groupStatus: a local engine left the expert-parallel group (it missed a
// collective: the others go on without it) or rejoined it. Out of the
// group it cannot step, so its requests move, as after a crash, and are
// aborted in the engine, which is alive.
func (a *APIServerActor) groupStatus(ctx actor.Context, msg *groupStatus) {
	r := a.byRank[msg.rank]
	if r == nil || !r.local || msg.epoch != r.epoch.Load() || r.ready == msg.in {
		return
	}
	r.ready = msg.in
	r.metrics.ready.Set(map[bool]float64{true: 1, false: 0}[msg.in])
	a.tellSubscribers(ctx, r)
	if msg.in {
		a.unpark(ctx)
		return
	}
	var ids []string
	for id, c := range a.calls {
		if c.rank == r {
			ids = append(ids, id)
		}
	}
	if n := a.move(ctx, r, "it left the expert-parallel group"); n > 0 {
		ctx.Send(r.pid, &dpnodev1.AbortRequests{RequestIds: ids})
		a.cfg.Logger.Warn("a rank left the expert-parallel group; moved its requests", "rank", r.rank, "requests", n)
	}
}

func (a *APIServerActor) applyStats(r *rankState, st *dpnodev1.EngineStats) {
	prev := r.stats
	r.stats = st
	if !r.local {
		// Only a node's own engines are in its metrics.
		return
	}
	m := r.metrics
	// Counters restart with each engine incarnation.
	if prev == nil || prev.EngineEpoch != st.EngineEpoch {
		prev = &dpnodev1.EngineStats{}
	}
	m.steps.Add(float64(st.Step - prev.Step))
	m.computed.Add(float64(st.ComputedTokens - prev.ComputedTokens))
	m.prefixQueries.Add(float64(st.PrefixCacheQueries - prev.PrefixCacheQueries))
	m.prefixHits.Add(float64(st.PrefixCacheHits - prev.PrefixCacheHits))
	m.preemptions.Add(float64(st.NumPreemptions - prev.NumPreemptions))
	m.running.Set(float64(st.NumRunning))
	m.waiting.Set(float64(st.NumWaiting))
	m.kvUsage.Set(float64(st.KvCacheUsage))
}

func localStatus(r *rankState) *dpnodev1.RankStatus {
	return &dpnodev1.RankStatus{Rank: uint32(r.rank), EngineEpoch: r.epoch.Load(), Ready: r.ready}
}

// subscribeRanks registers another node's API server for this node's rank
// statuses.
func (a *APIServerActor) subscribeRanks(ctx actor.Context) {
	s := ctx.Sender()
	if s == nil {
		return
	}
	if !slices.ContainsFunc(a.subscribers, s.Equal) {
		a.subscribers = append(a.subscribers, s)
		ctx.Watch(s)
	}
	a.pushStatuses(ctx, s)
}

// pushStatuses sends this node's rank statuses to an API server.
func (a *APIServerActor) pushStatuses(ctx actor.Context, to *actor.PID) {
	var st dpnodev1.RankStatuses
	for _, r := range a.ranks {
		if r.local {
			st.Ranks = append(st.Ranks, localStatus(r))
		}
	}
	// Sent with this API server as sender: that is how the receiver knows
	// which node speaks.
	ctx.Request(to, &st)
}

func (a *APIServerActor) tellSubscribers(ctx actor.Context, r *rankState) {
	st := localStatus(r)
	for _, s := range a.subscribers {
		ctx.Request(s, st)
	}
}

// nodeUp: another node joined. In internal mode its ranks join the
// balancing set once its API server says they are ready.
func (a *APIServerActor) nodeUp(ctx actor.Context, msg *nodeUp) {
	// Every member hears of this node's ranks: an API server that balances
	// over them learns at once when they restart (with this one), and
	// the others ignore it.
	if peer := actor.NewPID(msg.meta.ActorAddress, apiServerID); !slices.ContainsFunc(a.subscribers, peer.Equal) {
		a.subscribers = append(a.subscribers, peer)
		a.pushStatuses(ctx, peer)
	}
	if !a.cfg.BalanceRemote || msg.meta.LocalSize == 0 {
		return
	}
	// A draining node finishes what it has: send it nothing new.
	for _, r := range a.ranks {
		if !r.local && r.node == msg.name {
			r.draining = msg.meta.Draining
		}
	}
	if a.hosts[msg.name] != nil {
		return
	}
	host := actor.NewPID(msg.meta.ActorAddress, apiServerID)
	// One address holds one live process: a node of another name at this
	// address is an earlier incarnation, dead even if gossip has not said
	// so yet. Its ranks go now, or statuses of the new one could be taken
	// for its own and lost when it is finally declared gone.
	a.forgetOtherIncarnations(ctx, msg.name, host)
	a.hosts[msg.name] = host
	ctx.Watch(host)
	a.subscribe(ctx, msg.name, host)
}

// subscribe asks the API server of the node called name for its ranks'
// statuses, and to tell this one of every change; until it answers, the
// retry timer asks again.
func (a *APIServerActor) subscribe(ctx actor.Context, name string, host *actor.PID) {
	ctx.Request(host, &dpnodev1.SubscribeRanks{})
	a.unanswered[name] = time.Now()
	a.armRetry()
}

// remoteStatuses applies what another node's API server says of its
// ranks. A rank whose engine changed (a new epoch, or a new incarnation of
// the node) lost the requests it held: they move.
func (a *APIServerActor) remoteStatuses(ctx actor.Context, from *actor.PID, statuses []*dpnodev1.RankStatus) {
	node := a.hostName(from)
	if node == "" {
		return
	}
	delete(a.unanswered, node)
	unpark := false
	for _, st := range statuses {
		rank := int(st.Rank)
		r := a.byRank[rank]
		if r != nil && r.local {
			a.cfg.Logger.Error("another node claims a rank of this node; ignoring it", "rank", rank, "node", node)
			continue
		}
		if r == nil {
			r = &rankState{rank: rank, epoch: new(atomic.Uint64), metrics: a.cfg.Metrics.forRank(rank, false)}
			a.addRank(r)
		}
		replaced := r.node != node || r.epoch.Load() != st.EngineEpoch
		// The rank's new state first: the requests moved off it must not
		// be sent back to the engine that lost them.
		r.node, r.ready, r.lost = node, st.Ready, false
		r.pid = actor.NewPID(from.Address, engineID(rank))
		r.epoch.Store(st.EngineEpoch)
		if replaced {
			r.stats = nil
			a.forgetRank(rank)
			if n := a.move(ctx, r, "its engine was replaced"); n > 0 {
				a.cfg.Logger.Warn("a remote engine was replaced; moved its requests", "rank", rank, "node", node, "requests", n)
			}
		}
		unpark = unpark || st.Ready
	}
	if unpark {
		a.unpark(ctx)
	}
}

// hostName is the name of the node whose API server is pid, or "". There
// is at most one: see forgetOtherIncarnations.
func (a *APIServerActor) hostName(pid *actor.PID) string {
	for name, p := range a.hosts {
		if p.Equal(pid) {
			return name
		}
	}
	return ""
}

// hostRetryInterval is how often an API server tries again to reach a
// member whose connection broke.
const hostRetryInterval = 2 * time.Second

func (a *APIServerActor) armRetry() {
	if a.retryTimer == nil && len(a.retry)+len(a.unanswered) > 0 {
		self, root := a.self, a.root
		a.retryTimer = time.AfterFunc(hostRetryInterval, func() { root.Send(self, &retryHosts{}) })
	}
}

func (a *APIServerActor) retryHosts(ctx actor.Context) {
	a.retryTimer = nil
	for name, pid := range a.retry {
		delete(a.retry, name)
		if a.hostName(pid) != "" {
			continue // a newer incarnation at the same address
		}
		a.hosts[name] = pid
		ctx.Watch(pid)
		a.subscribe(ctx, name, pid)
	}
	now := time.Now()
	for name, since := range a.unanswered {
		host := a.hosts[name]
		switch {
		case host == nil:
			delete(a.unanswered, name)
		case now.Sub(since) >= hostRetryInterval:
			a.cfg.Logger.Warn("a node has not answered this API server's subscription to its ranks; asking again",
				"node", name, "waited", now.Sub(since).Round(time.Millisecond))
			ctx.Watch(host)
			a.subscribe(ctx, name, host)
		}
	}
	a.armRetry()
}

// forgetRank tells the policy that the rank's engine is new: whatever it
// remembers of the rank (cached prefixes) is gone.
func (a *APIServerActor) forgetRank(rank int) {
	if f, ok := a.cfg.Policy.(dp.Forgetter); ok {
		f.Forget(rank)
	}
}

// forgetOtherIncarnations drops every host entry other than name that
// has the same API server PID.
func (a *APIServerActor) forgetOtherIncarnations(ctx actor.Context, name string, host *actor.PID) {
	for other, pid := range a.retry {
		if other != name && pid.Equal(host) {
			delete(a.retry, other)
		}
	}
	for other, pid := range a.hosts {
		if other != name && pid.Equal(host) {
			a.nodeGone(ctx, other)
		}
	}
}

// nodeGone takes a node's ranks out of balancing and moves their requests.
func (a *APIServerActor) nodeGone(ctx actor.Context, name string) {
	host := a.hosts[name]
	if host == nil {
		return
	}
	delete(a.hosts, name)
	delete(a.unanswered, name)
	// A new incarnation at the same address has the same PID: keep
	// watching it.
	if !slices.ContainsFunc(slices.Collect(maps.Values(a.hosts)), host.Equal) {
		ctx.Unwatch(host)
	}
	for _, r := range a.ranks {
		if !r.local && r.node == name {
			r.ready, r.stats = false, nil
			if n := a.move(ctx, r, "its node left"); n > 0 {
				a.cfg.Logger.Warn("a node left; moved the requests on its ranks", "node", name, "rank", r.rank, "requests", n)
			}
		}
	}
}

func (a *APIServerActor) terminated(ctx actor.Context, who *actor.PID) {
	for name, pid := range a.hosts {
		if pid.Equal(who) {
			// The connection broke, but the node may still be a member
			// (a dropped path, not a death): until gossip says it left,
			// try to subscribe again, so that its ranks come back when
			// the path does.
			a.nodeGone(ctx, name)
			a.retry[name] = pid
			a.armRetry()
			return
		}
	}
	for _, r := range a.ranks {
		if r.local && r.pid.Equal(who) && !a.stopping && !r.failed {
			// A child engine that stopped for good: the rank is gone.
			r.ready, r.stats = false, nil
			r.metrics.ready.Set(0)
			a.tellSubscribers(ctx, r)
			n := a.move(ctx, r, "its engine stopped")
			a.cfg.Logger.Error("an engine stopped; its rank is out of service", "rank", r.rank, "requests_moved", n)
			return
		}
	}
	a.subscribers = slices.DeleteFunc(a.subscribers, who.Equal)
}
