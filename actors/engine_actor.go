package actors

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/dpnode/dpnode/engine"
	dpnodev1 "github.com/dpnode/dpnode/proto/dpnode/v1"
)

// EngineConfig is what one rank's engine needs.
type EngineConfig struct {
	Rank int
	// Device names the GPU the rank runs on, for views and logs.
	Device    string
	Scheduler engine.SchedulerConfig
	// NewExecutor builds the rank's executor each time the engine starts,
	// so a restart after a crash starts from a clean executor too.
	NewExecutor func() (engine.Executor, error)
	// ExpertParallel makes the rank step in lockstep waves with every
	// rank of the group (a MoE model with --enable-expert-parallel).
	ExpertParallel bool
	// CollectiveTimeout is how long a step waits for the other ranks'
	// reports before asking the coordinator to re-form the group without
	// the late ones.
	CollectiveTimeout time.Duration
	// Metrics are the rank's series; the engine records its waves.
	Metrics *rankMetrics
	Logger  *slog.Logger
}

// EngineActor runs one rank: it feeds the scheduler the requests and
// aborts it receives and runs one step at a time off its mailbox. When a
// step completes it sends one StepOutputs per API server with requests in
// the step, and reports its stats when they change.
type EngineActor struct {
	cfg EngineConfig
	// epoch is this incarnation's number, read when the actor is made:
	// requests stamped for an earlier one were re-dispatched by the
	// supervisor and are dropped here.
	epoch uint64

	sched    *engine.Scheduler
	exec     engine.Executor
	stepCtx  context.Context
	stopStep context.CancelFunc
	// inFlight is the batch of the running step, nil when idle.
	inFlight *engine.Batch
	// coordinator receives the stats when they change; nil while no
	// coordinator runs. The supervisor sets it, and again when it moves.
	coordinator *actor.PID
	coordEpoch  uint64
	// lastSent holds the stats last reported, to send only changes.
	lastSent   engine.Stats
	sentOnce   bool
	clientsBuf []clientOutputs
	// waves is the expert-parallel state; nil without expert parallelism.
	waves *engineWaves
	// sentWave and sentRunning are the wave state last reported.
	sentWave    uint64
	sentRunning bool
}

// setCoordinator tells an engine where to report its stats (and, with
// expert parallelism, which coordinator's waves and groups to follow). The
// engine reports its full stats at once, which is how a new coordinator
// rebuilds its state.
type setCoordinator struct {
	pid   *actor.PID
	epoch uint64
}

type clientOutputs struct {
	pid     *actor.PID
	outputs []*dpnodev1.RequestOutput
}

// stepDone reports a finished step back to the engine's mailbox.
type stepDone struct {
	batch *engine.Batch
	res   engine.StepResult
	err   error
}

// NewEngineProducer returns the producer of a rank's EngineActor. epoch is
// read at every (re)start.
func NewEngineProducer(cfg EngineConfig, epoch *atomic.Uint64) actor.Producer {
	return func() actor.Actor {
		return &EngineActor{cfg: cfg, epoch: epoch.Load()}
	}
}

// Receive implements actor.Actor.
func (e *EngineActor) Receive(ctx actor.Context) {
	if faultHook != nil && faultHook(ctx) {
		return
	}
	switch msg := ctx.Message().(type) {
	case *actor.Started:
		e.start(ctx)
	case *actor.Stopping, *actor.Restarting:
		if e.stopStep != nil {
			e.stopStep()
		}
		if e.waves != nil {
			e.waves.stopTimer()
		}
	case *dpnodev1.AddRequest:
		e.add(ctx, msg)
	case *dpnodev1.ListRequests:
		asker := ctx.Sender()
		ctx.Respond(&dpnodev1.RequestList{Rank: uint32(e.cfg.Rank), EngineEpoch: e.epoch,
			RequestIds: e.sched.IDs(func(c any) bool { return asker != nil && c.(*actor.PID).Equal(asker) })})
	case *dpnodev1.AbortRequests:
		e.sched.Abort(msg.RequestIds...)
		if e.inFlight == nil {
			e.reportStats(ctx, nil)
		}
	case *stepDone:
		e.finishStep(ctx, msg)
	case *setCoordinator:
		e.coordinator, e.coordEpoch, e.sentOnce = msg.pid, msg.epoch, false
		if e.inFlight == nil {
			e.reportStats(ctx, nil)
		}
		if e.waves != nil {
			e.waves.join(ctx, e)
		}
	case *dpnodev1.StartWave, *dpnodev1.StepReport, *dpnodev1.GroupChanged, *collectiveTick:
		if e.waves != nil {
			e.waves.receive(ctx, e, msg)
		}
	}
}

