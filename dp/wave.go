package dp

import (
	"maps"
	"slices"
	"time"

	"github.com/dpnode/dpnode/engine"
)

// The wave protocol keeps the ranks of a mixture-of-experts model with
// expert parallelism stepping in lockstep: every step of every rank has an
// all-to-all of expert tokens that needs every rank of the group. A wave
// is a period in which all ranks step; a rank with no work runs dummy
// steps so that the collectives pair up. An idle cluster runs no wave and
// does no work at all.
//
// Three state machines speak it, each here as pure code:
//
//   - CoordinatorWave, in the cluster's coordinator: the current wave,
//     whether it runs, and the group of ranks that step together;
//   - EngineWave, in each engine: its wave, and each step's collective
//     (every rank's StepReport for the step; the wave ends when no rank
//     reports unfinished work);
//   - FrontendWave, in each API server: its belief about the wave, which
//     decides when a request must wake the others.
//
// Messages: a frontend stamps each request with its wave, sends it, and,
// when it believes the engines idle, then tells the coordinator
// (FirstRequest): the request must reach its engine before anything the
// notice sets off does (see FrontendWave.Dispatch). The
// coordinator broadcasts StartWave(w, exclude) to the group. An engine
// adopts StartWave if w >= its wave. An engine that gets a request stamped
// with an older wave while idle starts itself and tells the coordinator
// (StartedWave), which starts the others. When a step's reports show no
// unfinished work anywhere, every rank moves to the next wave and goes
// idle, and the lowest rank of the group (rank 0 when present) reports
// WaveComplete.

// Group is the set of ranks that step together, as the coordinator last
// formed it.
type Group struct {
	// Epoch is the coordinator's; Seq counts the groups it formed.
	Epoch uint64
	Seq   uint64
	// Ranks are sorted.
	Ranks []int
	// Wave is the coordinator's wave when it formed the group: a new
	// engine, at wave 0, takes it up, so that a request stamped with an
	// earlier wave cannot put it in a wave the group has left.
	Wave uint64
}

// Newer reports whether g replaces o: a later group of the same
// coordinator, or any group of another coordinator incarnation (an engine
// hears groups only from the coordinator its node follows, whose epoch
// may be lower after a partition heals).
func (g Group) Newer(o Group) bool {
	return g.Epoch != o.Epoch || g.Seq > o.Seq
}

// Has reports whether rank is in the group.
func (g Group) Has(rank int) bool {
	_, ok := slices.BinarySearch(g.Ranks, rank)
	return ok
}

// Lowest is the group's lowest rank, which reports the end of a wave; -1
// for an empty group.
func (g Group) Lowest() int {
	if len(g.Ranks) == 0 {
		return -1
	}
	return g.Ranks[0]
}

// StepReport is one rank's part of a step's collective.
type StepReport struct {
	Rank int
	Wave uint64
	Step uint64
	// Tokens computed by the rank in the step: 0 in a dummy step.
	Tokens int
	// Unfinished is true when the rank holds requests.
	Unfinished bool
	// Shape is what the rank computes in the step, for pricing it.
	Shape engine.Shape
}

// StartWave is the coordinator's order to step in a wave.
type StartWave struct {
	Wave uint64
	// Exclude is the rank that started itself; -1 for none.
	Exclude int
}

// CoordinatorWave is the coordinator's side of the protocol.
type CoordinatorWave struct {
	wave    uint64
	running bool
	group   Group
}

// NewCoordinatorWave starts at wave 0, idle, with an empty group of epoch.
func NewCoordinatorWave(epoch uint64) *CoordinatorWave {
	return &CoordinatorWave{group: Group{Epoch: epoch}}
}

// Wave returns the current wave and whether it runs.
func (c *CoordinatorWave) Wave() (uint64, bool) { return c.wave, c.running }

// Group returns the current group.
func (c *CoordinatorWave) Group() Group { return c.group }

// FirstRequest: a frontend that believed the engines idle sent target a
// request for wave w. The coordinator starts the wave for the others. A
// duplicate while the wave runs starts nothing new; nor does a notice for
// a wave that has already ended (vLLM broadcasts to all then): the target
// found the request's stamp stale and started the next wave itself
// (EngineWave.Request), so a broadcast would only run an empty wave.
func (c *CoordinatorWave) FirstRequest(target int, w uint64) *StartWave {
	if w < c.wave || (c.running && w == c.wave) {
		return nil
	}
	c.wave, c.running = w, true
	return &StartWave{Wave: w, Exclude: target}
}

