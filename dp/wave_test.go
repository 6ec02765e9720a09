package dp

import (
	"fmt"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/dpnode/dpnode/engine"
)

// waveSim runs the three wave state machines over a pool of messages that
// are delivered in an order the test draws: any message can be delayed
// behind any other (except that each sender's messages to one receiver
// stay in order, as on one actor connection), StartWaves can be doubled,
// and frontends can act on stale beliefs. An engine's work is a count of
// tokens to compute, one per step.
type waveSim struct {
	t         *rapid.T
	coord     *CoordinatorWave
	engines   []*EngineWave
	frontends []*FrontendWave
	work      []int
	pool      []simMsg
	now       time.Time

	// What the properties check.
	injected, stepped int
	workAtReport      map[[3]uint64]int // (rank, wave, step) -> work when reporting
	lastWave          map[string]uint64
	stepsAfterDone    []int
}

type simMsg struct {
	from, to string
	body     any
}

type addRequest struct {
	stamp  uint64
	tokens int
}
type startedWave struct {
	rank int
	wave uint64
}
type firstRequest struct {
	target int
	wave   uint64
}
type waveComplete struct{ wave uint64 }
type snapshot struct {
	wave    uint64
	running bool
}

func engineName(r int) string { return fmt.Sprint("engine-", r) }

func newWaveSim(t *rapid.T, ranks, frontends int) *waveSim {
	s := &waveSim{t: t, coord: NewCoordinatorWave(7), now: time.Unix(0, 0),
		workAtReport: map[[3]uint64]int{}, lastWave: map[string]uint64{}, stepsAfterDone: make([]int, ranks)}
	for r := range ranks {
		s.engines = append(s.engines, NewEngineWave(r))
		s.work = append(s.work, 0)
	}
	for range frontends {
		s.frontends = append(s.frontends, &FrontendWave{})
	}
	var g *Group
	for r := range ranks {
		g = s.coord.Join(r)
	}
	for _, e := range s.engines {
		e.SetGroup(*g)
	}
	return s
}

func (s *waveSim) send(from, to string, body any) {
	s.pool = append(s.pool, simMsg{from, to, body})
}

// deliverable lists the messages that may go next: the first of each
// (sender, receiver) pair.
func (s *waveSim) deliverable() []int {
	seen := map[[2]string]bool{}
	var out []int
	for i, m := range s.pool {
		k := [2]string{m.from, m.to}
		if !seen[k] {
			seen[k] = true
			out = append(out, i)
		}
	}
	return out
}

func (s *waveSim) checkMonotone(who string, w uint64) {
	if w < s.lastWave[who] {
		s.t.Fatalf("%s's wave went from %d down to %d", who, s.lastWave[who], w)
	}
	s.lastWave[who] = w
}

func (s *waveSim) broadcastStart(sw *StartWave, dup bool) {
	if sw == nil {
		return
	}
	for r := range s.engines {
		s.send("coordinator", engineName(r), *sw)
		if dup {
			s.send("coordinator", engineName(r), *sw)
		}
	}
}

func (s *waveSim) publish() {
	w, running := s.coord.Wave()
	s.checkMonotone("coordinator", w)
	for i := range s.frontends {
		s.send("coordinator", fmt.Sprint("frontend-", i), snapshot{w, running})
	}
}

// inject sends a request of n tokens from a frontend to a rank.
func (s *waveSim) inject(fi, rank, n int) {
	stamp, notify := s.frontends[fi].Dispatch()
	from := fmt.Sprint("frontend-", fi)
	if notify {
		s.send(from, "coordinator", firstRequest{rank, stamp})
	}
	s.send(from, engineName(rank), addRequest{stamp, n})
	s.injected += n
	clear(s.stepsAfterDone)
}

func (s *waveSim) deliver(i int, dupStart bool) {
	m := s.pool[i]
	s.pool = append(s.pool[:i], s.pool[i+1:]...)
	switch b := m.body.(type) {
	case firstRequest:
		s.broadcastStart(s.coord.FirstRequest(b.target, b.wave), dupStart)
		s.publish()
	case startedWave:
		s.broadcastStart(s.coord.StartedWave(b.rank, b.wave), dupStart)
		s.publish()
	case waveComplete:
		if s.coord.WaveComplete(b.wave) {
			s.publish()
		}
	case snapshot:
		var fi int
		fmt.Sscanf(m.to, "frontend-%d", &fi)
		s.frontends[fi].Observe(b.wave, b.running)
		w, _ := s.frontends[fi].Wave()
		s.checkMonotone(m.to, w)
	case addRequest:
		r := s.rank(m.to)
		s.work[r] += b.tokens
		if w := s.engines[r].Request(b.stamp); w != nil {
			s.send(m.to, "coordinator", startedWave{r, *w})
		}
	case StartWave:
		s.engines[s.rank(m.to)].Start(b)
	case StepReport:
		r := s.rank(m.to)
		if _, resend := s.engines[r].Receive(b); resend != nil {
			s.broadcastReport(r, *resend)
		}
	}
}