func (e *EngineActor) start(ctx actor.Context) {
	sched, err := engine.NewScheduler(e.cfg.Scheduler)
	if err != nil {
		panic(fmt.Errorf("engine rank %d: %w", e.cfg.Rank, err))
	}
	exec, err := e.cfg.NewExecutor()
	if err != nil {
		panic(fmt.Errorf("engine rank %d: starting the executor: %w", e.cfg.Rank, err))
	}
	e.sched, e.exec = sched, exec
	e.stepCtx, e.stopStep = context.WithCancel(context.Background())
	if e.cfg.ExpertParallel {
		e.waves = newEngineWaves(e.cfg.Rank, ctx.Self().Address)
	}
	ctx.Send(ctx.Parent(), &dpnodev1.EngineReady{Rank: uint32(e.cfg.Rank), EngineEpoch: e.epoch})
	e.reportStats(ctx, nil)
}

func (e *EngineActor) add(ctx actor.Context, msg *dpnodev1.AddRequest) {
	if msg.EngineEpoch != e.epoch {
		return
	}
	err := e.sched.Add(engine.NewRequest{
		ID:       msg.RequestId,
		Prompt:   msg.PromptTokenIds,
		Output:   msg.OutputTokenIds,
		Sampling: samplingFromWire(msg.Sampling),
		Arrival:  time.Unix(0, msg.ArrivalUnixNano),
		Client:   ctx.Sender(),
	})
	if err != nil {
		ctx.Send(ctx.Sender(), &dpnodev1.StepOutputs{
			Rank:        uint32(e.cfg.Rank),
			EngineEpoch: e.epoch,
			Outputs: []*dpnodev1.RequestOutput{{
				RequestId:    msg.RequestId,
				FinishReason: dpnodev1.FinishReason_FINISH_REASON_ERROR,
				Error:        err.Error(),
			}},
		})
		return
	}
	if e.waves != nil {
		e.waves.request(ctx, e, msg)
		return
	}
	e.maybeStep(ctx)
}

// maybeStep starts a step when the engine is idle and has work; with
// expert parallelism the wave decides.
func (e *EngineActor) maybeStep(ctx actor.Context) {
	if e.waves != nil {
		e.waves.pump(ctx, e)
		return
	}
	if e.inFlight != nil || !e.sched.HasWork() {
		return
	}
	e.launch(ctx, e.sched.Schedule())
}

// launch runs a step on its own goroutine; it reports back as a stepDone
// message.
func (e *EngineActor) launch(ctx actor.Context, batch *engine.Batch) {
	e.inFlight = batch
	exec, stepCtx, self, root := e.exec, e.stepCtx, ctx.Self(), ctx.ActorSystem().Root
	go func() {
		done := &stepDone{batch: batch}
		defer func() {
			if r := recover(); r != nil {
				done.err = fmt.Errorf("executor panicked: %v", r)
			}
			root.Send(self, done)
		}()
		done.res, done.err = exec.Execute(stepCtx, batch)
	}()
}

func (e *EngineActor) finishStep(ctx actor.Context, msg *stepDone) {
	if msg.batch != e.inFlight {
		// A step of an earlier incarnation, finishing after a restart.
		return
	}
	e.inFlight = nil
	if msg.err != nil {
		if e.stepCtx.Err() != nil {
			return
		}
		// An executor failure is a GPU failure: crash, and let the
		// supervisor restart the engine and move its requests.
		panic(fmt.Errorf("engine rank %d: step %d failed: %w", e.cfg.Rank, msg.batch.Step, msg.err))
	}
	outs := e.sched.Update(msg.batch, msg.res)
	if e.waves != nil {
		// Before the outputs, so that the stats sent with them tell a
		// wave's end.
		e.waves.stepped(ctx, e, msg.batch)
	}
	e.sendOutputs(ctx, outs)
	e.maybeStep(ctx)
}

