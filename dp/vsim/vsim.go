// Package vsim simulates a data-parallel deployment in virtual time. Every
// rank runs the real scheduler (continuous batching, chunked prefill, the
// block KV cache with prefix caching, preemption), its steps take what the
// simulated executor's cost model says, the real balancing policy places
// each request, and with expert parallelism the real wave state machines
// of package dp keep the ranks in lockstep. Nothing sleeps: an event queue
// jumps from one step's end to the next arrival, so hundreds of ranks and
// minutes of traffic take seconds.
//
// What it leaves out: the network (messages arrive at once, so the live
// policy sees each step's stats as the step ends and the snapshot policy
// sees them at its snapshot interval), failures, and client-side costs.
package vsim

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
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
	// MaxTokens is the output length: the request ignores EOS.
	MaxTokens int
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
}

// Outcome is how one request went. Times are from the start.
type Outcome struct {
	Rank                   int
	Arrival, First, End    time.Duration
	Tokens                 int
	CachedTokens           int
	Err                    error
	lastToken              time.Duration
	firstSeen, cachedKnown bool
	prefill                int
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
	Requests []Outcome
	// ITL holds every gap between two consecutive tokens of a request.
	ITL []time.Duration
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
	// rank for stepDone; req for arrive.
	rank, req int
}

type events []event

func (q events) Len() int { return len(q) }
func (q events) Less(i, j int) bool {
	if q[i].at != q[j].at {
		return q[i].at < q[j].at
	}
	return q[i].seq < q[j].seq
}
func (q events) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *events) Push(x any)   { *q = append(*q, x.(event)) }
func (q *events) Pop() any {
	old := *q
	e := old[len(old)-1]
	*q = old[:len(old)-1]
	return e
}

type rank struct {
	sched    *engine.Scheduler
	busy     bool
	batch    *engine.Batch
	res      engine.StepResult
	stats    engine.Stats
	inflight int
	// pendingPrefill is PendingPrefill of dp.RankLoad.
	pendingPrefill int
	// snap is the rank's load in the last snapshot.
	snap engine.Stats
	// Expert parallelism: the wave state, and the open step's batch and
	// reports.
	wave    *dp.EngineWave
	pending *engine.Batch
	reports []dp.StepReport
}

type simulation struct {
	cfg      Config
	reqs     []Request
	exec     *sim.Executor
	ranks    []*rank
	loads    []dp.RankLoad
	q        events
	seq      uint64
	now      time.Duration
	start    time.Time
	out      *Result
	snapSeq  uint64
	dirty    bool
	left     int // requests not yet ended
	next     int // next request to issue in a closed loop
	coord    *dp.CoordinatorWave
	frontend dp.FrontendWave
	balanced int
	// work lists ranks whose state may let them step.
	work []int
}

// Run simulates reqs on the deployment cfg describes.
func Run(cfg Config, reqs []Request) (*Result, error) {
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
	s := &simulation{cfg: cfg, reqs: reqs, exec: exec, start: time.Unix(0, 0), left: len(reqs),
		out:   &Result{Requests: make([]Outcome, len(reqs)), Ranks: make([]RankResult, cfg.Ranks), ITL: make([]time.Duration, 0, gaps(reqs))},
		loads: make([]dp.RankLoad, cfg.Ranks)}
	for range cfg.Ranks {
		sched, err := engine.NewScheduler(cfg.Scheduler)
		if err != nil {
			return nil, err
		}
		s.ranks = append(s.ranks, &rank{sched: sched})
	}
	if cfg.ExpertParallel {
		s.coord = dp.NewCoordinatorWave(1)
		var g *dp.Group
		for i := range cfg.Ranks {
			g = s.coord.Join(i)
		}
		for i, r := range s.ranks {
			r.wave = dp.NewEngineWave(i)
			r.wave.SetGroup(*g)
		}
	}
	if cfg.Concurrency > 0 {
		for range min(cfg.Concurrency, len(reqs)) {
			s.issueNext()
		}
	} else {
		for i, r := range reqs {
			s.push(event{at: r.Arrival, kind: arrive, req: i})
		}
	}
	if len(reqs) > 0 {
		s.push(event{at: cfg.SnapshotInterval, kind: snapshot})
	}
	for s.q.Len() > 0 {
		ev := heap.Pop(&s.q).(event)
		s.now = ev.at
		s.out.Events++
		switch ev.kind {
		case arrive:
			if err := s.arrive(ev.req); err != nil {
				return nil, err
			}
		case stepDone:
			s.stepDone(ev.rank)
		case snapshot:
			s.publish()
			if s.left > 0 {
				s.push(event{at: s.now + cfg.SnapshotInterval, kind: snapshot})
			}
		}
		s.runWork()
	}
	if s.left > 0 {
		return nil, fmt.Errorf("vsim: %d requests never finished (a scheduler stalled)", s.left)
	}
	if s.balanced > 0 {
		s.out.BalanceRatioMean /= float64(s.balanced)
	}
	for i, r := range s.ranks {
		s.out.Ranks[i].Preemptions = r.sched.Stats().NumPreemptions
	}
	return s.out, nil
}