func (s *waveSim) rank(name string) int {
	var r int
	fmt.Sscanf(name, "engine-%d", &r)
	return r
}

func (s *waveSim) broadcastReport(from int, rep StepReport) {
	for _, r := range s.engines[from].Group().Ranks {
		if r != from {
			s.send(engineName(from), engineName(r), rep)
		}
	}
}

// tick lets every engine do what it can: open a step, or finish one whose
// reports are all in (running it computes one of its tokens).
func (s *waveSim) tick() {
	for r, e := range s.engines {
		for {
			w, running := e.Wave()
			s.checkMonotone(engineName(r), w)
			if running && !e.Awaiting() {
				if s.doneAll() {
					s.stepsAfterDone[r]++
				}
				rep := e.Begin(min(s.work[r], 1), s.work[r] > 0, engine.Shape{}, s.now)
				s.workAtReport[[3]uint64{uint64(r), rep.Wave, rep.Step}] = s.work[r]
				s.broadcastReport(r, rep)
			}
			reports, ok := e.Complete()
			if !ok {
				break
			}
			if s.work[r] > 0 {
				s.work[r]--
				s.stepped++
			}
			ended, reportComplete, startOthers := e.Finish(reports, s.work[r] > 0)
			if ended != nil {
				// Safety: the wave ends only on a step in which every rank
				// truthfully reported no work.
				for _, rep := range reports {
					if rep.Unfinished || s.workAtReport[[3]uint64{uint64(rep.Rank), rep.Wave, rep.Step}] != 0 {
						s.t.Fatalf("wave %d completed on a step where rank %d held work", *ended, rep.Rank)
					}
				}
				if reportComplete {
					s.send(engineName(r), "coordinator", waveComplete{*ended})
				}
			}
			if startOthers != nil {
				s.send(engineName(r), "coordinator", startedWave{r, *startOthers})
			}
		}
	}
}

// doneAll reports whether every injected token has been computed and no
// request is still on its way.
func (s *waveSim) doneAll() bool {
	if s.stepped != s.injected {
		return false
	}
	for _, m := range s.pool {
		if _, ok := m.body.(addRequest); ok {
			return false
		}
	}
	return true
}

// TestWaveProtocolProperties drives the coordinator, engine and frontend
// state machines with random message orders and delays, duplicated
// StartWaves and stale frontends, and checks:
//   - every request is eventually stepped;
//   - no engine keeps stepping once all work is done;
//   - a wave is never reported complete while a rank holds work;
//   - wave numbers never decrease.
func TestWaveProtocolProperties(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		ranks := rapid.IntRange(1, 4).Draw(t, "ranks")
		s := newWaveSim(t, ranks, rapid.IntRange(1, 2).Draw(t, "frontends"))
		ops := rapid.IntRange(1, 80).Draw(t, "ops")
		for range ops {
			switch rapid.IntRange(0, 9).Draw(t, "op") {
			case 0, 1:
				s.inject(rapid.IntRange(0, len(s.frontends)-1).Draw(t, "frontend"), rapid.IntRange(0, ranks-1).Draw(t, "rank"), rapid.IntRange(1, 3).Draw(t, "tokens"))
			default:
				if d := s.deliverable(); len(d) > 0 {
					s.deliver(rapid.SampledFrom(d).Draw(t, "msg"), rapid.IntRange(0, 9).Draw(t, "dup") == 0)
				}
			}
			s.tick()
		}
		// Let everything settle, still in a drawn order.
		for n := 0; ; n++ {
			if n > 100000 {
				t.Fatalf("no quiescence: %d messages pending, %d of %d tokens stepped", len(s.pool), s.stepped, s.injected)
			}
			s.tick()
			d := s.deliverable()
			if len(d) == 0 {
				break
			}
			s.deliver(rapid.SampledFrom(d).Draw(t, "settle"), false)
		}
		if s.stepped != s.injected {
			t.Fatalf("%d of %d tokens stepped", s.stepped, s.injected)
		}
		for r, e := range s.engines {
			if _, running := e.Wave(); running {
				t.Fatalf("rank %d still steps with nothing to do", r)
			}
			// The step on which everyone reports no work is the last.
			if s.stepsAfterDone[r] > 1 {
				t.Fatalf("rank %d began %d steps after all work was done", r, s.stepsAfterDone[r])
			}
		}
		if _, running := s.coord.Wave(); running {
			t.Fatal("the coordinator believes a wave runs in an idle cluster")
		}
	})
}

