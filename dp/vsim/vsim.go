// Package vsim simulates a data-parallel deployment in virtual time. Every
// rank runs the real scheduler (continuous batching, chunked prefill, the
// block KV cache with prefix caching, preemption), its steps take what the
// simulated executor's cost model says, the real balancing policy places
// each request, and with expert parallelism the real wave state machines
// of package dp keep the ranks in lockstep. Nothing sleeps: an event queue
// jumps from one step's end to the next arrival, so hundreds of ranks and
// minutes of traffic take seconds.
//
// Requests stream in: a Source hands over each one when the simulation
// reaches it, and a Recorder takes each outcome and inter-token gap as it
// happens, so that memory grows with the requests in flight, not with the
// run. Run is the small-run convenience that keeps them all.
//
// What it leaves out: the network (messages arrive at once, so the live
// policy sees each step's stats as the step ends and the snapshot policy
// sees them at its snapshot interval), failures, and client-side costs.
package vsim

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/dpnode/dpnode/dp"
	"github.com/dpnode/dpnode/engine"
	"github.com/dpnode/dpnode/engine/sim"
)

// Request is one request of a simulated workload.
type Request struct {
	// Arrival is when the request arrives, from the start; ignored in a
	// closed loop.
	Arrival time.Duration
	Prompt  []uint32
	// Blocks, when set, are the hashes of the prompt's full blocks,
	// engine.PrefixHashes(Prompt, the scheduler's block size, ""): hashing
	// is the costliest part of placing a request, and a caller can do it
	// ahead, elsewhere. Nil: the simulation hashes them.
	Blocks []engine.BlockHash
	// PromptHash, when not 0, is engine.PromptHash(Prompt, nil), computed
	// ahead as Blocks may be.
	PromptHash uint64
	// MaxTokens is the output length: the request ignores EOS.
	MaxTokens int
}

// Source hands over a workload's requests one at a time, in order; ok is
// false past the last. In an open loop their arrivals must not go back in
// time. Stream calls it on its own goroutine, about when the simulation
// reaches each request, and keeps each request only while it is in
// flight.
type Source func() (req Request, ok bool)

// Recorder takes a run's measurements as they happen. Stream calls it on
// its own goroutine, one call at a time.
type Recorder interface {
	// Gap is the time between two consecutive tokens of a request.
	Gap(d time.Duration)
	// Ended is the outcome of request i (counted from 0 in the order the
	// source handed them over), once it has ended or failed.
	Ended(i int, o Outcome)
}

// Config describes the simulated deployment.
type Config struct {
	// Ranks is the number of data-parallel ranks, one engine each.
	Ranks   int
	Profile *sim.Profile
	// Scheduler configures every engine; zero means the profile's.
	Scheduler engine.SchedulerConfig
	// Policy places requests; one API server balances over all ranks.
	Policy dp.Policy
	// ExpertParallel steps the ranks in lockstep waves (a MoE profile).
	ExpertParallel bool
	// RanksPerNode prices the all-to-all as crossing nodes when the group
	// spans more than one node; 0 means all ranks share a node.
	RanksPerNode int
	// SnapshotInterval is how often the coordinator publishes the ranks'
	// loads (what the snapshot policy sees); 0 means 100 ms.
	SnapshotInterval time.Duration
	// Concurrency > 0 runs a closed loop: that many clients, each sending
	// its next request when the previous one ends; arrivals are ignored.
	Concurrency int
	// Context, when set, stops the run when it is done (Ctrl-C on a run
	// of minutes); the run then returns its error.
	Context context.Context
}

// Outcome is how one request went. Times are from the start.
type Outcome struct {
	Rank                int
	Arrival, First, End time.Duration
	PromptTokens        int
	Tokens              int
	CachedTokens        int
	Err                 error
}

// RankResult is one rank's share of the run.
type RankResult struct {
	Served     int
	Steps      int
	DummySteps int
	// Busy is the virtual time the rank spent in steps.
	Busy time.Duration
	// Preemptions counts requests the rank preempted for KV blocks.
	Preemptions uint64
}

