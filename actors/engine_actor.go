package actors

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"slices"
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
	Device string
	// NewCore opens the rank's engine each time the actor starts, so a
	// restart after a crash starts from a clean engine too. It runs off
	// the mailbox (loading a model takes a while) and must return when
	// ctx is done.
	NewCore func(ctx context.Context) (engine.Core, error)
	// ExpertParallel makes the rank step in lockstep waves with every
	// rank of the group (a MoE model with --enable-expert-parallel).
	ExpertParallel bool
	// CollectiveTimeout is how long a step waits for the other ranks'
	// reports before asking the coordinator to re-form the group without
	// the late ones.
	CollectiveTimeout time.Duration
	// Metrics are the rank's series; the engine records its waves.
	Metrics *rankMetrics
	// APIServer is the node's API server, which hears of the engine's
	// readiness, stats and group membership. The node actor supervises
	// the engine; the API server is not its parent, so that its crash
	// leaves the engine running.
	APIServer *actor.PID
	Logger    *slog.Logger
	// Ready, when set, hears that the engine has started.
	Ready func(rank int)
}

// EngineActor runs one rank: it feeds its engine (an engine.Core) the
// requests and aborts it receives and runs one step at a time off its
// mailbox. When a step completes it sends one StepOutputs per API server
// with requests in the step, and reports its stats when they change.
type EngineActor struct {
	cfg EngineConfig
	// epoch is this incarnation's number, read when the actor is made:
	// requests stamped for an earlier one were re-dispatched by the
	// supervisor and are dropped here.
	epoch uint64
	// attached is set once the API server has asked for the engine's
	// state; shared by the incarnations.
	attached *atomic.Bool

	// core is the rank's engine, nil until it has started.
	core     engine.Core
	stepCtx  context.Context
	stopStep context.CancelFunc
	// starting is the engine start in progress, begun at startedAt; the
	// actor takes requests once it has started.
	starting  *coreStarted
	startedAt time.Time
	// early holds requests that came before the engine started.
	early []earlyRequest
	// inFlight is the running step, nil when idle.
	inFlight engine.Step
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

// coreStarted reports the engine's start back to the mailbox.
type coreStarted struct {
	core engine.Core
	err  error
	// done is closed once core and err are set.
	done chan struct{}
}

// coreExited reports that an engine died on its own (its worker process
// exited).
type coreExited struct {
	core engine.Core
}

type earlyRequest struct {
	msg *dpnodev1.AddRequest
	// client is where the outputs go: a local attempt's sink, or the
	// remote API server that sent the request.
	client any
}

// StartError is why an engine could not start: a model that cannot load,
// a server that does not answer. The supervisor does not restart an engine that never
// started, since it would fail the same way.
type StartError struct {
	Rank int
	Err  error
}

func (e *StartError) Error() string {
	return fmt.Sprintf("engine rank %d could not start: %v", e.Rank, e.Err)
}

func (e *StartError) Unwrap() error { return e.Err }

// stepDone reports a finished step back to the engine's mailbox.
type stepDone struct {
	step engine.Step
	err  error
	// wall is how long the step's Run took.
	wall time.Duration
}

// NewEngineProducer returns the producer of a rank's EngineActor. epoch is
// read at every (re)start.
func NewEngineProducer(cfg EngineConfig, epoch *atomic.Uint64) actor.Producer {
	attached := new(atomic.Bool)
	return func() actor.Actor {
		return &EngineActor{cfg: cfg, epoch: epoch.Load(), attached: attached}
	}
}

// tellAPIServer sends msg to the node's API server once it has asked for
// the engine's state (see attach). The node starts its engines before
// its API server, and a message sent to an actor while it is being
// spawned races with its mailbox's setup in protoactor; what the engine
// would have said before goes in its answer to attach.
func (e *EngineActor) tellAPIServer(ctx actor.Context, msg any) {
	if e.attached.Load() {
		ctx.Send(e.cfg.APIServer, msg)
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
		return
	case *actor.Stopping, *actor.Restarting:
		e.stop()
		return
	case *coreStarted:
		e.coreStarted(ctx, msg)
		return
	case *coreExited:
		if msg.core == e.core {
			panic(fmt.Errorf("engine rank %d: the engine died: %w", e.cfg.Rank, e.core.Err()))
		}
		return
	case *attachEngine:
		e.attach(ctx)
		return
	case *setCoordinator:
		e.coordinator, e.coordEpoch, e.sentOnce = msg.pid, msg.epoch, false
		if e.core == nil {
			return
		}
		if e.inFlight == nil {
			e.reportStats(ctx, nil, nil)
		}
		if e.waves != nil {
			e.waves.join(ctx, e)
		}
		return
	}
	if e.core == nil {
		e.receiveStarting(ctx)
		return
	}
	switch msg := ctx.Message().(type) {
	case *dpnodev1.AddRequest:
		e.add(ctx, msg, senderClient(ctx))
	case *localAdd:
		e.add(ctx, msg.add, msg.sink)
	case *dpnodev1.ListRequests:
		asker := ctx.Sender()
		ctx.Respond(&dpnodev1.RequestList{Rank: uint32(e.cfg.Rank), EngineEpoch: e.epoch,
			RequestIds: e.core.IDs(func(c any) bool { return asker != nil && clientOwner(c).Equal(asker) })})
	case *dpnodev1.AbortRequests:
		e.core.Abort(msg.RequestIds...)
		if e.inFlight == nil {
			e.reportStats(ctx, nil, nil)
		}
	case *stepDone:
		e.finishStep(ctx, msg)
	case *dpnodev1.StartWave, *dpnodev1.StepReport, *dpnodev1.GroupChanged, *collectiveTick:
		if e.waves != nil {
			e.waves.receive(ctx, e, msg)
		}
	}
}

// start opens the engine off the mailbox: a model worker takes seconds to
// load its model, a server may still be starting.
func (e *EngineActor) start(ctx actor.Context) {
	e.stepCtx, e.stopStep = context.WithCancel(context.Background())
	started := &coreStarted{done: make(chan struct{})}
	e.starting, e.startedAt = started, time.Now()
	if e.cfg.Logger != nil {
		e.cfg.Logger.Info("rank starting its engine", "device", e.cfg.Device)
	}
	newCore, stepCtx, self, root := e.cfg.NewCore, e.stepCtx, ctx.Self(), ctx.ActorSystem().Root
	go func() {
		defer func() {
			if r := recover(); r != nil {
				started.core, started.err = nil, fmt.Errorf("starting the engine panicked: %v", r)
			}
			close(started.done)
			root.Send(self, started)
		}()
		core, err := newCore(stepCtx)
		if err != nil {
			// A failed start has no engine to close. What comes back
			// with the error can be a nil pointer in a non-nil interface,
			// whose Close panics; in stop that panic would leave the
			// actor half stopped, never sending Terminated, and its
			// supervisor waiting for it for good.
			core = nil
		}
		started.core, started.err = core, err
	}()
}

// stop ends the engine's step and the engine; a model worker is killed
// and waited for, so that its successor finds the device free.
func (e *EngineActor) stop() {
	if e.stopStep != nil {
		e.stopStep()
	}
	if e.waves != nil {
		e.waves.stopTimer()
	}
	closeCore(e.core)
	e.core = nil
	if s := e.starting; s != nil {
		// A start in progress: its result would reach a mailbox that no
		// longer reads. Cancelled, it ends soon; its engine is closed
		// here.
		<-s.done
		closeCore(s.core)
		e.starting = nil
	}
}

// readied logs the engine's start and exports its KV cache's
// configuration.
func (e *EngineActor) readied() {
	cc := CacheConfig{}
	attrs := []any{"device", e.cfg.Device, "took", time.Since(e.startedAt).Round(time.Millisecond)}
	if c, ok := e.core.(engine.Configured); ok {
		cfg := c.Config()
		cc = CacheConfig{BlockSize: cfg.BlockSize, EnablePrefixCaching: cfg.EnablePrefixCaching, NumGPUBlocks: cfg.NumBlocks}
		attrs = append(attrs, "kv_cache_tokens", cfg.KVTokens(), "max_num_seqs", cfg.MaxNumSeqs, "max_model_len", cfg.MaxModelLen)
	}
	e.cfg.Metrics.setCacheConfig(cc)
	if e.cfg.Logger != nil {
		e.cfg.Logger.Info("rank ready", attrs...)
	}
	if e.cfg.Ready != nil {
		e.cfg.Ready(e.cfg.Rank)
	}
}

func closeCore(c engine.Core) {
	if c != nil {
		_ = c.Close()
	}
}

func (e *EngineActor) coreStarted(ctx actor.Context, msg *coreStarted) {
	if msg != e.starting || e.stepCtx.Err() != nil {
		// The start of an earlier incarnation, or of one that stopped,
		// which closed it (closing twice is harmless).
		closeCore(msg.core)
		return
	}
	e.starting = nil
	if msg.err != nil {
		panic(&StartError{Rank: e.cfg.Rank, Err: msg.err})
	}
	var waved engine.BatchCore
	if e.cfg.ExpertParallel {
		bc, ok := msg.core.(engine.BatchCore)
		if !ok || !msg.core.Capabilities().ExpertParallel {
			closeCore(msg.core)
			panic(&StartError{Rank: e.cfg.Rank, Err: fmt.Errorf("the engine cannot step in expert-parallel waves")})
		}
		waved = bc
	}
	e.core = msg.core
	e.readied()
	if done := e.core.Done(); done != nil {
		core, stepCtx, self, root := e.core, e.stepCtx, ctx.Self(), ctx.ActorSystem().Root
		go func() {
			select {
			case <-done:
				root.Send(self, &coreExited{core: core})
			case <-stepCtx.Done():
			}
		}()
	}
	if waved != nil {
		e.waves = newEngineWaves(e.cfg.Rank, ctx.Self().Address, waved)
	}
	e.tellAPIServer(ctx, &dpnodev1.EngineReady{Rank: uint32(e.cfg.Rank), EngineEpoch: e.epoch})
	e.reportStats(ctx, nil, nil)
	if e.coordinator != nil && e.waves != nil {
		e.waves.join(ctx, e)
	}
	early := e.early
	e.early = nil
	for _, r := range early {
		e.add(ctx, r.msg, r.client)
	}
}

// attach tells an API server that has just started (the node's first, or
// one restarted after a crash) what its last incarnation knew of the
// engine: that it is ready, whether it is out of its expert-parallel
// group, and its stats. An engine still starting says it is ready once it
// is.
func (e *EngineActor) attach(ctx actor.Context) {
	e.attached.Store(true)
	if e.core == nil {
		return
	}
	e.tellAPIServer(ctx, &dpnodev1.EngineReady{Rank: uint32(e.cfg.Rank), EngineEpoch: e.epoch})
	if e.waves != nil && e.waves.out {
		e.tellAPIServer(ctx, &groupStatus{rank: e.cfg.Rank, epoch: e.epoch, in: false})
	}
	e.sentOnce = false
	if e.inFlight == nil {
		e.reportStats(ctx, nil, nil)
	}
}

// receiveStarting handles what comes before the engine has started:
// requests wait for it, and nothing else concerns an engine with no
// requests.
func (e *EngineActor) receiveStarting(ctx actor.Context) {
	switch msg := ctx.Message().(type) {
	case *dpnodev1.AddRequest:
		if msg.EngineEpoch == e.epoch {
			e.early = append(e.early, earlyRequest{msg: msg, client: senderClient(ctx)})
		}
	case *localAdd:
		if msg.add.EngineEpoch == e.epoch {
			e.early = append(e.early, earlyRequest{msg: msg.add, client: msg.sink})
		}
	case *dpnodev1.ListRequests:
		ids := []string{}
		for _, r := range e.early {
			if owner := clientOwner(r.client); owner != nil && owner.Equal(ctx.Sender()) {
				ids = append(ids, r.msg.RequestId)
			}
		}
		ctx.Respond(&dpnodev1.RequestList{Rank: uint32(e.cfg.Rank), EngineEpoch: e.epoch, RequestIds: ids})
	case *dpnodev1.AbortRequests:
		e.early = slices.DeleteFunc(e.early, func(r earlyRequest) bool { return slices.Contains(msg.RequestIds, r.msg.RequestId) })
	}
}

// senderClient is the client of a request sent by a remote API server:
// its PID, or nil when it was sent without one.
func senderClient(ctx actor.Context) any {
	if sender := ctx.Sender(); sender != nil {
		return sender
	}
	return nil
}

// add takes a request; client is where its outputs go: a local attempt's
// sink, or the PID of the remote API server that sent it.
func (e *EngineActor) add(ctx actor.Context, msg *dpnodev1.AddRequest, client any) {
	// A request sent without a sender (Send, not Request) has no client to
	// stream its outputs, or an error, to.
	if msg.EngineEpoch != e.epoch || client == nil {
		return
	}
	nr := engine.NewRequest{
		ID:        msg.RequestId,
		Prompt:    msg.PromptTokenIds,
		Output:    msg.OutputTokenIds,
		Sampling:  samplingFromWire(msg.Sampling),
		Arrival:   time.Unix(0, msg.ArrivalUnixNano),
		Client:    client,
		Attempt:   msg.Attempt,
		CacheSalt: msg.CacheSalt,
	}
	// Hashes are trusted only from this process: hashes that do not name
	// their tokens would serve one prompt another's cached KV.
	if owner := clientOwner(client); owner.Address == ctx.Self().Address {
		nr.BlockHashes = unpackHashes(msg.PromptBlockHashes)
	}
	if err := e.core.Add(nr); err != nil {
		if s, ok := client.(*sink); ok {
			var rep localOutputs
			if _, ended := s.deliver(&engine.Output{ID: msg.RequestId, Finish: engine.FinishedError}, err.Error(), time.Now()); ended {
				rep.refused = append(rep.refused, s)
			}
			e.tellLocal(ctx, &rep)
			return
		}
		ctx.Send(client.(*actor.PID), &dpnodev1.StepOutputs{
			Rank:        uint32(e.cfg.Rank),
			EngineEpoch: e.epoch,
			Outputs: []*dpnodev1.RequestOutput{{
				RequestId:    msg.RequestId,
				FinishReason: dpnodev1.FinishReason_FINISH_REASON_ERROR,
				Error:        err.Error(),
				Attempt:      msg.Attempt,
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
	if e.inFlight != nil || !e.core.HasWork() {
		return
	}
	e.launch(ctx, e.core.Next())
}

// launch runs a step on its own goroutine; it reports back as a stepDone
// message.
func (e *EngineActor) launch(ctx actor.Context, step engine.Step) {
	e.inFlight = step
	stepCtx, self, root := e.stepCtx, ctx.Self(), ctx.ActorSystem().Root
	go func() {
		done := &stepDone{step: step}
		start := time.Now()
		defer func() {
			if r := recover(); r != nil {
				done.err = fmt.Errorf("the engine's step panicked: %v", r)
			}
			done.wall = time.Since(start)
			root.Send(self, done)
		}()
		done.err = step.Run(stepCtx)
	}()
}

func (e *EngineActor) finishStep(ctx actor.Context, msg *stepDone) {
	if msg.step != e.inFlight {
		// A step of an earlier incarnation, finishing after a restart.
		return
	}
	e.inFlight = nil
	if msg.err != nil {
		if e.stepCtx.Err() != nil {
			return
		}
		// A failed step is a failed engine (a GPU fault, a server gone):
		// crash, and let the supervisor restart the engine and move its
		// requests.
		panic(fmt.Errorf("engine rank %d: %w", e.cfg.Rank, msg.err))
	}
	begin := time.Now()
	if res, ok := msg.step.Result(); ok {
		e.cfg.Metrics.stepTime.Observe(msg.wall.Seconds())
		e.cfg.Metrics.executorTime.Add(res.Duration.Seconds())
		e.cfg.Metrics.observeStep(msg.wall, res)
		e.cfg.Metrics.iterationTokens.Observe(float64(res.ScheduledTokens))
	}
	outs := msg.step.Finish(nil)
	if e.waves != nil {
		// Before the outputs, so that the stats sent with them tell a
		// wave's end.
		e.waves.stepped(ctx, e)
	}
	e.sendOutputs(ctx, outs)
	e.maybeStep(ctx)
	e.cfg.Metrics.phases[phaseEngine].Add(time.Since(begin).Seconds())
}

// sendOutputs delivers a step's outputs: a local attempt's straight to its
// stream, a remote API server's in one message per API server. The
// engine's stats go with them when they changed.
func (e *EngineActor) sendOutputs(ctx actor.Context, outs []engine.Output) {
	clients := e.clientsBuf[:0]
	var local *localOutputs
	var slab []dpnodev1.RequestOutput
	now := time.Now()
	for i := range outs {
		o := &outs[i]
		if s, ok := o.Client.(*sink); ok {
			prefilled, ended := s.deliver(o, o.Error, now)
			if prefilled || ended {
				if local == nil {
					local = &localOutputs{}
				}
				if prefilled {
					local.prefilled = append(local.prefilled, s)
				}
				if ended {
					local.ended = append(local.ended, s)
				}
			}
			continue
		}
		pid := o.Client.(*actor.PID)
		k := 0
		for k < len(clients) && !clients[k].pid.Equal(pid) {
			k++
		}
		if k == len(clients) {
			// Room for every output left: one allocation when, as is
			// usual, one API server sent them all.
			clients = append(clients, clientOutputs{pid: pid, outputs: make([]*dpnodev1.RequestOutput, 0, len(outs)-i)})
		}
		if len(slab) == 0 {
			// One allocation for the step's remote outputs, not one
			// each: a step of a busy engine has hundreds.
			slab = make([]dpnodev1.RequestOutput, len(outs)-i)
		}
		ro := &slab[0]
		slab = slab[1:]
		ro.RequestId, ro.NewTokenIds, ro.FinishReason = o.ID, o.NewTokens, finishToWire(o.Finish)
		ro.NumCachedTokens, ro.Attempt, ro.Error, ro.QueuedNs, ro.Refused = uint32(o.NumCachedTokens), o.Attempt, o.Error, int64(o.Queued), o.Refused
		ro.Logprobs, ro.PromptLogprobs = logprobsToWire(o.Logprobs), logprobsToWire(o.PromptLogprobs)
		clients[k].outputs = append(clients[k].outputs, ro)
	}
	e.reportStats(ctx, clients, local)
	for i := range clients {
		clients[i] = clientOutputs{}
	}
	e.clientsBuf = clients[:0]
}

// tellLocal sends the node's API server what it needs of the outputs the
// engine delivered itself.
func (e *EngineActor) tellLocal(ctx actor.Context, o *localOutputs) {
	o.rank, o.epoch = e.cfg.Rank, e.epoch
	ctx.Send(e.cfg.APIServer, o)
}

// reportStats sends the step's outputs, with the engine's stats attached
// when they changed; the node's API server gets changed stats even when it
// had no outputs in the step, and so does the coordinator. local is what
// the node's API server needs of the outputs delivered to local attempts.
func (e *EngineActor) reportStats(ctx actor.Context, clients []clientOutputs, local *localOutputs) {
	st := e.core.Stats()
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
			ComputedTokens:     st.ComputedTokens,
		}
		if e.waves != nil {
			wire.Wave, wire.WaveRunning = e.waves.w.Wave()
			e.sentWave, e.sentRunning = wire.Wave, wire.WaveRunning
		}
	}
	apiTold := false
	for _, c := range clients {
		ctx.Send(c.pid, &dpnodev1.StepOutputs{
			Rank:        uint32(e.cfg.Rank),
			EngineEpoch: e.epoch,
			Step:        st.Steps,
			Outputs:     c.outputs,
			Stats:       wire,
		})
		apiTold = apiTold || c.pid.Equal(e.cfg.APIServer)
	}
	if local != nil {
		if !apiTold {
			local.stats = wire
			apiTold = true
		}
		// The API server sent the local attempts: it is attached.
		e.tellLocal(ctx, local)
	}
	if wire == nil {
		return
	}
	if !apiTold {
		e.tellAPIServer(ctx, wire)
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

// packHashes and unpackHashes carry block hashes in AddRequest's
// prompt_block_hashes; a length that is not a whole number of hashes
// unpacks to none.
func packHashes(hs []engine.BlockHash) []byte {
	b := make([]byte, 0, len(hs)*len(engine.BlockHash{}))
	for _, h := range hs {
		b = append(b, h[:]...)
	}
	return b
}

func unpackHashes(b []byte) []engine.BlockHash {
	size := len(engine.BlockHash{})
	if len(b) == 0 || len(b)%size != 0 {
		return nil
	}
	hs := make([]engine.BlockHash, len(b)/size)
	for i := range hs {
		copy(hs[i][:], b[i*size:])
	}
	return hs
}