// groupOf makes a group and hands it to the engines.
func groupOf(c *CoordinatorWave, engines []*EngineWave, ranks ...int) Group {
	var g *Group
	for _, r := range ranks {
		if ng := c.Join(r); ng != nil {
			g = ng
		}
	}
	for _, e := range engines {
		e.SetGroup(*g)
	}
	return *g
}

func TestCollectiveTimeoutReformsTheGroupWithoutTheLostRank(t *testing.T) {
	c := NewCoordinatorWave(1)
	es := []*EngineWave{NewEngineWave(0), NewEngineWave(1), NewEngineWave(2)}
	groupOf(c, es, 0, 1, 2)
	t0 := time.Unix(100, 0)
	for _, e := range es[:2] {
		e.Start(StartWave{Wave: 0, Exclude: -1})
	}
	r0 := es[0].Begin(5, true, engine.Shape{}, t0)
	r1 := es[1].Begin(3, true, engine.Shape{}, t0)
	es[0].Receive(r1)
	es[1].Receive(r0)
	if _, ok := es[0].Complete(); ok {
		t.Fatal("the step completed without rank 2")
	}
	if m := es[0].Missing(t0.Add(time.Second), 2*time.Second); m != nil {
		t.Fatalf("missing %v before the timeout", m)
	}
	missing := es[0].Missing(t0.Add(3*time.Second), 2*time.Second)
	if len(missing) != 1 || missing[0] != 2 {
		t.Fatalf("missing %v, want [2]", missing)
	}
	g := c.Drop(missing)
	if g == nil || g.Has(2) || c.Drop(missing) != nil {
		t.Fatalf("dropping rank 2 gave %+v; a second drop must change nothing", g)
	}
	for _, e := range es[:2] {
		if resend, excluded, _ := e.SetGroup(*g); resend || excluded {
			// Both had already sent to each other; resending is allowed
			// but the two survivors stay members.
			if excluded {
				t.Fatal("a survivor was excluded")
			}
		}
		reports, ok := e.Complete()
		if !ok || len(reports) != 2 {
			t.Fatalf("survivors cannot finish the step in the smaller group: %v %v", reports, ok)
		}
	}
	if _, excluded, _ := es[2].SetGroup(*g); !excluded || es[2].InGroup() {
		t.Fatal("the dropped rank does not know it is out")
	}
}

// TestRejoinMidWaveTakesTheGroupsStep admits a rank into a wave at step 5:
// it began at step 0 (its StartWave came late) and re-labels its report
// when the group's arrives.
func TestRejoinMidWaveTakesTheGroupsStep(t *testing.T) {
	c := NewCoordinatorWave(1)
	es := []*EngineWave{NewEngineWave(0), NewEngineWave(1), NewEngineWave(2)}
	groupOf(c, es, 0, 1)
	t0 := time.Unix(100, 0)
	for _, e := range es[:2] {
		e.Start(StartWave{Wave: 3, Exclude: -1})
	}
	// Steps 0-4 of wave 3 between ranks 0 and 1.
	for range 5 {
		a, b := es[0].Begin(1, true, engine.Shape{}, t0), es[1].Begin(1, true, engine.Shape{}, t0)
		es[0].Receive(b)
		es[1].Receive(a)
		for _, e := range es[:2] {
			reports, ok := e.Complete()
			if !ok {
				t.Fatal("step did not complete")
			}
			e.Finish(reports, true)
		}
	}
	g := c.Join(2)
	for _, e := range es {
		e.SetGroup(*g)
	}
	es[2].Start(StartWave{Wave: 3, Exclude: -1})
	late := es[2].Begin(0, false, engine.Shape{}, t0)
	if late.Step != 0 {
		t.Fatalf("the joiner began at step %d", late.Step)
	}
	a, b := es[0].Begin(1, true, engine.Shape{}, t0), es[1].Begin(1, true, engine.Shape{}, t0)
	if a.Step != 5 {
		t.Fatalf("the group is at step %d, want 5", a.Step)
	}
	// The joiner's step-0 report is stale for the others; theirs tell the
	// joiner where the group is.
	if wake, resend := es[0].Receive(late); wake || resend != nil {
		t.Fatal("a stale report woke or moved rank 0")
	}
	_, resend := es[2].Receive(a)
	if resend == nil || resend.Step != 5 {
		t.Fatalf("the joiner did not re-label its report: %+v", resend)
	}
	es[2].Receive(b)
	es[0].Receive(*resend)
	es[0].Receive(b)
	es[1].Receive(a)
	es[1].Receive(*resend)
	for i, e := range es {
		if reports, ok := e.Complete(); !ok || len(reports) != 3 {
			t.Fatalf("rank %d: the step with the joiner did not complete: %v", i, reports)
		}
	}
}