// Result is a run's outcome.
type Result struct {
	// Requests and ITL, every gap between two consecutive tokens of a
	// request, are kept by Run only; Stream hands them to its Recorder.
	Requests []Outcome
	ITL      []time.Duration
	// Makespan is the virtual time from the start to the last request's
	// end.
	Makespan time.Duration
	Ranks    []RankResult
	// Waves counts the waves run (expert parallelism only);
	// BalanceRatioMean is the mean, over steps that computed tokens, of
	// mean over max tokens per rank.
	Waves            int
	BalanceRatioMean float64
	// Events counts the events the simulation processed.
	Events int
}

// DummyShare is the share of rank-steps that were dummy steps.
func (r *Result) DummyShare() float64 {
	steps, dummy := 0, 0
	for _, rr := range r.Ranks {
		steps += rr.Steps
		dummy += rr.DummySteps
	}
	if steps == 0 {
		return 0
	}
	return float64(dummy) / float64(steps)
}

// ErrNoRank is returned when the policy finds no rank for a request.
var ErrNoRank = errors.New("vsim: the policy picked no rank")

type eventKind int

const (
	arrive eventKind = iota
	stepDone
	snapshot
)

type event struct {
	at   time.Duration
	seq  uint64
	kind eventKind
	// rank for stepDone; the flight's slot for arrive in a closed loop.
	rank, slot int
}

func (e *event) before(o *event) bool {
	return e.at < o.at || (e.at == o.at && e.seq < o.seq)
}

// events is a binary min-heap of events by time, then by the order they
// were pushed; each event's place is unique, so the order they come out in
// does not depend on how the heap is built.
type events []event

func (q *events) push(e event) {
	*q = append(*q, e)
	h := *q
	i := len(h) - 1
	for i > 0 {
		p := (i - 1) / 2
		if !h[i].before(&h[p]) {
			break
		}
		h[i], h[p] = h[p], h[i]
		i = p
	}
}

func (q *events) pop() event {
	h := *q
	top := h[0]
	n := len(h) - 1
	h[0] = h[n]
	h[n] = event{}
	h = h[:n]
	for i := 0; ; {
		least, l, r := i, 2*i+1, 2*i+2
		if l < n && h[l].before(&h[least]) {
			least = l
		}
		if r < n && h[r].before(&h[least]) {
			least = r
		}
		if least == i {
			break
		}
		h[i], h[least] = h[least], h[i]
		i = least
	}
	*q = h
	return top
}

// flight is a request from when the source hands it over to its end, in
// a slot; what each of its tokens updates is the progress in the same
// slot, which the engine carries as the request's Client.
type flight struct {
	// i counts the request in the order the source handed it over; req
	// is the request until it arrives.
	i   int
	req Request
	out Outcome
}

// progress is what each token of a request in flight reads and writes,
// apart from the rest of its flight: a step comes back to a request a
// whole round of steps later, and the progress of every request in
// flight, a few hundred kilobytes allocated one after another, is far
// more often still in the processor's cache than the flights would be.
type progress struct {
	slot int
	// lastToken is when the request's last token came, first when its
	// first did.
	lastToken, first time.Duration
	tokens, cached   int
	// prefill is the prompt tokens the rank was expected to compute.
	prefill                int
	firstSeen, cachedKnown bool
}

type rank struct {
	sched *engine.Scheduler
	busy  bool
	// batch is the step in flight; without expert parallelism, step is
	// the one batch it always is.
	batch *engine.Batch
	step  engine.Batch
	res   engine.StepResult
	stats engine.Stats
	// acct is the API server's count of the rank's requests, as the
	// runtime's keeps it.
	acct dp.Account
	// snap is the rank's load in the last snapshot.
	snap engine.Stats
	// wave is the rank's step loop with expert parallelism, the engine
	// actor's.
	wave *dp.WaveStepper
}

type simulation struct {
	cfg  Config
	src  Source
	rec  Recorder
	exec *sim.Executor
	// ranks, and loads[i] the policy's view of ranks[i], kept up to date
	// as the rank changes rather than built anew for each arrival.
	ranks   []*rank
	loads   []dp.RankLoad
	q       events
	seq     uint64
	now     time.Duration
	start   time.Time
	out     *Result
	snapSeq uint64
	dirty   bool
	// flights and progs are the requests in flight by slot, and free
	// the slots of those that ended. ahead is the slot of the source's
	// next request, not yet sent; -1 past the last. issued counts the
	// requests sent, open those not yet ended.
	flights      []flight
	progs        []*progress
	free         []int
	ahead        int
	issued, open int
	// outs is the slice every step's outputs go to.
	outs     []engine.Output
	coord    *dp.CoordinatorWave
	frontend dp.FrontendWave
	balanced int
	// work lists ranks whose state may let them step.
	work []int
}

