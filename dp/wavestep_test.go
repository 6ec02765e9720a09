package dp

import (
	"testing"
	"time"

	"github.com/dpnode/dpnode/engine"
)

// countSched has steps batches of tokens each to schedule.
type countSched struct{ steps, tokens int }

func (s *countSched) HasWork() bool { return s.steps > 0 }

func (s *countSched) Schedule() *engine.Batch {
	s.steps--
	return &engine.Batch{Requests: []engine.ScheduledRequest{{ID: "r", NumNewTokens: s.tokens}},
		Shape: engine.Shape{NumPrefillTokens: s.tokens}}
}

// TestWaveStepperRunsAWave steps two ranks through a wave in which only
// rank 0 has work: rank 1 runs a dummy step for each of rank 0's, each
// step runs once both reports are in, priced for both, and the wave ends
// after the step in which neither reports unfinished work, reported by the
// group's lowest rank only.
func TestWaveStepperRunsAWave(t *testing.T) {
	g := Group{Epoch: 1, Seq: 1, Ranks: []int{0, 1}}
	ws := []*WaveStepper{NewWaveStepper(0), NewWaveStepper(1)}
	scheds := []*countSched{{steps: 2, tokens: 64}, {}}
	for _, w := range ws {
		w.SetGroup(g)
	}
	// A request wakes rank 0, whose report wakes rank 1.
	if others := ws[0].Request(0); others != nil {
		t.Fatalf("a request stamped with the current wave asked to start wave %d for the others", *others)
	}
	now := time.Unix(1, 0)
	var runs [2][]*engine.Batch
	ended := [2]int{}
	for round := 0; round < 10 && (ended[0] == 0 || ended[1] == 0); round++ {
		var ran [2]*engine.Batch
		for pass := 0; pass < 2; pass++ {
			for i, w := range ws {
				if ran[i] != nil {
					continue
				}
				st := w.Pump(scheds[i], true, now)
				if st.Opened {
					if wake, _ := ws[1-i].Receive(st.Own); wake && i == 0 && round > 0 {
						t.Fatalf("round %d: rank 1 was woken in the middle of the wave", round)
					}
				}
				if st.Run != nil {
					if st.Dummy() != (len(st.Run.Requests) == 0) {
						t.Fatalf("round %d, rank %d: Dummy() = %v for %d requests", round, i, st.Dummy(), len(st.Run.Requests))
					}
					if c := st.Run.Collective; c == nil || !c.CrossNode || len(c.Shapes) != 2 || len(st.Reports) != 2 {
						t.Fatalf("round %d, rank %d: collective %+v over %d reports", round, i, c, len(st.Reports))
					}
					ran[i] = st.Run
				}
			}
		}
		for i, w := range ws {
			if ran[i] == nil {
				t.Fatalf("round %d: rank %d ran no step", round, i)
			}
			runs[i] = append(runs[i], ran[i])
			if ended0, reportComplete, others := w.Stepped(scheds[i].HasWork()); ended0 != nil {
				ended[i]++
				if reportComplete != (i == 0) {
					t.Errorf("rank %d: reportComplete = %v", i, reportComplete)
				}
				if others != nil {
					t.Errorf("rank %d with no work started wave %d", i, *others)
				}
			}
		}
	}
	// Rank 0's second batch leaves it without work, so that step's
	// reports, none unfinished, end the wave.
	if len(runs[0]) != 2 || len(runs[1]) != 2 {
		t.Fatalf("ranks ran %d and %d steps; want 2 each", len(runs[0]), len(runs[1]))
	}
	for s := range 2 {
		if runs[0][s].Empty() || !runs[1][s].Empty() {
			t.Errorf("step %d: rank 0 ran %d requests, rank 1 %d; want work on rank 0, a dummy on rank 1", s, len(runs[0][s].Requests), len(runs[1][s].Requests))
		}
		if got := runs[1][s].Collective.TotalTokens; got != 64 {
			t.Errorf("step %d: rank 1's collective counts %d tokens, want rank 0's 64", s, got)
		}
	}
	if ended != [2]int{1, 1} {
		t.Fatalf("waves ended per rank: %v, want one each", ended)
	}
	if w, running := ws[1].Wave(); running || w != 1 {
		t.Fatalf("rank 1 is at wave %d, running %v; want idle at wave 1", w, running)
	}
}

// TestWaveStepperAbandon: a rank left out of its group while its step's
// collective is open gets that step's batch back to run alone.
func TestWaveStepperAbandon(t *testing.T) {
	w := NewWaveStepper(1)
	w.SetGroup(Group{Epoch: 1, Seq: 1, Ranks: []int{0, 1}})
	w.Request(0)
	st := w.Pump(&countSched{steps: 1, tokens: 8}, false, time.Unix(1, 0))
	if !st.Opened || st.Run != nil {
		t.Fatalf("alone in a group of two, Pump opened %v and ran %v", st.Opened, st.Run)
	}
	if _, excluded, _ := w.SetGroup(Group{Epoch: 1, Seq: 2, Ranks: []int{0}}); !excluded {
		t.Fatal("a group without rank 1 did not exclude it")
	}
	b := w.Abandon()
	if b == nil || len(b.Requests) != 1 || b.Collective != nil {
		t.Fatalf("abandoned batch %+v; want the scheduled one, with no collective", b)
	}
	if w.Abandon() != nil {
		t.Fatal("the batch was handed back twice")
	}
	if st := w.Pump(&countSched{}, false, time.Unix(2, 0)); st.Opened || st.Run != nil {
		t.Fatalf("out of the group, Pump still stepped: %+v", st)
	}
}