// StartedWave: rank woke for a request with a stale wave and is stepping
// in wave w; the others must join it. The broadcast is repeated even when
// the coordinator thinks the wave runs: its WaveComplete for the previous
// wave may still be on the way, and an engine already in w ignores it.
func (c *CoordinatorWave) StartedWave(rank int, w uint64) *StartWave {
	if w < c.wave {
		return nil
	}
	c.wave, c.running = w, true
	return &StartWave{Wave: w, Exclude: rank}
}

// WaveComplete: the group finished wave w. It reports whether the wave
// state changed (and must be published at once).
func (c *CoordinatorWave) WaveComplete(w uint64) bool {
	if w < c.wave {
		return false
	}
	c.wave, c.running = w+1, false
	return true
}

// Join admits rank to the group (a new, restarted or returning engine)
// and returns the new group. A rank that is a member already is re-admitted
// all the same: its engine may have restarted in the middle of a step,
// and only a new group makes the members that wait in that step send
// their reports again, for the restarted engine to join it.
func (c *CoordinatorWave) Join(rank int) *Group {
	ranks := c.group.Ranks
	if !c.group.Has(rank) {
		ranks = append(slices.Clone(ranks), rank)
		slices.Sort(ranks)
	}
	return c.reform(ranks)
}

// Drop removes ranks that missed a collective (dead or hung) and returns
// the new group, or nil when none of them was in it.
func (c *CoordinatorWave) Drop(ranks []int) *Group {
	kept := slices.DeleteFunc(slices.Clone(c.group.Ranks), func(r int) bool { return slices.Contains(ranks, r) })
	if len(kept) == len(c.group.Ranks) {
		return nil
	}
	return c.reform(kept)
}

func (c *CoordinatorWave) reform(ranks []int) *Group {
	c.group = Group{Epoch: c.group.Epoch, Seq: c.group.Seq + 1, Ranks: ranks, Wave: c.wave}
	g := c.group
	return &g
}

// FrontendWave is an API server's belief about the wave.
type FrontendWave struct {
	wave    uint64
	running bool
}

// Observe applies a coordinator snapshot; waves never go back.
func (f *FrontendWave) Observe(w uint64, running bool) {
	switch {
	case w > f.wave:
		f.wave, f.running = w, running
	case w == f.wave:
		f.running = running
	}
}

// Dispatch stamps a request for target: it returns the wave to stamp and
// whether to tell the coordinator (the engines looked idle). After a
// first request it assumes the wave runs until a snapshot says otherwise,
// so a burst sends one notice, not one per request.
//
// The notice goes after the request. The others start stepping on it and
// their reports wake the target as well; a target that hears them before
// its request reports no work, the wave ends on its first step, and the
// request, stamped with the ended wave, must start another.
func (f *FrontendWave) Dispatch() (wave uint64, notify bool) {
	notify = !f.running
	f.running = true
	return f.wave, notify
}

// Wave returns the frontend's belief.
func (f *FrontendWave) Wave() (uint64, bool) { return f.wave, f.running }

// EngineWave is an engine's side of the protocol: its wave, and the
// collective of the current step.
//
// Steps are numbered from 0 in each wave. A rank that enters a wave late
// (it was just admitted to the group, or its StartWave came after the
// others began) may open a step the group has passed; it learns so when a
// member's report for a later step arrives with none for the step it is
// in (each member's reports arrive in order), and it re-labels its report
// with the group's step.
type EngineWave struct {
	rank    int
	wave    uint64
	running bool
	group   Group
	step    uint64
	// awaiting is true from the engine's own report for step until the
	// step ends.
	awaiting bool
	since    time.Time
	own      StepReport
	// reports holds the reports of this wave's current and later steps,
	// and of the next wave (a faster rank may start it first).
	reports map[stepKey]map[int]StepReport
}

type stepKey struct{ wave, step uint64 }

// NewEngineWave returns rank's engine side, idle at wave 0.
func NewEngineWave(rank int) *EngineWave {
	return &EngineWave{rank: rank, reports: make(map[stepKey]map[int]StepReport)}
}

// Wave returns the engine's wave and whether it steps.
func (e *EngineWave) Wave() (uint64, bool) { return e.wave, e.running }

// Step is the number of the current (or next) step of the wave.
func (e *EngineWave) Step() uint64 { return e.step }

// Group is the group the engine steps with.
func (e *EngineWave) Group() Group { return e.group }

// InGroup reports whether the engine is a member of its group.
func (e *EngineWave) InGroup() bool { return e.group.Has(e.rank) }

// Awaiting reports whether the engine waits for the others' reports.
func (e *EngineWave) Awaiting() bool { return e.awaiting }

// Own is the engine's report for the open step, as last labelled.
func (e *EngineWave) Own() StepReport { return e.own }