// Run simulates reqs on the deployment cfg describes, in any order of
// arrival, and keeps every outcome and inter-token gap in the result.
func Run(cfg Config, reqs []Request) (*Result, error) {
	// Arrivals in time order, ties in the order given, as Stream takes
	// them.
	order := make([]int, len(reqs))
	for i := range order {
		order[i] = i
	}
	if cfg.Concurrency == 0 {
		slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(reqs[a].Arrival, reqs[b].Arrival) })
	}
	next := 0
	src := func() (Request, bool) {
		if next == len(order) {
			return Request{}, false
		}
		next++
		return reqs[order[next-1]], true
	}
	keep := &keeper{order: order, requests: make([]Outcome, len(reqs)), itl: make([]time.Duration, 0, gaps(reqs))}
	res, err := Stream(cfg, src, keep)
	if err != nil {
		return nil, err
	}
	res.Requests, res.ITL = keep.requests, keep.itl
	return res, nil
}

var _ Recorder = (*keeper)(nil)

// keeper is Run's recorder: it keeps everything.
type keeper struct {
	order    []int
	requests []Outcome
	itl      []time.Duration
}

func (k *keeper) Gap(d time.Duration)    { k.itl = append(k.itl, d) }
func (k *keeper) Ended(i int, o Outcome) { k.requests[k.order[i]] = o }

// gaps is how many inter-token gaps reqs will have at most.
func gaps(reqs []Request) int {
	n := 0
	for _, r := range reqs {
		n += max(r.MaxTokens-1, 0)
	}
	return n
}

// cancelCheckEvents is how often a run looks at its context: every few
// milliseconds of wall time.
const cancelCheckEvents = 4096

// Stream simulates the requests src hands over on the deployment cfg
// describes, taking each when the simulation reaches its arrival (in a
// closed loop, when a client is free), and hands rec every outcome and
// inter-token gap as it happens. The result holds no per-request data.
func Stream(cfg Config, src Source, rec Recorder) (*Result, error) {
	s, err := newSimulation(cfg, src, rec)
	if err != nil {
		return nil, err
	}
	return s.run()
}

// newSimulation checks cfg and sets up its ranks, with their scheduler
// and, under expert parallelism, their waves.
func newSimulation(cfg Config, src Source, rec Recorder) (*simulation, error) {
	switch {
	case cfg.Ranks < 1:
		return nil, fmt.Errorf("vsim: need at least one rank, got %d", cfg.Ranks)
	case cfg.Profile == nil:
		return nil, errors.New("vsim: need a profile")
	case cfg.Policy == nil:
		return nil, errors.New("vsim: need a policy")
	case cfg.Concurrency < 0:
		return nil, fmt.Errorf("vsim: concurrency must not be negative, got %d", cfg.Concurrency)
	}
	if cfg.ExpertParallel {
		if err := cfg.Profile.CheckExpertParallel(cfg.Ranks); err != nil {
			return nil, err
		}
	}
	if cfg.Scheduler.NumBlocks == 0 {
		cfg.Scheduler = cfg.Profile.SchedulerConfig()
	}
	if cfg.SnapshotInterval <= 0 {
		cfg.SnapshotInterval = 100 * time.Millisecond
	}
	// A zero time scale prices each step without sleeping.
	exec, err := sim.NewExecutor(sim.ExecutorConfig{Profile: cfg.Profile, Tokenizer: sim.NewTokenizer(0), Clock: engine.RealClock{}, TimeScale: 0})
	if err != nil {
		return nil, err
	}
	s := &simulation{cfg: cfg, src: src, rec: rec, exec: exec, start: time.Unix(0, 0),
		out:   &Result{Ranks: make([]RankResult, cfg.Ranks)},
		loads: make([]dp.RankLoad, cfg.Ranks)}
	for i := range cfg.Ranks {
		sched, err := engine.NewScheduler(cfg.Scheduler)
		if err != nil {
			return nil, err
		}
		s.ranks = append(s.ranks, &rank{sched: sched})
		s.refresh(i)
	}
	if cfg.ExpertParallel {
		s.coord = dp.NewCoordinatorWave(1)
		var g *dp.Group
		for i := range cfg.Ranks {
			g = s.coord.Join(i)
		}
		for i, r := range s.ranks {
			r.wave = dp.NewWaveStepper(i)
			r.wave.SetGroup(*g)
		}
	}
	return s, nil
}

