package actors

import (
	"log/slog"
	"slices"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/dpnode/dpnode/control"
	"github.com/dpnode/dpnode/dp"
	dpnodev1 "github.com/dpnode/dpnode/proto/dpnode/v1"
)

// CoordinatorConfig sets up a CoordinatorActor.
type CoordinatorConfig struct {
	// Epoch numbers this coordinator incarnation; every message it sends
	// carries it, and receivers ignore older ones.
	Epoch   uint64
	Publish dp.PublishConfig
	// ExpertParallel makes the coordinator run the waves and the group of
	// ranks that step together.
	ExpertParallel bool
	// Roster says which ranks may join the group: those the roster gives
	// out, joining or not (a rank given back stays out); the node tells
	// the coordinator of newer ones.
	Roster  control.Roster
	Metrics *Metrics
	Logger  *slog.Logger
}

// CoordinatorActor aggregates the engines' stats and publishes load
// snapshots to its subscribers: at most every Publish.MinInterval while
// loads change, and a heartbeat every Publish.Heartbeat otherwise. Between
// those it is idle: one timer, no polling.
type CoordinatorActor struct {
	cfg   CoordinatorConfig
	self  *actor.PID
	root  *actor.RootContext
	pub   *dp.Publisher
	loads map[uint32]*dpnodev1.RankLoad
	subs  []subscriber
	seq   uint64
	timer *time.Timer
	// timerAt is when the armed timer fires; zero when none is armed.
	timerAt time.Time
	// timerGen tells the armed timer's tick from one of a timer replaced
	// after it had already fired.
	timerGen uint64
	// waves and engines are the expert-parallel state: the wave, the
	// group, and where each rank's engine is.
	waves   *dp.CoordinatorWave
	engines map[int]*actor.PID
	roster  control.Roster
}

type subscriber struct {
	pid *actor.PID
	// ranks filters the snapshot; empty means all.
	ranks []uint32
}

// NewCoordinatorProducer returns the producer of a CoordinatorActor.
func NewCoordinatorProducer(cfg CoordinatorConfig) actor.Producer {
	return func() actor.Actor {
		return &CoordinatorActor{cfg: cfg, loads: make(map[uint32]*dpnodev1.RankLoad), roster: cfg.Roster}
	}
}

// Receive implements actor.Actor.
func (c *CoordinatorActor) Receive(ctx actor.Context) {
	if faultHook != nil && faultHook(ctx) {
		return
	}
	switch msg := ctx.Message().(type) {
	case *actor.Started:
		c.self, c.root = ctx.Self(), ctx.ActorSystem().Root
		c.pub = dp.NewPublisher(c.cfg.Publish)
		if c.cfg.ExpertParallel {
			c.waves, c.engines = dp.NewCoordinatorWave(c.cfg.Epoch), make(map[int]*actor.PID)
		}
		// A fresh coordinator knows nothing: its node tells everyone, and
		// they subscribe and report to it again.
		ctx.Send(ctx.Parent(), &coordinatorStarted{})
		c.tick(ctx)
	case *actor.Stopping, *actor.Restarting:
		if c.timer != nil {
			c.timer.Stop()
		}
	case *dpnodev1.SubscribeLoad:
		if ctx.Sender() == nil {
			return
		}
		c.subs = slices.DeleteFunc(c.subs, func(s subscriber) bool { return s.pid.Equal(ctx.Sender()) })
		s := subscriber{pid: ctx.Sender(), ranks: msg.Ranks}
		c.subs = append(c.subs, s)
		ctx.Send(s.pid, c.snapshot(s, false))
	case *dpnodev1.ReportStats:
		st := msg.Stats
		if st == nil {
			return // a peer's report without stats: nothing to record
		}
		if !c.knows(int(st.Rank)) {
			// Stats of a rank the roster does not give out, a forged or a
			// stale report: kept, they would grow the snapshot without bound.
			c.cfg.Logger.Debug("ignored stats of a rank the roster does not give out", "rank", st.Rank)
			return
		}
		c.loads[st.Rank] = &dpnodev1.RankLoad{
			Rank:             st.Rank,
			NumWaiting:       st.NumWaiting,
			NumRunning:       st.NumRunning,
			KvCacheUsage:     st.KvCacheUsage,
			ReportedUnixNano: time.Now().UnixNano(),
		}
		c.pub.Changed()
		c.tick(ctx)
	case *coordinatorTick:
		if msg.gen == c.timerGen {
			c.timerAt = time.Time{}
			c.tick(ctx)
		}
	case *rosterUpdate:
		c.roster = msg.roster
		for r := range c.loads {
			if !c.knows(int(r)) {
				delete(c.loads, r)
				c.pub.Changed()
			}
		}
	case *dropRanks:
		if c.waves != nil {
			if g := c.waves.Drop(msg.ranks); g != nil {
				c.cfg.Logger.Info("ranks left the cluster; the group goes on without them", "ranks", msg.ranks, "group", g.Ranks)
				c.sendGroup(ctx, *g, nil)
			}
		}
	case *dpnodev1.JoinGroup, *dpnodev1.FirstRequest, *dpnodev1.EngineStartedWave, *dpnodev1.WaveComplete, *dpnodev1.CollectiveTimeout:
		if c.waves != nil {
			c.wave(ctx, msg)
		}
	}
}

