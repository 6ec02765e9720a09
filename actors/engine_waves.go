package actors

import (
	"slices"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/dpnode/dpnode/dp"
	"github.com/dpnode/dpnode/engine"
	dpnodev1 "github.com/dpnode/dpnode/proto/dpnode/v1"
)

// engineWaves is an engine's expert-parallel part: it carries out what
// dp.WaveStepper decides, the step loop the simulator runs too. Every step
// of a wave, the engine schedules its batch (a dummy one when it has no
// work), sends its StepReport to every other rank of the group, and runs
// the batch once it holds every rank's report, for as long as the slowest
// rank's step takes.
type engineWaves struct {
	rank int
	// core is the engine, whose batches the waves decide.
	core engine.BatchCore
	// addr is this node's actor address: a group with a member elsewhere
	// steps across nodes.
	addr      string
	w         *dp.WaveStepper
	peers     map[int]*actor.PID
	crossNode bool
	// solo marks a batch run after the engine left its group: it runs
	// alone and ends no wave.
	solo bool
	// trigger is when the wave the engine is entering was asked for;
	// waveTrigger is the same for the wave it steps in, passed on in its
	// reports; began is its first step in that wave.
	trigger, waveTrigger, began time.Time
	awaitSince                  time.Time
	timer                       *time.Timer
	timerGen                    uint64
	// out is true after the engine told the API server it is out of the
	// group, and so takes no requests.
	out bool
}

// collectiveTick wakes an engine whose step's collective may be late.
type collectiveTick struct {
	gen uint64
}

// groupStatus tells an engine's supervisor that the engine left or
// rejoined the group; out of it, it cannot serve.
type groupStatus struct {
	rank  int
	epoch uint64
	in    bool
}

func newEngineWaves(rank int, addr string, core engine.BatchCore) *engineWaves {
	return &engineWaves{rank: rank, addr: addr, core: core, w: dp.NewWaveStepper(rank), peers: make(map[int]*actor.PID)}
}

// join asks the coordinator for a place in the group.
func (ew *engineWaves) join(ctx actor.Context, e *EngineActor) {
	if e.coordinator != nil {
		ctx.Request(e.coordinator, &dpnodev1.JoinGroup{Rank: uint32(ew.rank)})
	}
}

// request applies a new request's wave stamp; the request itself is in the
// scheduler already.
func (ew *engineWaves) request(ctx actor.Context, e *EngineActor, msg *dpnodev1.AddRequest) {
	_, was := ew.w.Wave()
	startOthers := ew.w.Request(msg.Wave)
	if _, now := ew.w.Wave(); now && !was {
		ew.trigger = time.Unix(0, msg.ArrivalUnixNano)
	}
	if startOthers != nil && e.coordinator != nil {
		ctx.Send(e.coordinator, &dpnodev1.EngineStartedWave{Rank: uint32(ew.rank), Wave: *startOthers})
	}
	ew.pump(ctx, e)
}

func (ew *engineWaves) receive(ctx actor.Context, e *EngineActor, msg any) {
	switch m := msg.(type) {
	case *dpnodev1.StartWave:
		if m.CoordinatorEpoch != e.coordEpoch {
			return
		}
		_, was := ew.w.Wave()
		ew.w.Start(dp.StartWave{Wave: m.Wave, Exclude: int(m.ExcludeRank)})
		if _, now := ew.w.Wave(); now && !was {
			ew.trigger = time.Unix(0, m.TriggerUnixNano)
		}
	case *dpnodev1.StepReport:
		wake, resend := ew.w.Receive(reportFromWire(m))
		if wake {
			ew.trigger = time.Time{}
			if m.WaveTriggerUnixNano != 0 {
				ew.trigger = time.Unix(0, m.WaveTriggerUnixNano)
			}
		}
		if resend != nil {
			ew.broadcast(ctx, *resend)
		}
	case *dpnodev1.GroupChanged:
		if m.CoordinatorEpoch != e.coordEpoch {
			return
		}
		ew.setGroup(ctx, e, m)
	case *collectiveTick:
		if m.gen != ew.timerGen {
			return
		}
		if missing := ew.w.Missing(time.Now(), e.cfg.CollectiveTimeout); len(missing) > 0 && e.coordinator != nil {
			wire := make([]uint32, len(missing))
			for i, r := range missing {
				wire[i] = uint32(r)
			}
			e.cfg.Logger.Warn("a step's collective is late; asking the coordinator to re-form the group without the missing ranks",
				"missing", missing, "waited", e.cfg.CollectiveTimeout)
			e.cfg.Metrics.collectiveTimeouts.Inc()
			g := ew.w.Group()
			ctx.Send(e.coordinator, &dpnodev1.CollectiveTimeout{CoordinatorEpoch: g.Epoch, Seq: g.Seq, Rank: uint32(ew.rank), Missing: wire})
		}
		ew.armTimer(ctx, e)
	}
	e.maybeStep(ctx)
}