func TestBalanceRatio(t *testing.T) {
	cases := []struct {
		tokens []int
		want   float64
	}{
		{[]int{10, 10, 10, 10}, 1},
		{[]int{10, 0, 0, 0}, 0.25},
		{[]int{4, 2}, 0.75},
		{[]int{0, 0}, 0},
	}
	for _, tc := range cases {
		var rs []StepReport
		for i, n := range tc.tokens {
			rs = append(rs, StepReport{Rank: i, Tokens: n})
		}
		if got := BalanceRatio(rs); got != tc.want {
			t.Errorf("BalanceRatio(%v) = %v, want %v", tc.tokens, got, tc.want)
		}
	}
}

func TestFrontendSendsOneNoticePerIdlePeriod(t *testing.T) {
	var f FrontendWave
	if w, notify := f.Dispatch(); w != 0 || !notify {
		t.Fatal("the first request at an idle cluster does not notify")
	}
	if _, notify := f.Dispatch(); notify {
		t.Fatal("a burst notifies twice")
	}
	f.Observe(0, false) // a snapshot from before the notice
	f.Observe(1, false) // the wave ended
	f.Observe(0, true)  // a late snapshot of the old wave changes nothing
	if w, notify := f.Dispatch(); w != 1 || !notify {
		t.Fatalf("after the wave ended: wave %d notify %v; want 1 true", w, notify)
	}
}

// A new rank admitted mid-wave may hear the members' reports of the open
// step before the group that admits it: it keeps them, and joins that
// step when the group comes, since no more reports come until it reports.
// Dropping them left the members waiting out the collective timeout.
func TestJoinerHearsTheStepBeforeItsGroup(t *testing.T) {
	c := NewCoordinatorWave(1)
	es := []*EngineWave{NewEngineWave(0), NewEngineWave(1), NewEngineWave(2)}
	groupOf(c, es, 0, 1)
	t0 := time.Unix(100, 0)
	for _, e := range es[:2] {
		e.Start(StartWave{Wave: 2, Exclude: -1})
	}
	a, b := es[0].Begin(1, true, engine.Shape{}, t0), es[1].Begin(1, true, engine.Shape{}, t0)
	g := c.Join(2)
	// The members adopt the group and send their reports again, to the
	// joiner among others; the joiner's group arrives after them.
	for _, e := range es[:2] {
		if resend, _, _ := e.SetGroup(*g); !resend {
			t.Fatal("a waiting member did not send its report again")
		}
	}
	for _, r := range []StepReport{a, b} {
		if wake, _ := es[2].Receive(r); wake {
			t.Fatal("a report from a rank outside the joiner's group woke it")
		}
	}
	if _, running := es[2].Wave(); running {
		t.Fatal("the joiner runs before it is a member")
	}
	es[2].SetGroup(*g)
	if w, running := es[2].Wave(); !running || w != 2 {
		t.Fatalf("the joiner is at wave %d, running %v; want wave 2, running", w, running)
	}
	j := es[2].Begin(0, false, engine.Shape{}, t0)
	if j.Step != a.Step {
		t.Fatalf("the joiner began step %d, the group is at %d", j.Step, a.Step)
	}
	es[0].Receive(b)
	es[0].Receive(j)
	es[1].Receive(a)
	es[1].Receive(j)
	for i, e := range es {
		if reports, ok := e.Complete(); !ok || len(reports) != 3 {
			t.Fatalf("rank %d: the step with the joiner did not complete: %v", i, reports)
		}
	}
	// A group that leaves a rank out drops what was kept of it.
	lone := NewEngineWave(3)
	lone.Receive(StepReport{Rank: 7, Wave: 2, Step: 4})
	lone.SetGroup(Group{Epoch: 1, Seq: 9, Ranks: []int{3}})
	if _, running := lone.Wave(); running {
		t.Fatal("a report of a rank outside the group started a wave")
	}
}

