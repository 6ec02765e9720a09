package openai

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dpnode/dpnode/engine"
)

// Capabilities are the engine's: the servers schedule and sample on their
// own, so a moved request continues from its output so far (exactly only
// where the server is deterministic), their prefix caches key blocks
// their own way, and their KV use is whatever their metrics say.
// The drawn tokens' log-probabilities and structured output are the
// servers'; the prompt's log-probabilities are not forwarded (yet): the
// API server refuses requests for them.
var Capabilities = engine.Capabilities{Logprobs: true, Grammar: true}

// coreConfig is what a rank's core runs with.
type coreConfig struct {
	// HealthInterval is how often /health is asked; HealthTimeout bounds
	// each answer. Two failures in a row are a dead server.
	HealthInterval, HealthTimeout time.Duration
	// StallTimeout is how long requests may be in flight with no output
	// at all before the server counts as hung.
	StallTimeout time.Duration
	// MetricsInterval is how often /metrics is read; 0 never.
	MetricsInterval time.Duration
	// MaxModelLen bounds a request's prompt and output.
	MaxModelLen int
	Logger      *slog.Logger
}

// core is one rank: a server that runs on its own, fed requests as
// streaming completions. Each request streams on a goroutine of its own,
// which posts what comes back; a step waits for what was posted.
type core struct {
	cfg coreConfig
	srv *server
	// ctx ends every request and poller when the core closes.
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	events chan event
	// wake is signalled when the server's metrics change, so that a
	// waiting step returns and the rank reports them.
	wake chan struct{}

	// reqs are the requests in flight, by id; the mailbox's alone.
	reqs  map[string]*request
	stats engine.Stats
	// live counts reqs for the step's stall check; lastOutput is when a
	// request last got output, or was added (unix nanoseconds).
	live       atomic.Int64
	lastOutput atomic.Int64
	// The server's own figures from /metrics; -1 when not known.
	srvRunning, srvWaiting atomic.Int64
	srvKV                  atomic.Uint64 // math.Float64bits; NaN bits when unknown

	dieOnce sync.Once
	dead    chan struct{}
	deadErr error
}

var _ engine.Core = (*core)(nil)

// request is one request in flight on the server.
type request struct {
	id        string
	client    any
	attempt   uint32
	prompt    []uint32
	output    []uint32
	sampling  engine.SamplingParams
	cacheSalt string
	cancel    context.CancelFunc
	// generated counts the tokens this rank produced; started is set
	// after the first output.
	generated int
	started   bool
}

// event is what a request's stream posts: a chunk, or why it failed.
type event struct {
	req   *request
	chunk chunk
	err   error
}

func newCore(cfg coreConfig, srv *server) *core {
	ctx, cancel := context.WithCancel(context.Background())
	c := &core{cfg: cfg, srv: srv, ctx: ctx, cancel: cancel,
		events: make(chan event, 1024), wake: make(chan struct{}, 1),
		reqs: make(map[string]*request), dead: make(chan struct{})}
	c.srvRunning.Store(-1)
	c.srvWaiting.Store(-1)
	c.srvKV.Store(nanBits)
	c.touch()
	c.wg.Add(1)
	go c.watchHealth()
	if cfg.MetricsInterval > 0 {
		c.wg.Add(1)
		go c.watchMetrics()
	}
	return c
}

// touch records output now.
func (c *core) touch() { c.lastOutput.Store(time.Now().UnixNano()) }

// post hands an event to the mailbox's next step; false when the core
// closed first.
func (c *core) post(ctx context.Context, ev event) bool {
	select {
	case c.events <- ev:
		return true
	case <-ctx.Done():
		return false
	}
}

// die marks the server dead; the rank restarts and its requests move.
func (c *core) die(err error) {
	c.dieOnce.Do(func() {
		c.deadErr = err
		close(c.dead)
	})
}

// watchHealth asks /health every HealthInterval; two failures in a row
// are a dead server.
func (c *core) watchHealth() {
	defer c.wg.Done()
	t := time.NewTicker(c.cfg.HealthInterval)
	defer t.Stop()
	failed := 0
	for {
		select {
		case <-c.ctx.Done():
			return
		case <-t.C:
		}
		err := c.srv.health(c.ctx, c.cfg.HealthTimeout)
		if c.ctx.Err() != nil {
			return
		}
		if err == nil {
			failed = 0
			continue
		}
		if failed++; failed >= 2 {
			c.die(fmt.Errorf("the server at %s stopped answering /health: %w", c.srv.base, err))
			return
		}
	}
}

