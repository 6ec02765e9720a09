package actors

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dpnode/dpnode/engine"
)

// drain returns the events a stream holds now.
func drain(t *testing.T, s *Stream) []Event {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
	defer cancel()
	evs, _ := s.Next(ctx, nil)
	return evs
}

func testSink(p *progress, stream *Stream, whole, first bool) *sink {
	m := NewMetrics(prometheus.NewRegistry(), "m", 1024).forRank(0, true)
	return &sink{id: "r", stream: stream, whole: whole, first: first, metrics: m, p: p, arrival: time.Now()}
}

// TestSinkDeliversOnlyForTheCurrentAttempt: once the API server moves a
// call, the attempt it left can no longer reach the client, and the next
// attempt continues from exactly the tokens the client was sent.
func TestSinkDeliversOnlyForTheCurrentAttempt(t *testing.T) {
	p, stream := &progress{}, NewStream()
	first := testSink(p, stream, false, true)
	if _, ok := p.next(first); !ok {
		t.Fatal("a new call refused its first attempt")
	}
	now := time.Now()
	if prefilled, ended := first.deliver(&engine.Output{NewTokens: []uint32{1, 2}, NumCachedTokens: 16, Queued: 5 * time.Millisecond}, "", now); !prefilled || ended {
		t.Fatalf("first output: prefilled %v ended %v", prefilled, ended)
	}
	if prefilled, _ := first.deliver(&engine.Output{NewTokens: []uint32{3}}, "", now); prefilled {
		t.Fatal("an attempt's second output counted as its prefill")
	}
	if tokens, ended := p.detach(); tokens != 3 || ended {
		t.Fatalf("detached with %d tokens, ended %v", tokens, ended)
	}
	if prefilled, ended := first.deliver(&engine.Output{NewTokens: []uint32{99}, Finish: engine.FinishedLength}, "", now); prefilled || ended {
		t.Fatal("a detached attempt delivered")
	}
	second := testSink(p, stream, false, false)
	second.moves = 1
	so, ok := p.next(second)
	if !ok || !slices.Equal(so, []uint32{1, 2, 3}) {
		t.Fatalf("the next attempt continues from %v", so)
	}
	if _, ended := second.deliver(&engine.Output{NewTokens: []uint32{4}, NumCachedTokens: 19, Queued: time.Second, Finish: engine.FinishedLength}, "", now); !ended {
		t.Fatal("the last output did not end the call")
	}
	var tokens []uint32
	evs := drain(t, stream)
	for _, ev := range evs {
		tokens = append(tokens, ev.Tokens...)
		if ev.NumCachedTokens != 16 {
			t.Errorf("an event says %d cached tokens; the client's prompt hit was the first engine's 16", ev.NumCachedTokens)
		}
		if ev.Queued != 5*time.Millisecond {
			t.Errorf("an event says the request was queued %v; its first engine kept it 5ms", ev.Queued)
		}
	}
	if last := evs[len(evs)-1]; last.Moves != 1 || !last.FirstAt.Equal(now) || evs[0].Moves != 0 || !evs[0].FirstAt.IsZero() {
		t.Errorf("events say moves %d then %d, first token at %v then %v; want 0 then 1, and the first token's time on the last event only",
			evs[0].Moves, last.Moves, evs[0].FirstAt, last.FirstAt)
	}
	if !slices.Equal(tokens, []uint32{1, 2, 3, 4}) || evs[len(evs)-1].Finish != engine.FinishedLength {
		t.Fatalf("the client got %v, finishing %v", tokens, evs[len(evs)-1].Finish)
	}
	if _, ok := p.next(testSink(p, stream, false, false)); ok {
		t.Fatal("an ended call took another attempt")
	}
	p.end(stream, Event{Finish: engine.FinishedError})
	if evs := drain(t, stream); len(evs) != 0 {
		t.Fatalf("an ended call got %d more events", len(evs))
	}
}

// TestWholeSinkSendsOneEvent: a whole call's client reads one event with
// every token, whatever the attempts.
func TestWholeSinkSendsOneEvent(t *testing.T) {
	p, stream := &progress{}, NewStream()
	s := testSink(p, stream, true, true)
	p.next(s)
	now := time.Now()
	s.deliver(&engine.Output{NewTokens: []uint32{5}}, "", now)
	p.detach()
	s = testSink(p, stream, true, false)
	p.next(s)
	s.deliver(&engine.Output{NewTokens: []uint32{6}}, "", now)
	s.deliver(&engine.Output{NewTokens: []uint32{7}, Finish: engine.FinishedStop}, "", now)
	evs := drain(t, stream)
	if len(evs) != 1 || !slices.Equal(evs[0].Tokens, []uint32{5, 6, 7}) || evs[0].Finish != engine.FinishedStop {
		t.Fatalf("a whole call got %+v", evs)
	}
}

// TestRefusedAttemptEndsWithTheEnginesReason: an engine's refusal reaches
// the client as an error that names the rank and the reason.
func TestRefusedAttemptEndsWithTheEnginesReason(t *testing.T) {
	p, stream := &progress{}, NewStream()
	s := testSink(p, stream, false, true)
	p.next(s)
	if _, ended := s.deliver(&engine.Output{Finish: engine.FinishedError}, "prompt too long", time.Now()); !ended {
		t.Fatal("a refusal did not end the call")
	}
	evs := drain(t, stream)
	if len(evs) != 1 || evs[0].Err == nil || evs[0].Err.Error() != "engine rank 0: prompt too long" {
		t.Fatalf("the client got %+v", evs)
	}
}