// run runs the simulation's events in time order until none is left.
func (s *simulation) run() (*Result, error) {
	cfg := s.cfg
	s.fetch()
	some := s.ahead >= 0
	if cfg.Concurrency > 0 {
		for range cfg.Concurrency {
			s.issueNext()
		}
	}
	if some {
		s.push(event{at: cfg.SnapshotInterval, kind: snapshot})
	}
	for {
		var ev event
		switch {
		case cfg.Concurrency == 0 && s.ahead >= 0 && (len(s.q) == 0 || s.flights[s.ahead].req.Arrival <= s.q[0].at):
			// An arrival goes before any other event at its time, as if
			// every arrival had been queued first.
			f := &s.flights[s.ahead]
			if f.req.Arrival < s.now {
				return nil, fmt.Errorf("vsim: request %d arrives at %v, before the one handed over before it", f.i, f.req.Arrival)
			}
			ev = event{at: f.req.Arrival, kind: arrive, slot: s.issue()}
		case len(s.q) > 0:
			ev = s.q.pop()
		default:
			return s.finish()
		}
		s.now = ev.at
		s.out.Events++
		if s.out.Events%cancelCheckEvents == 0 && cfg.Context != nil && cfg.Context.Err() != nil {
			return nil, fmt.Errorf("vsim: stopped after %d events: %w", s.out.Events, cfg.Context.Err())
		}
		switch ev.kind {
		case arrive:
			if err := s.arrive(ev.slot); err != nil {
				return nil, err
			}
		case stepDone:
			s.stepDone(ev.rank)
		case snapshot:
			s.publish()
			if s.open > 0 || s.ahead >= 0 {
				s.push(event{at: s.now + cfg.SnapshotInterval, kind: snapshot})
			}
		}
		s.runWork()
	}
}

// finish checks that every request ended and completes the result.
func (s *simulation) finish() (*Result, error) {
	if s.open > 0 || s.ahead >= 0 {
		return nil, fmt.Errorf("vsim: %d requests in flight never finished (a scheduler stalled)", s.open)
	}
	if s.balanced > 0 {
		s.out.BalanceRatioMean /= float64(s.balanced)
	}
	for i, r := range s.ranks {
		s.out.Ranks[i].Preemptions = r.sched.Stats().NumPreemptions
	}
	return s.out, nil
}

func (s *simulation) push(ev event) {
	s.seq++
	ev.seq = s.seq
	s.q.push(ev)
}

// fetch takes the source's next request into a slot, ahead.
func (s *simulation) fetch() {
	req, ok := s.src()
	if !ok {
		s.ahead = -1
		return
	}
	slot := len(s.flights)
	if n := len(s.free); n > 0 {
		slot, s.free = s.free[n-1], s.free[:n-1]
	} else {
		s.flights = append(s.flights, flight{})
		s.progs = append(s.progs, new(progress))
	}
	s.flights[slot] = flight{i: s.issued, req: req}
	*s.progs[slot] = progress{slot: slot}
	s.ahead = slot
}

// issue sends the request ahead, fetches the next, and returns the sent
// one's slot.
func (s *simulation) issue() int {
	slot := s.ahead
	s.issued++
	s.open++
	s.fetch()
	return slot
}

// issueNext sends the next request of a closed loop now.
func (s *simulation) issueNext() {
	if s.ahead >= 0 {
		s.push(event{at: s.now, kind: arrive, slot: s.issue()})
	}
}

// refresh writes rank j's load as the policy sees it.
func (s *simulation) refresh(j int) {
	r := s.ranks[j]
	s.loads[j] = r.acct.Load(j, true, s.cfg.Scheduler.MaxNumSeqs,
		dp.EngineCounts{Waiting: r.stats.NumWaiting, Running: r.stats.NumRunning, KVUsage: r.stats.KVUsage},
		dp.EngineCounts{Waiting: r.snap.NumWaiting, Running: r.snap.NumRunning}, s.snapSeq)
}