func (c *core) Add(nr engine.NewRequest) error {
	sp := nr.Sampling
	if sp.MaxTokens == 0 && c.cfg.MaxModelLen > 0 {
		// Up to the context length, which the server knows as well.
		sp.MaxTokens = c.cfg.MaxModelLen - len(nr.Prompt)
	}
	switch {
	case sp.PromptLogprobs:
		return errors.New("the prompt's log-probabilities are not forwarded to the engine's servers (--engine openai)")
	case sp.Grammar != "" && len(nr.Output) > 0:
		// A server's grammar starts at the start of its output: given
		// the output so far as prompt, it would constrain the rest as a
		// whole answer again.
		return fmt.Errorf("a structured-output request cannot continue on another server after %d tokens of output (--engine openai): its grammar would start again", len(nr.Output))
	case c.cfg.MaxModelLen > 0 && len(nr.Prompt)+len(nr.Output) >= c.cfg.MaxModelLen:
		return fmt.Errorf("the prompt and output so far (%d tokens) leave no room under the model's %d-token context", len(nr.Prompt)+len(nr.Output), c.cfg.MaxModelLen)
	case sp.MaxTokens <= len(nr.Output):
		return fmt.Errorf("the request has all %d of its tokens already", sp.MaxTokens)
	}
	if old := c.reqs[nr.ID]; old != nil {
		old.cancel()
	}
	ctx, cancel := context.WithCancel(c.ctx)
	r := &request{id: nr.ID, client: nr.Client, attempt: nr.Attempt, prompt: nr.Prompt, output: nr.Output,
		sampling: sp, cacheSalt: nr.CacheSalt, cancel: cancel}
	c.reqs[nr.ID] = r
	c.live.Store(int64(len(c.reqs)))
	c.touch()
	c.wg.Add(1)
	go c.stream(ctx, r)
	return nil
}

func (c *core) Abort(ids ...string) {
	for _, id := range ids {
		if r := c.reqs[id]; r != nil {
			c.remove(r)
		}
	}
}

func (c *core) remove(r *request) {
	r.cancel()
	c.forget(r)
}

// forget ends the request for the core, leaving its stream to end.
func (c *core) forget(r *request) {
	delete(c.reqs, r.id)
	c.live.Store(int64(len(c.reqs)))
}