// A new engine starts at wave 0. Admitted while the group steps in a later
// wave, it takes the group's wave up, so that a request stamped with an
// earlier one (its frontend lagging) does not put it in a wave the group
// has left, where it would wait for reports nobody sends while the members
// wait for its own.
func TestJoinerTakesTheGroupsWave(t *testing.T) {
	c := NewCoordinatorWave(1)
	es := []*EngineWave{NewEngineWave(0), NewEngineWave(1)}
	groupOf(c, es, 0)
	t0 := time.Unix(100, 0)
	// Waves 0 to 4 end; wave 5 runs on rank 0.
	for w := range uint64(5) {
		c.FirstRequest(0, w)
		es[0].Start(StartWave{Wave: w, Exclude: -1})
		r := es[0].Begin(1, false, engine.Shape{}, t0)
		reports, _ := es[0].Complete()
		if ended, _, _ := es[0].Finish(reports, false); ended == nil || *ended != r.Wave {
			t.Fatalf("wave %d did not end", w)
		}
		c.WaveComplete(w)
	}
	c.FirstRequest(0, 5)
	es[0].Start(StartWave{Wave: 5, Exclude: -1})
	a := es[0].Begin(1, true, engine.Shape{}, t0)
	g := c.Join(1)
	for _, e := range es {
		e.SetGroup(*g)
	}
	// A request stamped with wave 3 reaches the joiner before any report.
	if others := es[1].Request(3); others == nil || *others != 5 {
		t.Fatalf("the joiner's stale request asked the coordinator to start %v, want wave 5", others)
	}
	if w, running := es[1].Wave(); w != 5 || !running {
		t.Fatalf("the joiner runs wave %d (running %v), want 5", w, running)
	}
	j := es[1].Begin(1, true, engine.Shape{}, t0)
	es[1].Receive(a)
	es[0].Receive(j)
	for i, e := range es {
		if _, ok := e.Complete(); !ok {
			t.Fatalf("rank %d: the step with the joiner did not complete", i)
		}
	}
}

// A request can reach a new rank before the group that admits it, and so
// can the reports of members that ran the open step without it (the group
// came to them after its collective) and went on to the next. Admitted,
// the joiner steps where those reports show the group to be, not in the
// step it had entered on its request: there it waited for reports those
// members had sent without it, while they waited for its own.
func TestJoinerWithAnEarlyRequestTakesTheGroupsStep(t *testing.T) {
	c := NewCoordinatorWave(1)
	es := []*EngineWave{NewEngineWave(0), NewEngineWave(1), NewEngineWave(2)}
	groupOf(c, es[:2], 0, 1)
	t0 := time.Unix(100, 0)
	for _, e := range es[:2] {
		e.Start(StartWave{Wave: 0, Exclude: -1})
	}
	// Steps 0-4 of wave 0 between ranks 0 and 1.
	for range 5 {
		a, b := es[0].Begin(1, true, engine.Shape{}, t0), es[1].Begin(1, true, engine.Shape{}, t0)
		es[0].Receive(b)
		es[1].Receive(a)
		for _, e := range es[:2] {
			reports, _ := e.Complete()
			e.Finish(reports, true)
		}
	}
	a5, b5 := es[0].Begin(1, true, engine.Shape{}, t0), es[1].Begin(1, true, engine.Shape{}, t0)
	es[1].Receive(a5)
	reports, ok := es[1].Complete()
	if !ok {
		t.Fatal("rank 1's step 5 did not complete")
	}
	g := c.Join(2)
	// The joiner's first request comes before anything else.
	if others := es[2].Request(0); others != nil {
		t.Fatalf("a request stamped with the running wave asked to start %d", *others)
	}
	// Rank 0 adopts the group while it waits in step 5: it sends its
	// report again, to the joiner too, and now waits for the joiner's.
	if resend, _, _ := es[0].SetGroup(*g); !resend {
		t.Fatal("rank 0, waiting, did not send its report again")
	}
	es[0].Receive(b5)
	// Rank 1 ran step 5 without the joiner, opened step 6, and then
	// adopted the group: the joiner hears its step 6 before its group.
	es[1].Finish(reports, true)
	b6 := es[1].Begin(1, true, engine.Shape{}, t0)
	if resend, _, _ := es[1].SetGroup(*g); !resend {
		t.Fatal("rank 1, waiting, did not send its report again")
	}
	es[0].Receive(b6)
	es[2].Receive(b6)
	if _, _, others := es[2].SetGroup(*g); others != nil {
		t.Fatalf("the joiner asked to start wave %d, which runs", *others)
	}
	j := es[2].Begin(1, true, engine.Shape{}, t0)
	if j.Wave != 0 || j.Step != 6 {
		t.Fatalf("the joiner began wave %d step %d; the group is at wave 0 step 6", j.Wave, j.Step)
	}
	// Rank 0's step-5 report is behind the joiner; the joiner's tells rank
	// 0 that the group went on to step 6.
	if wake, resend := es[2].Receive(a5); wake || resend != nil {
		t.Fatal("a report of a step the joiner is past moved it")
	}
	es[1].Receive(j)
	_, a6 := es[0].Receive(j)
	if a6 == nil || a6.Step != 6 {
		t.Fatalf("rank 0 did not move to step 6: %+v", a6)
	}
	es[1].Receive(*a6)
	es[2].Receive(*a6)
	for i, e := range es {
		if reports, ok := e.Complete(); !ok || len(reports) != 3 {
			t.Fatalf("rank %d: the step with the joiner did not complete: %v", i, reports)
		}
	}
}