func (s *simulation) arrive(slot int) error {
	f := &s.flights[slot]
	req := &f.req
	o := &f.out
	o.Arrival = s.now
	o.PromptTokens = len(req.Prompt)
	bs := s.cfg.Scheduler.BlockSize
	var placing *dp.Request
	if req.Blocks != nil {
		if len(req.Blocks) != len(req.Prompt)/bs {
			return fmt.Errorf("vsim: request %d comes with %d block hashes; its prompt has %d full blocks of %d tokens", f.i, len(req.Blocks), len(req.Prompt)/bs, bs)
		}
		placing = &dp.Request{PromptTokens: len(req.Prompt), Blocks: req.Blocks, BlockSize: bs}
	} else {
		placing = dp.NewRequest(req.Prompt, bs, "")
	}
	j := s.cfg.Policy.Pick(placing, s.loads)
	if j < 0 {
		return ErrNoRank
	}
	o.Rank = j
	p := s.progs[slot]
	p.prefill = dp.Prefill(len(req.Prompt), placing.Cached)
	r := s.ranks[j]
	// The blocks hashed to balance are the engine's: no block is hashed
	// twice.
	err := r.sched.Add(engine.NewRequest{ID: strconv.Itoa(f.i), Prompt: req.Prompt, Client: p, BlockHashes: placing.Blocks, PromptHash: req.PromptHash,
		Sampling: engine.SamplingParams{MaxTokens: req.MaxTokens, IgnoreEOS: true}, Arrival: s.start.Add(s.now)})
	// The engine holds what it needs of the request.
	f.req = Request{}
	if err != nil {
		o.Err, o.End = err, s.now
		s.ended(slot)
		return nil
	}
	r.acct.Send(p.prefill)
	s.refresh(j)
	s.dirty = true
	if s.cfg.ExpertParallel {
		stamp, notify := s.frontend.Dispatch()
		if startOthers := r.wave.Request(stamp); startOthers != nil {
			s.startWave(s.coord.StartedWave(j, *startOthers))
		}
		if notify {
			s.startWave(s.coord.FirstRequest(j, stamp))
		}
	}
	s.work = append(s.work, j)
	return nil
}

// startWave delivers the coordinator's StartWave to every rank.
func (s *simulation) startWave(sw *dp.StartWave) {
	if sw == nil {
		return
	}
	s.observe()
	for i, r := range s.ranks {
		r.wave.Start(*sw)
		s.work = append(s.work, i)
	}
}

// observe is the coordinator publishing a wave change at once.
func (s *simulation) observe() {
	w, running := s.coord.Wave()
	s.frontend.Observe(w, running)
}

// runWork lets every rank that may step do so, until none changes.
func (s *simulation) runWork() {
	for len(s.work) > 0 {
		i := s.work[len(s.work)-1]
		s.work = s.work[:len(s.work)-1]
		if s.cfg.ExpertParallel {
			s.pumpWave(i)
		} else {
			s.pump(i)
		}
	}
}

// pump starts a rank's next step, without expert parallelism.
func (s *simulation) pump(i int) {
	r := s.ranks[i]
	if r.busy || !r.sched.HasWork() {
		return
	}
	b := r.sched.ScheduleInto(&r.step)
	if b.Empty() {
		// Nothing fits (every request waits for blocks that only a
		// finishing request frees): the next step's end retries.
		r.sched.Update(b, engine.StepResult{})
		return
	}
	s.launch(i, b)
}

// pumpWave opens a rank's next step of the wave, and runs it once every
// member has reported: the engine actor's loop (dp.WaveStepper).
func (s *simulation) pumpWave(i int) {
	r := s.ranks[i]
	if r.busy {
		return
	}
	st := r.wave.Pump(r.sched, s.cfg.RanksPerNode > 0 && s.cfg.Ranks > s.cfg.RanksPerNode, s.start.Add(s.now))
	if st.Opened {
		s.broadcast(i, st.Own)
	}
	if st.Run == nil {
		return
	}
	if st.Dummy() {
		s.out.Ranks[i].DummySteps++
	}
	// Every member sees the same reports: the step counts once.
	if st.Run.Collective.TotalTokens > 0 && i == st.Reports[0].Rank {
		s.out.BalanceRatioMean += dp.BalanceRatio(st.Reports)
		s.balanced++
	}
	s.launch(i, st.Run)
}