func (c *core) IDs(keep func(client any) bool) []string {
	var ids []string
	for id, r := range c.reqs {
		if keep(r.client) {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	return ids
}

func (c *core) HasWork() bool { return len(c.reqs) > 0 }

func (c *core) Next() engine.Step { return &waitStep{core: c} }

func (c *core) Capabilities() engine.Capabilities { return Capabilities }

func (c *core) Done() <-chan struct{} { return c.dead }

func (c *core) Err() error {
	select {
	case <-c.dead:
		return c.deadErr
	default:
		return nil
	}
}

// Close ends every request and poller and waits for them.
func (c *core) Close() error {
	c.cancel()
	c.wg.Wait()
	return nil
}

// Stats are the rank's load: dpnode's own exact count of the requests in
// flight, split as the server's metrics say (with what it serves other
// clients, while this node has requests there), and its KV use when it
// tells.
func (c *core) Stats() engine.Stats {
	st := c.stats
	n := len(c.reqs)
	running, waiting := c.srvRunning.Load(), c.srvWaiting.Load()
	switch {
	case n == 0:
		// Idle as far as the node knows: the server's figures lag by up
		// to a read of its metrics, and an idle rank reports no more.
	case running < 0 || waiting < 0:
		st.NumRunning = n
	case int(running+waiting) >= n:
		// The server also serves clients other than this node.
		st.NumRunning, st.NumWaiting = int(running), int(waiting)
	default:
		// Requests sent since the server was last read wait.
		st.NumRunning, st.NumWaiting = int(running), n-int(running)
	}
	if kv := bitsFloat(c.srvKV.Load()); kv == kv && n > 0 {
		st.KVUsage = kv
	}
	return st
}

// waitStep is a step of the core: wait for what the streams posted.
type waitStep struct {
	core   *core
	events []event
}

// maxEvents bounds what one step takes, so that a busy rank still
// reports often.
const maxEvents = 4096

func (s *waitStep) Run(ctx context.Context) error {
	c := s.core
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for len(s.events) == 0 {
		select {
		case ev := <-c.events:
			s.events = append(s.events, ev)
		case <-c.dead:
			return c.deadErr
		case <-ctx.Done():
			return ctx.Err()
		case <-c.wake:
			return nil
		case <-tick.C:
			if c.live.Load() == 0 {
				continue
			}
			if idle := time.Since(time.Unix(0, c.lastOutput.Load())); idle > c.cfg.StallTimeout {
				return fmt.Errorf("the server at %s gave no output for %s with %d requests in flight", c.srv.base, idle.Round(time.Second), c.live.Load())
			}
		}
	}
	for len(s.events) < maxEvents {
		select {
		case ev := <-c.events:
			s.events = append(s.events, ev)
		default:
			return s.failure()
		}
	}
	return s.failure()
}

// failure is the first engine error among the step's events.
func (s *waitStep) failure() error {
	for _, ev := range s.events {
		var ee *engineError
		if errors.As(ev.err, &ee) && s.core.reqs[ev.req.id] == ev.req {
			return ee
		}
	}
	return nil
}

func (s *waitStep) Result() (engine.StepResult, bool) { return engine.StepResult{}, false }

// Finish turns the step's events into outputs; events of requests
// aborted meanwhile are dropped. The node's own stops (stop token ids,
// max_tokens) apply to what the server sent, whatever it honours itself.
func (s *waitStep) Finish(outs []engine.Output) []engine.Output {
	c := s.core
	steps := false
	for _, ev := range s.events {
		r := ev.req
		if c.reqs[r.id] != r {
			continue
		}
		if ev.err != nil {
			c.remove(r)
			var re *requestError
			errors.As(ev.err, &re)
			outs = append(outs, engine.Output{ID: r.id, Client: r.client, Attempt: r.attempt, Finish: engine.FinishedError,
				Error: fmt.Sprintf("the engine's server refused the request: %v", ev.err), Refused: re != nil && re.refused})
			continue
		}
		toks, finish := r.take(ev.chunk.tokens, ev.chunk.finish, c.srv.eos)
		if len(toks) == 0 && finish == engine.NotFinished && (ev.chunk.cached < 0 || r.started) {
			continue
		}
		o := engine.Output{ID: r.id, Client: r.client, Attempt: r.attempt, NewTokens: toks, Finish: finish, First: !r.started}
		if r.sampling.Logprobs {
			o.Logprobs = ev.chunk.logprobs[:min(len(toks), len(ev.chunk.logprobs))]
		}
		if ev.chunk.cached > 0 {
			o.NumCachedTokens = ev.chunk.cached
			c.stats.PrefixHits += uint64(ev.chunk.cached)
		}
		if !r.started {
			c.stats.PrefixQueries += uint64(len(r.prompt) + len(r.output))
		}
		r.started = true
		c.stats.ComputedTokens += uint64(len(toks))
		steps = steps || len(toks) > 0
		switch {
		case finish == engine.NotFinished:
		case ev.chunk.finish != engine.NotFinished || finish == engine.FinishedLength:
			// The server ends the stream itself (it was asked for as
			// many tokens): it is read to its end, so that its
			// connection serves the next request, and cut off if it
			// does not end.
			time.AfterFunc(drainTimeout, r.cancel)
			c.forget(r)
		default:
			c.remove(r)
		}
		outs = append(outs, o)
	}
	if steps {
		c.stats.Steps++
	}
	return outs
}

// take applies the request's stops to tokens the server sent: a stop
// token id, or the end-of-generation token of a server whose streams end
// with it, ends the output with it (as dpnode's engines do), and so does
// the max_tokens bound. It returns the tokens to pass on and the finish.
func (r *request) take(toks []uint32, finish engine.FinishReason, eos []uint32) ([]uint32, engine.FinishReason) {
	sp := &r.sampling
	done := len(r.output) + r.generated
	for i, t := range toks {
		if done+i+1 < sp.MinTokens {
			continue
		}
		if slices.Contains(sp.StopTokenIDs, t) || (!sp.IgnoreEOS && slices.Contains(eos, t)) {
			toks, finish = toks[:i+1], engine.FinishedStop
			break
		}
	}
	if left := sp.MaxTokens - done; len(toks) > left || (len(toks) == left && finish == engine.NotFinished) {
		toks, finish = toks[:left], engine.FinishedLength
	}
	r.generated += len(toks)
	return toks, finish
}
