package actors

import (
	"context"
	"sync"
	"time"

	"github.com/dpnode/dpnode/engine"
)

// Event is what a Stream carries for one request of a client call.
type Event struct {
	// Index is the request's place in the client call (its choice index).
	Index int
	// Tokens are new output tokens.
	Tokens []uint32
	// Finish is set on the request's last event.
	Finish engine.FinishReason
	// Err explains a FinishedError.
	Err error
	// NumCachedTokens is the prefix-cache hit of the prompt, on the first
	// event of the request.
	NumCachedTokens int
	// Rank served the tokens.
	Rank int
	// Logprobs are Tokens' log-probabilities, when the request asked.
	Logprobs []*engine.TokenLogprobs
	// PromptLogprobs are the prompt's, when the request asked, on its
	// first event with tokens (again after a move, computed again).
	PromptLogprobs []*engine.TokenLogprobs
	// Queued is how long the request waited in its first engine before
	// its first step, once it has tokens; Moves counts its moves to
	// another rank so far.
	Queued time.Duration
	Moves  int
	// FirstAt is when the request's first token reached the API server,
	// on its last event.
	FirstAt time.Time
}

// Stream is the queue between the API server actor, which pushes a call's
// events and must never block, and the HTTP handler that drains them. It
// is unbounded: a request's output is bounded by its max_tokens.
type Stream struct {
	mu     sync.Mutex
	events []Event
	notify chan struct{}
}

// NewStream returns an empty stream.
func NewStream() *Stream {
	return &Stream{notify: make(chan struct{}, 1)}
}

// push appends an event and wakes the reader; it never blocks.
func (s *Stream) push(ev Event) {
	s.mu.Lock()
	s.events = append(s.events, ev)
	s.mu.Unlock()
	select {
	case s.notify <- struct{}{}:
	default:
	}
}

// Next waits for events and returns all that arrived, in order, appending
// them to buf[:0] (pass the previous result to reuse its memory).
func (s *Stream) Next(ctx context.Context, buf []Event) ([]Event, error) {
	for {
		s.mu.Lock()
		if len(s.events) > 0 {
			buf = append(buf[:0], s.events...)
			clear(s.events)
			s.events = s.events[:0]
			s.mu.Unlock()
			return buf, nil
		}
		s.mu.Unlock()
		select {
		case <-s.notify:
		case <-ctx.Done():
			return buf[:0], ctx.Err()
		}
	}
}