// broadcast delivers a rank's step report to every other member.
func (s *simulation) broadcast(from int, rep dp.StepReport) {
	for i, r := range s.ranks {
		if i == from {
			continue
		}
		wake, resend := r.wave.Receive(rep)
		if wake || r.wave.Awaiting() {
			s.work = append(s.work, i)
		}
		if resend != nil {
			s.broadcast(i, *resend)
		}
	}
}

func (s *simulation) launch(i int, b *engine.Batch) {
	r := s.ranks[i]
	res, err := s.exec.Execute(context.Background(), b)
	if err != nil {
		panic(fmt.Sprintf("vsim: the simulated executor failed: %v", err))
	}
	r.busy, r.batch, r.res = true, b, res
	s.out.Ranks[i].Steps++
	s.out.Ranks[i].Busy += res.Duration
	s.push(event{at: s.now + res.Duration, kind: stepDone, rank: i})
}

func (s *simulation) stepDone(i int) {
	r := s.ranks[i]
	b := r.batch
	r.busy, r.batch = false, nil
	outs := r.sched.AppendUpdate(s.outs[:0], b, r.res)
	// Tokens first, then endings, for the reason the scheduler's Update
	// takes two passes: the requests' flights were last touched a step
	// ago. Only the order of gaps against endings differs from one pass.
	for _, o := range outs {
		s.tokens(i, o)
	}
	for _, o := range outs {
		if o.Finish != engine.NotFinished {
			s.end(i, o.Client.(*progress).slot)
		}
	}
	clear(outs)
	s.outs = outs[:0]
	r.stats = r.sched.Stats()
	s.refresh(i)
	s.dirty = true
	if s.cfg.ExpertParallel && b.Collective != nil {
		ended, reportComplete, startOthers := r.wave.Stepped(r.sched.HasWork())
		if ended != nil {
			if reportComplete {
				s.out.Waves++
				if s.coord.WaveComplete(*ended) {
					s.observe()
				}
			}
		}
		if startOthers != nil {
			s.startWave(s.coord.StartedWave(i, *startOthers))
		}
	}
	s.work = append(s.work, i)
}

// tokens counts an output's new tokens for its request.
func (s *simulation) tokens(i int, out engine.Output) {
	p := out.Client.(*progress)
	if out.First && !p.cachedKnown {
		p.cached, p.cachedKnown = out.NumCachedTokens, true
	}
	for range out.NewTokens {
		if !p.firstSeen {
			p.first, p.firstSeen = s.now, true
			s.ranks[i].acct.Prefilled(p.prefill)
		} else {
			s.rec.Gap(s.now - p.lastToken)
		}
		p.lastToken = s.now
		p.tokens++
	}
}

// end ends the request in slot, which finished at rank i.
func (s *simulation) end(i, slot int) {
	s.flights[slot].out.End = s.now
	left := 0
	if p := s.progs[slot]; !p.firstSeen {
		left = p.prefill
	}
	s.ranks[i].acct.Release(left)
	s.out.Ranks[i].Served++
	s.ended(slot)
}

// ended counts the request in slot out, hands its outcome over, frees its
// slot, and in a closed loop sends the next request.
func (s *simulation) ended(slot int) {
	s.open--
	s.out.Makespan = max(s.out.Makespan, s.now)
	f, p := &s.flights[slot], s.progs[slot]
	f.out.First, f.out.Tokens, f.out.CachedTokens = p.first, p.tokens, p.cached
	s.rec.Ended(f.i, f.out)
	*f = flight{}
	s.free = append(s.free, slot)
	if s.cfg.Concurrency > 0 {
		s.issueNext()
	}
}

// publish is the coordinator's load snapshot: it goes out when something
// changed since the last one.
func (s *simulation) publish() {
	if !s.dirty {
		return
	}
	s.dirty = false
	s.snapSeq++
	for i, r := range s.ranks {
		r.snap = r.stats
		s.refresh(i)
	}
	if s.cfg.ExpertParallel {
		s.observe()
	}
}