// gaps is how many inter-token gaps reqs will have at most.
func gaps(reqs []Request) int {
	n := 0
	for _, r := range reqs {
		n += max(r.MaxTokens-1, 0)
	}
	return n
}

func (s *simulation) push(ev event) {
	s.seq++
	ev.seq = s.seq
	heap.Push(&s.q, ev)
}

// issueNext sends the next request of a closed loop now.
func (s *simulation) issueNext() {
	if s.next < len(s.reqs) {
		s.push(event{at: s.now, kind: arrive, req: s.next})
		s.next++
	}
}

func (s *simulation) arrive(i int) error {
	req := &s.reqs[i]
	o := &s.out.Requests[i]
	o.Arrival = s.now
	for j, r := range s.ranks {
		s.loads[j] = dp.RankLoad{Rank: j, Available: true, InFlight: r.inflight, Capacity: s.cfg.Scheduler.MaxNumSeqs,
			Waiting: r.stats.NumWaiting, Running: r.stats.NumRunning, KVUsage: r.stats.KVUsage,
			SnapshotWaiting: r.snap.NumWaiting, SnapshotRunning: r.snap.NumRunning, SnapshotSeq: s.snapSeq,
			PendingPrefill: r.pendingPrefill}
	}
	placing := dp.NewRequest(req.Prompt, s.cfg.Scheduler.BlockSize, "")
	j := s.cfg.Policy.Pick(placing, s.loads)
	if j < 0 {
		return ErrNoRank
	}
	o.Rank = j
	o.prefill = len(req.Prompt) - placing.Cached
	r := s.ranks[j]
	// The blocks hashed to balance are the engine's: no block is hashed
	// twice.
	err := r.sched.Add(engine.NewRequest{ID: strconv.Itoa(i), Prompt: req.Prompt, Client: i, BlockHashes: placing.Blocks,
		Sampling: engine.SamplingParams{MaxTokens: req.MaxTokens, IgnoreEOS: true}, Arrival: s.start.Add(s.now)})
	if err != nil {
		o.Err, o.End = err, s.now
		s.ended()
		return nil
	}
	r.inflight++
	r.pendingPrefill += o.prefill
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
	b := r.sched.Schedule()
	if b.Empty() {
		// Nothing fits (every request waits for blocks that only a
		// finishing request frees): the next step's end retries.
		r.sched.Update(b, engine.StepResult{})
		return
	}
	s.launch(i, b)
}

// pumpWave opens a rank's next step of the wave, and runs it once every
// member has reported, as an engine actor does.
func (s *simulation) pumpWave(i int) {
	r := s.ranks[i]
	if r.busy {
		return
	}
	if _, running := r.wave.Wave(); !running || !r.wave.InGroup() {
		return
	}
	if !r.wave.Awaiting() {
		b := &engine.Batch{}
		if r.sched.HasWork() {
			b = r.sched.Schedule()
		}
		r.pending = b
		own := r.wave.Begin(b.NumTokens(), r.sched.HasWork(), b.Shape, s.start.Add(s.now))
		s.broadcast(i, own)
	}
	reports, ok := r.wave.Complete()
	if !ok {
		return
	}
	b := r.pending
	r.pending, r.reports = nil, reports
	c := &engine.Collective{CrossNode: s.cfg.RanksPerNode > 0 && s.cfg.Ranks > s.cfg.RanksPerNode}
	for _, rep := range reports {
		c.Shapes = append(c.Shapes, rep.Shape)
		c.TotalTokens += rep.Tokens
	}
	b.Collective = c
	if b.Empty() {
		s.out.Ranks[i].DummySteps++
	}
	if c.TotalTokens > 0 && i == reports[0].Rank {
		s.out.BalanceRatioMean += dp.BalanceRatio(reports)
		s.balanced++
	}
	s.launch(i, b)
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
	for _, o := range r.sched.Update(b, r.res) {
		s.output(i, o)
	}
	r.stats = r.sched.Stats()
	s.dirty = true
	if s.cfg.ExpertParallel && b.Collective != nil {
		ended, reportComplete, startOthers := r.wave.Finish(r.reports, r.sched.HasWork())
		r.reports = nil
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

func (s *simulation) output(i int, out engine.Output) {
	o := &s.out.Requests[out.Client.(int)]
	if out.First && !o.cachedKnown {
		o.CachedTokens, o.cachedKnown = out.NumCachedTokens, true
	}
	for range out.NewTokens {
		if !o.firstSeen {
			o.First, o.firstSeen = s.now, true
			s.ranks[i].pendingPrefill -= o.prefill
		} else {
			s.out.ITL = append(s.out.ITL, s.now-o.lastToken)
		}
		o.lastToken = s.now
		o.Tokens++
	}
	if out.Finish != engine.NotFinished {
		o.End = s.now
		s.ranks[i].inflight--
		s.out.Ranks[i].Served++
		s.ended()
	}
}

// ended counts a request out, and in a closed loop sends the next.
func (s *simulation) ended() {
	s.left--
	s.out.Makespan = max(s.out.Makespan, s.now)
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
	for _, r := range s.ranks {
		r.snap = r.stats
	}
	if s.cfg.ExpertParallel {
		s.observe()
	}
}