// A request stamped with a wave the group has left, reaching a new rank
// before its group, does not keep the joiner in that wave: admitted, it
// takes the group's, and asks the coordinator to start it for the others,
// which may be idle in it, as for any stale stamp.
func TestJoinerWithAStaleEarlyRequestTakesTheGroupsWave(t *testing.T) {
	c := NewCoordinatorWave(1)
	es := []*EngineWave{NewEngineWave(0), NewEngineWave(1)}
	groupOf(c, es[:1], 0)
	t0 := time.Unix(100, 0)
	// Waves 0 to 4 end; the group is idle at wave 5.
	for w := range uint64(5) {
		c.FirstRequest(0, w)
		es[0].Start(StartWave{Wave: w, Exclude: -1})
		es[0].Begin(1, false, engine.Shape{}, t0)
		reports, _ := es[0].Complete()
		es[0].Finish(reports, false)
		c.WaveComplete(w)
	}
	g := c.Join(1)
	es[0].SetGroup(*g)
	// A frontend that has not heard of wave 5 yet; the coordinator ignores
	// its notice, and the joiner alone knows it has work.
	if others := es[1].Request(3); others != nil {
		t.Fatalf("the joiner, outside any group, asked to start wave %d", *others)
	}
	if c.FirstRequest(1, 3) != nil {
		t.Fatal("the coordinator started a wave that ended")
	}
	_, _, others := es[1].SetGroup(*g)
	if others == nil || *others != 5 {
		t.Fatalf("the admitted joiner asked to start %v, want wave 5", others)
	}
	if w, running := es[1].Wave(); w != 5 || !running {
		t.Fatalf("the joiner runs wave %d (running %v), want 5", w, running)
	}
	sw := c.StartedWave(1, *others)
	es[0].Start(*sw)
	a, j := es[0].Begin(0, false, engine.Shape{}, t0), es[1].Begin(1, true, engine.Shape{}, t0)
	es[0].Receive(j)
	es[1].Receive(a)
	for i, e := range es {
		if _, ok := e.Complete(); !ok {
			t.Fatalf("rank %d: the step with the joiner did not complete", i)
		}
	}
}

// A waiting member that holds a joiner's report of a later step (it came
// before the group that admits the joiner) moves up to that step when the
// group comes, as it would had the report come after.
func TestMemberHoldingAJoinersLaterStepMovesUp(t *testing.T) {
	c := NewCoordinatorWave(1)
	m := NewEngineWave(0)
	groupOf(c, []*EngineWave{m}, 0)
	m.Start(StartWave{Wave: 1, Exclude: -1})
	t0 := time.Unix(100, 0)
	own := m.Begin(1, true, engine.Shape{}, t0)
	g := c.Join(1)
	m.Receive(StepReport{Rank: 1, Wave: 1, Step: own.Step + 1, Unfinished: true})
	resend, _, _ := m.SetGroup(*g)
	if !resend || m.Own().Step != own.Step+1 {
		t.Fatalf("resend %v, own step %d; want to send again at step %d", resend, m.Own().Step, own.Step+1)
	}
	if reports, ok := m.Complete(); !ok || len(reports) != 2 {
		t.Fatalf("the step with the joiner did not complete: %v", reports)
	}
}