// sendOutputs sends a step's outputs, one message per API server, with the
// engine's stats when they changed.
func (e *EngineActor) sendOutputs(ctx actor.Context, outs []engine.Output) {
	clients := e.clientsBuf[:0]
	for i := range outs {
		o := &outs[i]
		pid := o.Client.(*actor.PID)
		k := 0
		for k < len(clients) && !clients[k].pid.Equal(pid) {
			k++
		}
		if k == len(clients) {
			clients = append(clients, clientOutputs{pid: pid})
		}
		clients[k].outputs = append(clients[k].outputs, &dpnodev1.RequestOutput{
			RequestId:       o.ID,
			NewTokenIds:     o.NewTokens,
			FinishReason:    o.Finish,
			NumCachedTokens: uint32(o.NumCachedTokens),
		})
	}
	e.reportStats(ctx, clients)
	for i := range clients {
		clients[i] = clientOutputs{}
	}
	e.clientsBuf = clients[:0]
}

// reportStats sends the step's outputs, with the engine's stats attached
// when they changed; the parent gets changed stats even when it had no
// outputs in the step, and so does the coordinator.
func (e *EngineActor) reportStats(ctx actor.Context, clients []clientOutputs) {
	st := e.sched.Stats()
	var wire *dpnodev1.EngineStats
	if !e.sentOnce || statsChanged(e.lastSent, st) || e.waveChanged() {
		e.lastSent, e.sentOnce = st, true
		wire = &dpnodev1.EngineStats{
			Rank:               uint32(e.cfg.Rank),
			EngineEpoch:        e.epoch,
			NumWaiting:         uint32(st.NumWaiting),
			NumRunning:         uint32(st.NumRunning),
			KvCacheUsage:       float32(st.KVUsage),
			PrefixCacheQueries: st.PrefixQueries,
			PrefixCacheHits:    st.PrefixHits,
			NumPreemptions:     st.NumPreemptions,
			Step:               st.Steps,
		}
		if e.waves != nil {
			wire.Wave, wire.WaveRunning = e.waves.w.Wave()
			e.sentWave, e.sentRunning = wire.Wave, wire.WaveRunning
		}
	}
	parentTold := false
	for _, c := range clients {
		ctx.Send(c.pid, &dpnodev1.StepOutputs{
			Rank:        uint32(e.cfg.Rank),
			EngineEpoch: e.epoch,
			Step:        st.Steps,
			Outputs:     c.outputs,
			Stats:       wire,
		})
		parentTold = parentTold || c.pid.Equal(ctx.Parent())
	}
	if wire == nil {
		return
	}
	if !parentTold {
		ctx.Send(ctx.Parent(), wire)
	}
	if e.coordinator != nil {
		ctx.Send(e.coordinator, &dpnodev1.ReportStats{Stats: wire})
	}
}

// statsChanged says whether stats moved enough to report: any change in
// the queue counts, or a point of KV usage. Step and cache counters alone
// change every step and are carried along when something else moves.
func statsChanged(a, b engine.Stats) bool {
	return a.NumWaiting != b.NumWaiting || a.NumRunning != b.NumRunning ||
		math.Abs(a.KVUsage-b.KVUsage) >= 0.01 || a.NumPreemptions != b.NumPreemptions
}

// waveChanged says whether the engine's wave moved since it last reported.
func (e *EngineActor) waveChanged() bool {
	if e.waves == nil {
		return false
	}
	w, running := e.waves.w.Wave()
	return w != e.sentWave || running != e.sentRunning
}

func samplingFromWire(s *dpnodev1.SamplingParams) engine.SamplingParams {
	if s == nil {
		return engine.SamplingParams{}
	}
	return engine.SamplingParams{
		MaxTokens:    int(s.MaxTokens),
		MinTokens:    int(s.MinTokens),
		Temperature:  s.Temperature,
		TopP:         s.TopP,
		Seed:         s.Seed,
		IgnoreEOS:    s.IgnoreEos,
		StopTokenIDs: s.StopTokenIds,
	}
}

func samplingToWire(s engine.SamplingParams) *dpnodev1.SamplingParams {
	return &dpnodev1.SamplingParams{
		MaxTokens:    uint32(s.MaxTokens),
		MinTokens:    uint32(s.MinTokens),
		Temperature:  s.Temperature,
		TopP:         s.TopP,
		Seed:         s.Seed,
		IgnoreEos:    s.IgnoreEOS,
		StopTokenIds: s.StopTokenIDs,
	}
}
