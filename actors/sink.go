package actors

import (
	"fmt"
	"sync"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/dpnode/dpnode/engine"
	dpnodev1 "github.com/dpnode/dpnode/proto/dpnode/v1"
)

// progress is what a call has produced so far, over every attempt that
// served it: the tokens its client was sent, and what a whole call's one
// event carries. It outlives each attempt, so that a call moved to
// another rank goes on from exactly the tokens its client saw. The engine
// of the current attempt writes it, the API server reads it to move the
// call, and mu orders the two.
type progress struct {
	mu sync.Mutex
	// current is the attempt allowed to deliver; nil while the call is
	// between ranks, and once it has ended.
	current                  *sink
	output                   []uint32
	logprobs, promptLogprobs []*engine.TokenLogprobs
	firstAt, lastAt          time.Time
	// promptHit is the first engine's prefix-cache hit on the prompt, and
	// queued how long the request waited there before its first step.
	promptHit int
	queued    time.Duration
	// ended is set once the call's last event was pushed.
	ended bool
}

// sink is one attempt of a call: where the engine that serves it delivers
// its outputs. An engine in the API server's process delivers to it from
// its own mailbox, so that a step's tokens reach the waiting handler in
// one hop; it then tells the API server only what the balancer needs (see
// localOutputs). A remote engine's outputs come to the API server, which
// delivers them the same way.
type sink struct {
	id      string
	index   int
	whole   bool
	stream  *Stream
	arrival time.Time
	rank    int
	metrics *rankMetrics
	// owner is the API server that sent the attempt.
	owner *actor.PID
	// first is set on the call's first attempt: only its engine's cache
	// hit is the client's prompt hit. moves counts the attempts before.
	first bool
	moves int
	p     *progress
	// tokens is set once the attempt has had output (under p.mu): its
	// prompt is prefilled.
	tokens bool
}

// next makes s the call's current attempt and returns the tokens so far,
// which s continues from; false when the call has already ended.
func (p *progress) next(s *sink) ([]uint32, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ended {
		return nil, false
	}
	p.current = s
	return p.output, true
}

// done says whether the call has ended.
func (p *progress) done() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.ended
}

// tokens returns how many tokens the call has so far.
func (p *progress) tokens() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.output)
}

// detach stops the current attempt's deliveries, and says how many tokens
// the call has and whether it has ended.
func (p *progress) detach() (tokens int, ended bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.current = nil
	return len(p.output), p.ended
}

// end ends the call with ev, unless it has ended already; no attempt
// delivers after it.
func (p *progress) end(stream *Stream, ev Event) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.current = nil
	if !p.ended {
		p.ended = true
		stream.push(ev)
	}
}

// RefusedError is an engine's refusal of a request as its client asked it
// (engine.Output.Refused): the client's error, not the server's.
type RefusedError struct{ Msg string }

func (e *RefusedError) Error() string { return e.Msg }

// deliver records one output of the attempt and pushes its event to the
// stream, unless the attempt is no longer the call's current one. It says
// whether the output is the attempt's first with tokens (its prompt is
// prefilled) and whether the call ended; errText explains a
// FinishedError. It never blocks on the reader.
func (s *sink) deliver(o *engine.Output, errText string, now time.Time) (prefilled, ended bool) {
	p := s.p
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.current != s {
		return false, false
	}
	if n := len(o.NewTokens); n > 0 {
		prefilled, s.tokens = !s.tokens, true
		if p.firstAt.IsZero() {
			p.firstAt = now
			s.metrics.ttft.Observe(now.Sub(s.arrival).Seconds())
		} else {
			s.metrics.itl.Observe(now.Sub(p.lastAt).Seconds() / float64(n))
		}
		p.lastAt = now
		p.output = append(p.output, o.NewTokens...)
		if s.whole && len(o.Logprobs) > 0 {
			p.logprobs = append(p.logprobs, o.Logprobs...)
		}
		if s.whole && p.promptLogprobs == nil {
			p.promptLogprobs = o.PromptLogprobs
		}
		s.metrics.generation.Add(float64(n))
	}
	if s.first && o.NumCachedTokens != 0 {
		// After a move the new engine's cache hit covers the tokens
		// generated before; the client's prompt hit was the first.
		p.promptHit = o.NumCachedTokens
	}
	if s.first && prefilled {
		p.queued = o.Queued
	}
	ev := Event{Index: s.index, Tokens: o.NewTokens, Finish: o.Finish, Rank: s.rank, NumCachedTokens: p.promptHit, Logprobs: o.Logprobs,
		PromptLogprobs: o.PromptLogprobs, Queued: p.queued, Moves: s.moves}
	switch o.Finish {
	case engine.NotFinished:
		if !s.whole {
			s.stream.push(ev)
		}
		return prefilled, false
	case engine.FinishedError:
		var err error = fmt.Errorf("engine rank %d: %s", s.rank, errText)
		if o.Refused {
			err = &RefusedError{Msg: err.Error()}
		}
		ev = Event{Index: s.index, Finish: engine.FinishedError, Err: err}
	default:
		if s.whole {
			ev.Tokens, ev.Logprobs, ev.PromptLogprobs = p.output, p.logprobs, p.promptLogprobs
		}
		ev.FirstAt = p.firstAt
	}
	p.current, p.ended = nil, true
	s.stream.push(ev)
	return prefilled, true
}

// localOutputs is what a local engine tells its API server after a step
// whose outputs it delivered itself: the attempts that have prefilled
// their prompts and those that ended, for the balancer's counts, and its
// stats when they changed.
type localOutputs struct {
	rank  int
	epoch uint64
	stats *dpnodev1.EngineStats
	// prefilled are attempts with their first tokens; ended are attempts
	// that ended, refused those the engine refused.
	prefilled, ended, refused []*sink
}

// empty is true when the API server has nothing to learn from o.
func (o *localOutputs) empty() bool {
	return o.stats == nil && len(o.prefilled) == 0 && len(o.ended) == 0 && len(o.refused) == 0
}

// localAdd sends a request to an engine in the API server's process, with
// the attempt its outputs go to.
type localAdd struct {
	add  *dpnodev1.AddRequest
	sink *sink
}

// clientOwner returns the API server a request's client stands for: the sink's
// owner for a local attempt, the PID itself for a remote one.
func clientOwner(client any) *actor.PID {
	switch c := client.(type) {
	case *sink:
		return c.owner
	case *actor.PID:
		return c
	}
	return nil
}
