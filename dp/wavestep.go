package dp

import (
	"time"

	"github.com/dpnode/dpnode/engine"
)

// Scheduler is what a WaveStepper needs of an engine's scheduler.
type Scheduler interface {
	HasWork() bool
	Schedule() *engine.Batch
}

// WaveStepper is the step loop an engine runs around its EngineWave. The
// engine actor and the virtual-time simulator both run this one loop, so
// that the simulator's waves, steps and dummy steps are the runtime's:
//
//   - Pump, whenever the engine is free: in a running wave, it opens the
//     step with the scheduler's next batch (an empty one, a dummy step,
//     when there is no work) and returns the report to send to every other
//     member; once every member's report is in, it returns the batch to
//     run, priced for the step's collective;
//   - Stepped, after that batch ran: it closes the step, and may end the
//     wave or start the next one.
type WaveStepper struct {
	*EngineWave
	// pending is the batch of the step whose collective is open; reports
	// are that step's, once complete, until it has run.
	pending *engine.Batch
	reports []StepReport
}

// NewWaveStepper returns rank's step loop, idle at wave 0.
func NewWaveStepper(rank int) *WaveStepper {
	return &WaveStepper{EngineWave: NewEngineWave(rank)}
}

// WaveStep is what one Pump decided.
type WaveStep struct {
	// Opened is true when Pump opened the engine's part of a step: Own
	// goes to every other member of the group.
	Opened bool
	Own    StepReport
	// Run, when not nil, is the batch to execute now, its Collective set
	// from Reports, the step's reports in rank order.
	Run     *engine.Batch
	Reports []StepReport
}

// Dummy reports whether the batch to run computes nothing: the engine
// steps only so that the collective pairs up.
func (s WaveStep) Dummy() bool { return s.Run != nil && s.Run.Empty() }

// Pump advances the engine's step: call it whenever the engine is free (no
// batch executing) and after anything that may let it step. crossNode
// prices the collective as spanning nodes; now starts its timeout.
func (s *WaveStepper) Pump(sched Scheduler, crossNode bool, now time.Time) (st WaveStep) {
	if _, running := s.Wave(); !running || !s.InGroup() {
		return st
	}
	if !s.Awaiting() {
		b := &engine.Batch{}
		if sched.HasWork() {
			b = sched.Schedule()
		}
		s.pending = b
		st.Opened, st.Own = true, s.Begin(b.NumTokens(), sched.HasWork(), b.Shape, now)
	}
	reports, ok := s.Complete()
	if !ok {
		return st
	}
	b := s.pending
	s.pending, s.reports = nil, reports
	c := &engine.Collective{CrossNode: crossNode}
	for _, r := range reports {
		c.Shapes = append(c.Shapes, r.Shape)
		c.TotalTokens += r.Tokens
	}
	b.Collective = c
	st.Run, st.Reports = b, reports
	return st
}

// Stepped closes the step whose batch Pump returned, after it ran; hasWork
// says whether the engine holds requests now. The results are Finish's.
func (s *WaveStepper) Stepped(hasWork bool) (ended *uint64, reportComplete bool, startOthers *uint64) {
	reports := s.reports
	s.reports = nil
	return s.Finish(reports, hasWork)
}

// Abandon takes back the batch of a step whose collective never completed,
// because the engine was left out of its group: the scheduler took its
// requests into that step, so the engine must still run it, alone, and
// end no wave with it. Nil when no step was open.
func (s *WaveStepper) Abandon() *engine.Batch {
	b := s.pending
	s.pending = nil
	return b
}