// enter starts stepping in wave w, at the latest step any member already
// reported for it.
func (e *EngineWave) enter(w uint64) {
	e.wave, e.running, e.step = w, true, 0
	for k := range e.reports {
		if k.wave == w && k.step > e.step {
			e.step = k.step
		}
	}
}

// Request: a request stamped with the frontend's wave arrived. The engine
// steps when it has work. It returns the wave the coordinator must start
// for everyone else, when the request woke this engine in a wave the
// coordinator may not know of: the stamp was stale, so no FirstRequest is
// on its way.
func (e *EngineWave) Request(stamp uint64) (startOthers *uint64) {
	if e.running {
		return nil
	}
	e.enter(max(e.wave, stamp))
	if stamp < e.wave {
		w := e.wave
		return &w
	}
	return nil
}

// Start applies the coordinator's StartWave. A running engine ignores it:
// if it is a later wave, the engine is finishing its last step of this one
// with everyone (no rank ends a wave alone), and then joins the next from
// the reports it holds or hears.
func (e *EngineWave) Start(s StartWave) {
	if e.running || s.Exclude == e.rank || s.Wave < e.wave {
		return
	}
	e.enter(s.Wave)
}

// SetGroup adopts a newer group. It returns whether the engine must send
// its report for the current step again (the group changed while it
// waited: new members have not seen it), whether the engine was left out
// (it must stop stepping and ask to rejoin), and, as Request does, the
// wave the coordinator must start for everyone else when the engine, let
// in with work, steps in a wave the coordinator may not know runs.
func (e *EngineWave) SetGroup(g Group) (resend, excluded bool, startOthers *uint64) {
	if !g.Newer(e.group) {
		return false, false, nil
	}
	joining := !e.group.Has(e.rank)
	e.group = g
	for _, byRank := range e.reports {
		maps.DeleteFunc(byRank, func(r int, _ StepReport) bool { return !g.Has(r) })
	}
	if !g.Has(e.rank) {
		e.Leave()
		return false, true, nil
	}
	// A request can reach a new engine before the group that admits it
	// (its frontend hears of the engine apart from the coordinator), and
	// the engine entered the request's wave then, at the step the reports
	// it held showed. It has not stepped in it: it takes its place from
	// the group and the reports held now, like an idle joiner, and then
	// the request again. Kept in the wave it entered, it waited in a step
	// or a wave the members had left, and they for its report.
	var pending *uint64
	if joining && e.running {
		w := e.wave
		pending = &w
		e.running = false
	}
	if !e.running && g.Wave > e.wave {
		// Behind the group (new, or idle through waves it missed): a
		// request stamped with a wave it has not heard of must not take
		// it back there.
		e.wave, e.step = g.Wave, 0
	}
	if !e.running {
		// Admitted while the group steps: the members' reports may have
		// come before the group that admits this engine (they travel
		// apart from the coordinator's message), and no more come until
		// it reports. It joins the wave they step in.
		var w uint64
		held := false
		for k, byRank := range e.reports {
			if k.wave >= e.wave && len(byRank) > 0 && (!held || k.wave > w) {
				w, held = k.wave, true
			}
		}
		if held {
			e.enter(w)
		}
	}
	if pending != nil {
		startOthers = e.Request(*pending)
	}
	if e.awaiting {
		// Reports held from ranks this group admits may show the group
		// past this step already (a joiner's report can come before the
		// group that admits it): the engine moves up, as Receive does
		// when such a report arrives, since it will not arrive again.
		cur := e.reports[stepKey{e.wave, e.step}]
		to := e.step
		for k, byRank := range e.reports {
			if k.wave != e.wave || k.step <= to {
				continue
			}
			for r := range byRank {
				if _, saw := cur[r]; !saw && r != e.rank {
					to = k.step
					break
				}
			}
		}
		if to > e.step {
			delete(cur, e.rank)
			e.step, e.own.Step = to, to
			e.record(e.own)
		}
	}
	return e.awaiting, false, startOthers
}

// Begin opens the engine's part of the current step: it returns the
// engine's report, which goes to every other member. now starts the
// collective's timeout. Begin must only be called while running, a
// member, and not awaiting.
func (e *EngineWave) Begin(tokens int, unfinished bool, shape engine.Shape, now time.Time) StepReport {
	if !e.running || e.awaiting || !e.group.Has(e.rank) {
		panic("dp: Begin outside a running step")
	}
	e.own = StepReport{Rank: e.rank, Wave: e.wave, Step: e.step, Tokens: tokens, Unfinished: unfinished, Shape: shape}
	e.awaiting, e.since = true, now
	e.record(e.own)
	return e.own
}