// wave carries out the coordinator's part of the wave protocol.
func (c *CoordinatorActor) wave(ctx actor.Context, msg any) {
	switch m := msg.(type) {
	case *dpnodev1.JoinGroup:
		if ctx.Sender() == nil {
			return
		}
		rank := int(m.Rank)
		if !c.admits(rank) {
			// Given back: its node is leaving, and the group went on
			// without it.
			c.cfg.Logger.Debug("a rank the roster no longer gives out asked to join the group", "rank", rank)
			return
		}
		c.engines[rank] = ctx.Sender()
		g := c.waves.Join(rank)
		c.cfg.Logger.Debug("a rank joined the expert-parallel group", "rank", rank, "group", g.Ranks, "seq", g.Seq)
		c.sendGroup(ctx, *g, nil)
	case *dpnodev1.FirstRequest:
		c.startWave(ctx, c.waves.FirstRequest(int(m.TargetRank), m.Wave), m.ArrivalUnixNano)
	case *dpnodev1.EngineStartedWave:
		c.startWave(ctx, c.waves.StartedWave(int(m.Rank), m.Wave), time.Now().UnixNano())
	case *dpnodev1.WaveComplete:
		if c.waves.WaveComplete(m.Wave) {
			c.pub.Urgent()
			c.tick(ctx)
		}
	case *dpnodev1.CollectiveTimeout:
		g := c.waves.Group()
		if m.CoordinatorEpoch != g.Epoch || m.Seq != g.Seq {
			// About a group already re-formed: the engine waits in an old
			// one (it missed the change, cut off); tell it the current.
			c.sendGroup(ctx, g, []int{int(m.Rank)})
			return
		}
		missing := make([]int, len(m.Missing))
		for i, r := range m.Missing {
			missing[i] = int(r)
		}
		if ng := c.waves.Drop(missing); ng != nil {
			c.cfg.Logger.Warn("ranks missed a collective; the group goes on without them", "missing", missing, "reported_by", m.Rank, "group", ng.Ranks)
			// The dropped ranks hear it too: if alive, they ask back in.
			c.sendGroup(ctx, *ng, append(slices.Clone(ng.Ranks), missing...))
		}
	}
}

// admits reports whether rank may join the group: any rank of a fixed
// deployment, and a rank an elastic roster gives out, joining or not.
func (c *CoordinatorActor) admits(rank int) bool {
	if !c.roster.Elastic() {
		return true
	}
	_, ok := c.roster.Holder(rank)
	return ok
}

// knows reports whether rank is one of the deployment's: below a fixed
// deployment's size, or given out by an elastic roster, joining or not.
func (c *CoordinatorActor) knows(rank int) bool {
	if !c.roster.Elastic() {
		return c.roster.Has(rank)
	}
	return c.admits(rank)
}

func (c *CoordinatorActor) startWave(ctx actor.Context, sw *dp.StartWave, trigger int64) {
	if sw == nil {
		return
	}
	msg := &dpnodev1.StartWave{CoordinatorEpoch: c.cfg.Epoch, Wave: sw.Wave, ExcludeRank: int32(sw.Exclude), TriggerUnixNano: trigger}
	for _, r := range c.waves.Group().Ranks {
		if r != sw.Exclude {
			ctx.Send(c.engines[r], msg)
		}
	}
	c.pub.Urgent()
	c.tick(ctx)
}

// sendGroup sends g to the ranks in to, or to its members when to is nil.
func (c *CoordinatorActor) sendGroup(ctx actor.Context, g dp.Group, to []int) {
	msg := &dpnodev1.GroupChanged{CoordinatorEpoch: g.Epoch, Seq: g.Seq, Wave: g.Wave}
	for _, r := range g.Ranks {
		msg.Members = append(msg.Members, &dpnodev1.GroupMember{Rank: uint32(r), ActorAddress: c.engines[r].Address})
	}
	if to == nil {
		to = g.Ranks
	}
	for _, r := range to {
		if pid := c.engines[r]; pid != nil {
			ctx.Send(pid, msg)
		}
	}
	c.pub.Changed()
	c.tick(ctx)
}

// tick publishes if a snapshot is due and arms the timer for the next.
func (c *CoordinatorActor) tick(ctx actor.Context) {
	now := time.Now()
	publish, heartbeat, next := c.pub.Due(now)
	if publish {
		c.seq++
		c.cfg.Metrics.snapshots.Inc()
		for _, s := range c.subs {
			ctx.Send(s.pid, c.snapshot(s, heartbeat))
		}
	}
	if c.timerAt.IsZero() || next.Before(c.timerAt) {
		if c.timer != nil {
			c.timer.Stop()
		}
		c.timerGen++
		self, root, tick := c.self, c.root, &coordinatorTick{gen: c.timerGen}
		c.timerAt = next
		c.timer = time.AfterFunc(next.Sub(now), func() { root.Send(self, tick) })
	}
}

func (c *CoordinatorActor) snapshot(s subscriber, heartbeat bool) *dpnodev1.LoadSnapshot {
	snap := &dpnodev1.LoadSnapshot{
		CoordinatorEpoch:  c.cfg.Epoch,
		Seq:               c.seq,
		PublishedUnixNano: time.Now().UnixNano(),
		Heartbeat:         heartbeat,
	}
	if c.waves != nil {
		snap.CurrentWave, snap.EnginesRunning = c.waves.Wave()
		for _, r := range c.waves.Group().Ranks {
			snap.GroupRanks = append(snap.GroupRanks, uint32(r))
		}
	}
	for rank, l := range c.loads {
		if len(s.ranks) == 0 || slices.Contains(s.ranks, rank) {
			snap.Ranks = append(snap.Ranks, l)
		}
	}
	slices.SortFunc(snap.Ranks, func(a, b *dpnodev1.RankLoad) int { return int(a.Rank) - int(b.Rank) })
	return snap
}