func (ew *engineWaves) setGroup(ctx actor.Context, e *EngineActor, m *dpnodev1.GroupChanged) {
	g := dp.Group{Epoch: m.CoordinatorEpoch, Seq: m.Seq, Wave: m.Wave}
	peers := make(map[int]*actor.PID, len(m.Members))
	cross := false
	for _, mem := range m.Members {
		r := int(mem.Rank)
		g.Ranks = append(g.Ranks, r)
		peers[r] = actor.NewPID(mem.ActorAddress, engineID(r))
		cross = cross || mem.ActorAddress != ew.addr
	}
	slices.Sort(g.Ranks)
	if !g.Newer(ew.w.Group()) {
		return
	}
	wasAwaiting := ew.w.Awaiting()
	resend, excluded, startOthers := ew.w.SetGroup(g)
	ew.peers, ew.crossNode = peers, cross
	switch {
	case excluded:
		ew.stopTimer()
		if batch := ew.w.Abandon(); wasAwaiting && batch != nil {
			// The batch was scheduled: run it, alone, so that the
			// scheduler's step completes; its requests are moving away.
			ew.solo = true
			e.launch(ctx, ew.core.StepOf(batch))
		}
		if !ew.out {
			ew.out = true
			e.cfg.Logger.Warn("this rank was left out of the expert-parallel group; asking to rejoin", "group", g.Ranks)
			e.tellAPIServer(ctx, &groupStatus{rank: ew.rank, epoch: e.epoch, in: false})
		}
		ew.join(ctx, e)
	case ew.out:
		ew.out = false
		e.tellAPIServer(ctx, &groupStatus{rank: ew.rank, epoch: e.epoch, in: true})
	}
	if resend {
		ew.broadcast(ctx, ew.w.Own())
	}
	if startOthers != nil && e.coordinator != nil {
		ctx.Send(e.coordinator, &dpnodev1.EngineStartedWave{Rank: uint32(ew.rank), Wave: *startOthers})
	}
}

// pump opens the next step when the engine is in a running wave and free,
// and runs the step once every rank has reported.
func (ew *engineWaves) pump(ctx actor.Context, e *EngineActor) {
	if e.inFlight != nil {
		return
	}
	now := time.Now()
	st := ew.w.Pump(ew.core, ew.crossNode, now)
	if st.Opened {
		if ew.began.IsZero() {
			ew.began, ew.waveTrigger = now, ew.trigger
			if !ew.trigger.IsZero() {
				e.cfg.Metrics.waveStart.Observe(now.Sub(ew.trigger).Seconds())
			}
		}
		ew.awaitSince = now
		ew.broadcast(ctx, st.Own)
		ew.armTimer(ctx, e)
	}
	if st.Run == nil {
		return
	}
	ew.stopTimer()
	e.cfg.Metrics.collectiveWait.Observe(now.Sub(ew.awaitSince).Seconds())
	if st.Dummy() {
		e.cfg.Metrics.dummySteps.Inc()
	}
	if st.Run.Collective.TotalTokens > 0 {
		e.cfg.Metrics.balance.Observe(dp.BalanceRatio(st.Reports))
	}
	e.launch(ctx, ew.core.StepOf(st.Run))
}

// stepped closes a step of the wave after it ran.
func (ew *engineWaves) stepped(ctx actor.Context, e *EngineActor) {
	if ew.solo {
		ew.solo = false
		return
	}
	ended, reportComplete, startOthers := ew.w.Stepped(ew.core.HasWork())
	now := time.Now()
	if ended != nil {
		e.cfg.Metrics.waves.Inc()
		if !ew.began.IsZero() {
			e.cfg.Metrics.waveDuration.Observe(now.Sub(ew.began).Seconds())
		}
		ew.began, ew.trigger, ew.waveTrigger = time.Time{}, time.Time{}, time.Time{}
		if reportComplete && e.coordinator != nil {
			ctx.Send(e.coordinator, &dpnodev1.WaveComplete{Rank: uint32(ew.rank), Wave: *ended})
		}
	}
	if startOthers != nil {
		ew.trigger = now
		if e.coordinator != nil {
			ctx.Send(e.coordinator, &dpnodev1.EngineStartedWave{Rank: uint32(ew.rank), Wave: *startOthers})
		}
	}
}

func (ew *engineWaves) broadcast(ctx actor.Context, r dp.StepReport) {
	wire := reportToWire(r)
	if !ew.waveTrigger.IsZero() {
		wire.WaveTriggerUnixNano = ew.waveTrigger.UnixNano()
	}
	for rank, pid := range ew.peers {
		if rank != ew.rank {
			ctx.Send(pid, wire)
		}
	}
}

func (ew *engineWaves) armTimer(ctx actor.Context, e *EngineActor) {
	ew.stopTimer()
	ew.timerGen++
	self, root, tick := ctx.Self(), ctx.ActorSystem().Root, &collectiveTick{gen: ew.timerGen}
	ew.timer = time.AfterFunc(e.cfg.CollectiveTimeout, func() { root.Send(self, tick) })
}

func (ew *engineWaves) stopTimer() {
	if ew.timer != nil {
		ew.timer.Stop()
		ew.timer = nil
	}
}

func reportToWire(r dp.StepReport) *dpnodev1.StepReport {
	return &dpnodev1.StepReport{
		Rank: uint32(r.Rank), Wave: r.Wave, Step: r.Step, NumTokens: uint32(r.Tokens), HasUnfinished: r.Unfinished,
		Shape: &dpnodev1.StepShape{
			PrefillTokens: uint32(r.Shape.NumPrefillTokens), PrefillContextProduct: r.Shape.PrefillContextProduct,
			DecodeSeqs: uint32(r.Shape.NumDecodeSeqs), DecodeContextTokens: r.Shape.DecodeContextTokens,
		},
	}
}

func reportFromWire(m *dpnodev1.StepReport) dp.StepReport {
	r := dp.StepReport{Rank: int(m.Rank), Wave: m.Wave, Step: m.Step, Tokens: int(m.NumTokens), Unfinished: m.HasUnfinished}
	if s := m.Shape; s != nil {
		// A peer's counts are not trusted to be whole: the executor's cost
		// model panics on a negative one.
		r.Shape = engine.Shape{NumPrefillTokens: int(s.PrefillTokens), PrefillContextProduct: max(s.PrefillContextProduct, 0),
			NumDecodeSeqs: int(s.DecodeSeqs), DecodeContextTokens: max(s.DecodeContextTokens, 0)}
	}
	return r
}