// Receive records another rank's report. It returns whether the report
// woke the engine (an idle member hearing a step of a running wave must
// join it: it missed the StartWave, or was just admitted), and, when the
// engine found its own report behind the group's step, the re-labelled
// report to send again.
func (e *EngineWave) Receive(r StepReport) (wake bool, resend *StepReport) {
	if r.Rank == e.rank || r.Wave < e.wave || (r.Wave == e.wave && r.Step < e.step) {
		return false, nil
	}
	if !e.group.Has(r.Rank) {
		// From a rank this engine does not know as a member yet: the
		// group that admits it (or this engine) may still be on its way.
		// Kept for SetGroup, which drops it if the group does not.
		e.record(r)
		return false, nil
	}
	_, sawThisStep := e.reports[stepKey{e.wave, e.step}][r.Rank]
	e.record(r)
	switch {
	case !e.running && e.group.Has(e.rank) && r.Wave >= e.wave:
		e.enter(r.Wave)
		return true, nil
	case e.awaiting && r.Wave == e.wave && r.Step > e.step && !sawThisStep:
		// r's sender skipped this step for us: the group is at r.Step.
		delete(e.reports[stepKey{e.wave, e.step}], e.rank)
		e.step = r.Step
		e.own.Step = r.Step
		e.record(e.own)
		own := e.own
		return false, &own
	}
	return false, nil
}

func (e *EngineWave) record(r StepReport) {
	k := stepKey{r.Wave, r.Step}
	byRank := e.reports[k]
	if byRank == nil {
		byRank = make(map[int]StepReport)
		e.reports[k] = byRank
	}
	byRank[r.Rank] = r
}

// Complete returns the current step's reports, in rank order, once every
// member's is in.
func (e *EngineWave) Complete() ([]StepReport, bool) {
	if !e.awaiting {
		return nil, false
	}
	byRank := e.reports[stepKey{e.wave, e.step}]
	for _, r := range e.group.Ranks {
		if _, ok := byRank[r]; !ok {
			return nil, false
		}
	}
	out := make([]StepReport, 0, len(e.group.Ranks))
	for _, r := range e.group.Ranks {
		out = append(out, byRank[r])
	}
	return out, true
}

// Missing lists the members whose reports for the current step have not
// come within timeout of the engine's own.
func (e *EngineWave) Missing(now time.Time, timeout time.Duration) []int {
	if !e.awaiting || now.Sub(e.since) < timeout {
		return nil
	}
	var missing []int
	for _, r := range e.group.Ranks {
		if _, ok := e.reports[stepKey{e.wave, e.step}][r]; !ok {
			missing = append(missing, r)
		}
	}
	return missing
}

// Finish closes the current step after it ran; hasWork says whether the
// engine holds requests now. When no rank reported unfinished work the
// wave is over: ended is its number, and reportComplete says whether this
// engine tells the coordinator (the group's lowest rank). An engine that
// got work after its last report of the wave starts the next wave at once
// and returns it as startOthers, for the coordinator to start the others;
// one that already holds a member's report of the next wave joins it.
func (e *EngineWave) Finish(reports []StepReport, hasWork bool) (ended *uint64, reportComplete bool, startOthers *uint64) {
	delete(e.reports, stepKey{e.wave, e.step})
	e.step++
	// Reports kept from ranks outside the group (see Receive) of steps
	// now past.
	for k := range e.reports {
		if k.wave < e.wave || (k.wave == e.wave && k.step < e.step) {
			delete(e.reports, k)
		}
	}
	e.awaiting = false
	for _, r := range reports {
		if r.Unfinished {
			return nil, false, nil
		}
	}
	w := e.wave
	for k := range e.reports {
		if k.wave <= w {
			delete(e.reports, k)
		}
	}
	e.wave, e.step, e.running = w+1, 0, false
	reportComplete = e.group.Lowest() == e.rank
	switch {
	case hasWork:
		e.enter(e.wave)
		next := e.wave
		startOthers = &next
	case len(e.reports) > 0:
		e.enter(e.wave)
	}
	return &w, reportComplete, startOthers
}

// Leave stops the engine's part in waves while it is out of the group:
// it drops the step in progress.
func (e *EngineWave) Leave() {
	e.running, e.awaiting = false, false
	clear(e.reports)
}

// BalanceRatio is the mean over the max of the tokens the ranks computed
// in a step: 1 when every rank did the same work; 0 for a step of dummies.
func BalanceRatio(reports []StepReport) float64 {
	total, most := 0, 0
	for _, r := range reports {
		total += r.Tokens
		most = max(most, r.Tokens)
	}
	if most == 0 || len(reports) == 0 {
		return 0
	}
	return float64(total) / float64(len(reports)) / float64(most)
}
