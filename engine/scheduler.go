package engine

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"
)

// Errors a request can be refused with.
var (
	ErrEmptyPrompt = errors.New("engine: the prompt has no tokens")
	ErrTooLong     = errors.New("engine: the request does not fit in the model's context length")
	ErrDuplicateID = errors.New("engine: a request with this id is already in the engine")
	// ErrBadToken: a token id outside the model's vocabulary, which
	// llama.cpp would fail the whole step on.
	ErrBadToken     = errors.New("engine: a token id is outside the model's vocabulary")
	ErrTooManyStops = errors.New("engine: too many stop token ids")
)

// SchedulerConfig sizes one engine's batching and KV cache.
type SchedulerConfig struct {
	// MaxNumSeqs bounds the requests in a step (--max-num-seqs); vLLM's
	// default of 256 keeps decode steps in the memory-bound regime.
	MaxNumSeqs int
	// MaxNumBatchedTokens is the token budget of a step
	// (--max-num-batched-tokens); long prompts are prefilled in chunks of
	// at most this many tokens, which bounds how long a step stalls decodes.
	MaxNumBatchedTokens int
	// BlockSize is the number of tokens in a KV block; 16 as in vLLM.
	BlockSize int
	// NumBlocks is the number of KV blocks on the GPU.
	NumBlocks int
	// MaxModelLen is the context length: prompt plus output.
	MaxModelLen int
	// EnablePrefixCaching keeps freed blocks findable by their tokens.
	EnablePrefixCaching bool
	// EOSTokenIDs end a request when sampled, unless it ignores EOS: the
	// model's whole set of end-of-generation tokens (Llama 3 ends a turn
	// with <|eot_id|> and a text with <|end_of_text|>).
	EOSTokenIDs []uint32
	// VocabSize, when not 0, bounds every token id a request may carry.
	VocabSize int
	// SequenceSlots, when not 0, places KV in this many per-sequence
	// streams of StreamCells tokens each instead of a pool of blocks, for
	// an executor that keeps KV so (llama.cpp): every running request
	// holds a stream, and so does every finished request whose blocks the
	// prefix cache keeps, until its stream is needed (see streamKV). Steps
	// then carry the token ids to compute and the stream moves to make
	// (Batch.SeqOps). 0, the simulated executor's setting, keeps a pool
	// of NumBlocks blocks.
	SequenceSlots int
	// StreamCells is each stream's capacity in tokens, at least
	// MaxModelLen; with SequenceSlots only.
	StreamCells int
}

// DefaultSchedulerConfig is vLLM's default for one H100 serving an 8B model.
func DefaultSchedulerConfig() SchedulerConfig {
	return SchedulerConfig{
		MaxNumSeqs:          256,
		MaxNumBatchedTokens: 8192,
		BlockSize:           16,
		NumBlocks:           25600,
		MaxModelLen:         32768,
		EnablePrefixCaching: true,
	}
}

// Validate rejects a configuration that could never serve a request.
func (c SchedulerConfig) Validate() error {
	switch {
	case c.MaxNumSeqs < 1:
		return fmt.Errorf("engine: --max-num-seqs must be at least 1, got %d", c.MaxNumSeqs)
	case c.MaxNumBatchedTokens < 1:
		return fmt.Errorf("engine: --max-num-batched-tokens must be at least 1, got %d", c.MaxNumBatchedTokens)
	case c.MaxNumBatchedTokens < c.MaxNumSeqs:
		return fmt.Errorf("engine: --max-num-batched-tokens (%d) must be at least --max-num-seqs (%d), so that every running sequence can decode in a step", c.MaxNumBatchedTokens, c.MaxNumSeqs)
	case c.BlockSize < 1:
		return fmt.Errorf("engine: block size must be at least 1, got %d", c.BlockSize)
	case c.MaxModelLen < 2:
		return fmt.Errorf("engine: max model length must be at least 2, got %d", c.MaxModelLen)
	case ceilDiv(c.MaxModelLen, c.BlockSize) > c.NumBlocks:
		return fmt.Errorf("engine: the KV cache (%d blocks of %d tokens) cannot hold one sequence of the max model length %d; lower the max model length", c.NumBlocks, c.BlockSize, c.MaxModelLen)
	case c.SequenceSlots < 0:
		return fmt.Errorf("engine: sequence slots must not be negative, got %d", c.SequenceSlots)
	case c.SequenceSlots > 0 && c.SequenceSlots < c.MaxNumSeqs:
		return fmt.Errorf("engine: --max-num-seqs (%d) must be at most the model's %d sequence slots", c.MaxNumSeqs, c.SequenceSlots)
	case c.SequenceSlots > 0 && c.StreamCells < c.MaxModelLen:
		return fmt.Errorf("engine: a KV stream of %d tokens cannot hold one sequence of the max model length %d", c.StreamCells, c.MaxModelLen)
	}
	return nil
}

// WithLimits returns c under an executor's limits: its KV capacity,
// sequence slots and end tokens, and its context length and step size
// where those are smaller. The result must pass Validate.
// KVTokens is how many tokens the KV cache holds: its streams' cells, or
// its blocks'.
func (c SchedulerConfig) KVTokens() int {
	if c.SequenceSlots > 0 {
		return c.SequenceSlots * c.StreamCells
	}
	return c.NumBlocks * c.BlockSize
}

func (c SchedulerConfig) WithLimits(l Limits) (SchedulerConfig, error) {
	c.NumBlocks = l.NumBlocks
	c.SequenceSlots, c.StreamCells = l.SequenceSlots, l.StreamCells
	if l.MaxModelLen > 0 && l.MaxModelLen < c.MaxModelLen {
		c.MaxModelLen = l.MaxModelLen
	}
	if c.SequenceSlots > 0 && c.StreamCells < c.MaxModelLen {
		c.MaxModelLen = c.StreamCells
	}
	if l.MaxBatchTokens > 0 && l.MaxBatchTokens < c.MaxNumBatchedTokens {
		c.MaxNumBatchedTokens = l.MaxBatchTokens
	}
	if len(l.EOSTokenIDs) > 0 {
		c.EOSTokenIDs = slices.Clone(l.EOSTokenIDs)
	}
	if l.VocabSize > 0 {
		c.VocabSize = l.VocabSize
	}
	if c.SequenceSlots > 0 && c.MaxNumSeqs > c.SequenceSlots {
		c.MaxNumSeqs = c.SequenceSlots
	}
	return c, c.Validate()
}

// Output is what a step produced for one request.
type Output struct {
	ID      string
	Client  any
	Attempt uint32
	// NewTokens are the tokens sampled since the previous output.
	NewTokens []uint32
	Finish    FinishReason
	// NumCachedTokens is the prefix-cache hit, on the first output only.
	NumCachedTokens int
	// Queued is how long the request waited in this engine before its
	// first step, by the wall clock, on the first output only (vLLM's
	// queue time).
	Queued time.Duration
	// First marks the request's first output from this engine.
	First bool
	// Logprobs are NewTokens' log-probabilities, when the request asked.
	Logprobs []*TokenLogprobs
	// PromptLogprobs are the prompt's, on the first output of a request
	// that asked (Sampling.PromptLogprobs).
	PromptLogprobs []*TokenLogprobs
	// Error says why a request finished with FinishedError, for its
	// client.
	Error string
	// Refused marks an Error that is the request's own fault, as the
	// engine's server answered it (a 4xx): the client gets a 400, which it
	// should not send again as it is.
	Refused bool
}

// Stats is an engine's load after a step.
type Stats struct {
	NumWaiting int
	NumRunning int
	// KVUsage is the share of KV blocks held by requests.
	KVUsage float64
	// Cumulative prompt tokens looked up in the prefix cache, and found.
	PrefixQueries  uint64
	PrefixHits     uint64
	NumPreemptions uint64
	Steps          uint64
	// ComputedTokens counts the tokens the executor computed (see
	// StepResult.ComputedTokens).
	ComputedTokens uint64
}

// Scheduler decides what each step computes: continuous batching over a
// waiting and a running queue with a token budget per step, chunked prefill,
// a block KV cache with prefix caching, and preemption by recompute when
// blocks run out. It is not safe for concurrent use.
type Scheduler struct {
	cfg      SchedulerConfig
	kv       kvSpace
	requests map[string]*Request
	// eos is cfg.EOSTokenIDs as a set.
	eos tokenSet
	// waiting is in admission order; preempted requests go back to its
	// front. running is in the order requests were admitted, so the last
	// is the first preempted.
	waiting []*Request
	running []*Request
	stats   Stats
	// scheduled is the batch of the step in flight, in Batch order; Update
	// consumes it, and keeps its array in spare for the next step.
	scheduled []*Request
	spare     []*Request
	// finishes holds Update's finish reasons, by the batch's order.
	finishes []FinishReason
	// lastPrefill is set when the last step was a prefill step (streams
	// only); candidates is scheduleStreams' buffer.
	lastPrefill bool
	candidates  []*Request
	// now is the wall clock, for the requests' queue times.
	now func() time.Time
}

// NewScheduler returns a scheduler; cfg must pass Validate.
func NewScheduler(cfg SchedulerConfig) (*Scheduler, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s := &Scheduler{
		cfg:      cfg,
		eos:      newTokenSet(cfg.EOSTokenIDs),
		requests: make(map[string]*Request),
		now:      time.Now,
	}
	if cfg.SequenceSlots > 0 {
		s.kv = newStreamKV(cfg.SequenceSlots, cfg.StreamCells, cfg.BlockSize, cfg.MaxNumSeqs, cfg.EnablePrefixCaching)
	} else {
		s.kv = newKVCache(cfg.NumBlocks, cfg.BlockSize, cfg.EnablePrefixCaching)
	}
	return s, nil
}

// Config returns the scheduler's configuration.
func (s *Scheduler) Config() SchedulerConfig { return s.cfg }

// Add queues a request, or refuses it with an error a client can read.
func (s *Scheduler) Add(nr NewRequest) error {
	total := len(nr.Prompt) + len(nr.Output)
	switch {
	case len(nr.Prompt) == 0:
		return ErrEmptyPrompt
	case s.requests[nr.ID] != nil:
		return fmt.Errorf("%w: %q", ErrDuplicateID, nr.ID)
	case total >= s.cfg.MaxModelLen:
		return fmt.Errorf("%w: %d tokens of prompt and output so far, context length %d", ErrTooLong, total, s.cfg.MaxModelLen)
	case nr.Sampling.MaxTokens > 0 && len(nr.Output) >= nr.Sampling.MaxTokens:
		return fmt.Errorf("engine: request %q already has its %d tokens", nr.ID, nr.Sampling.MaxTokens)
	case len(nr.Sampling.StopTokenIDs) > MaxStopTokenIDs:
		return fmt.Errorf("%w: %d stop token ids, at most %d", ErrTooManyStops, len(nr.Sampling.StopTokenIDs), MaxStopTokenIDs)
	}
	if v := s.cfg.VocabSize; v > 0 {
		for _, ids := range [][]uint32{nr.Prompt, nr.Output, nr.Sampling.StopTokenIDs} {
			if i := slices.IndexFunc(ids, func(id uint32) bool { return id >= uint32(v) }); i >= 0 {
				return fmt.Errorf("%w: %d, vocabulary size %d", ErrBadToken, ids[i], v)
			}
		}
	}
	req := &Request{
		id:         nr.ID,
		prompt:     nr.Prompt,
		output:     slices.Clone(nr.Output),
		sampling:   nr.Sampling,
		client:     nr.Client,
		attempt:    nr.Attempt,
		arrival:    nr.Arrival,
		promptHash: nr.PromptHash,
		salt:       nr.CacheSalt,
		stops:      newTokenSet(nr.Sampling.StopTokenIDs),
		seq:        noSeq,
		queuedAt:   s.now(),
	}
	if req.promptHash == 0 {
		req.promptHash = PromptHash(nr.Prompt, nr.Sampling.Seed)
	}
	if n := len(nr.BlockHashes); n > 0 && n <= len(nr.Prompt)/s.cfg.BlockSize {
		// Capacity cut to the length: the request's own blocks append to
		// a copy, never into the caller's array.
		req.blockHashes = nr.BlockHashes[:n:n]
	}
	s.requests[req.id] = req
	s.waiting = append(s.waiting, req)
	return nil
}

// Abort removes requests and frees their blocks; unknown ids are ignored,
// since a request may finish while its abort is on the way.
func (s *Scheduler) Abort(ids ...string) {
	for _, id := range ids {
		req := s.requests[id]
		if req == nil {
			continue
		}
		s.remove(req)
	}
}

func (s *Scheduler) remove(req *Request) {
	delete(s.requests, req.id)
	req.gone = true
	s.kv.release(req)
	s.waiting = slices.DeleteFunc(s.waiting, func(r *Request) bool { return r == req })
	s.running = slices.DeleteFunc(s.running, func(r *Request) bool { return r == req })
}

// IDs lists the ids of the requests whose client satisfies client.
func (s *Scheduler) IDs(client func(any) bool) []string {
	var ids []string
	for id, r := range s.requests {
		if client(r.client) {
			ids = append(ids, id)
		}
	}
	return ids
}

// HasWork reports whether any request waits or runs.
func (s *Scheduler) HasWork() bool { return len(s.requests) > 0 }

// Len is the number of requests in the engine.
func (s *Scheduler) Len() int { return len(s.requests) }

// Stats returns the engine's load now.
func (s *Scheduler) Stats() Stats {
	st := s.stats
	st.NumWaiting = len(s.waiting)
	st.NumRunning = len(s.running)
	st.KVUsage = s.kv.usage()
	return st
}

// Schedule picks the next step's batch: in vLLM's order with a pool of
// blocks (scheduleBlocks), prefill and decode steps apart with KV in
// streams (scheduleStreams). Schedule must be followed by Update before
// it is called again.
func (s *Scheduler) Schedule() *Batch {
	return s.ScheduleInto(&Batch{})
}

// ScheduleInto is Schedule writing the batch into batch, over what it
// held, and returning it: a caller done with each batch when Update
// returns (a simulator) can keep one for every step.
func (s *Scheduler) ScheduleInto(batch *Batch) *Batch {
	if s.scheduled != nil {
		panic("engine: Schedule called with a step in flight")
	}
	budget := s.cfg.MaxNumBatchedTokens
	// Most steps take every running request and admit a few waiting.
	clear(batch.Requests) // the last step's: none outlives its step
	*batch = Batch{Step: s.stats.Steps + 1, Requests: slices.Grow(batch.Requests[:0], len(s.running)+min(len(s.waiting), 8))}
	if s.cfg.SequenceSlots > 0 {
		s.scheduleStreams(batch, budget)
	} else {
		s.scheduleBlocks(batch, budget)
	}
	if len(s.scheduled) == 0 && s.HasWork() {
		panic("engine: requests are waiting but none could be scheduled; the config check should have made that impossible")
	}
	if len(s.scheduled) > 0 {
		s.stats.Steps++
	}
	batch.SeqOps = s.kv.takeOps()
	return batch
}

// scheduleBlocks is vLLM's order: running requests first (one decode
// token each, or their next prefill chunk), preempting the most recently
// admitted when blocks run out; then waiting requests in arrival order
// while the budget, the sequence limit and the blocks allow.
func (s *Scheduler) scheduleBlocks(batch *Batch, budget int) {
	preemptionsBefore := s.stats.NumPreemptions
	for i := 0; i < len(s.running) && budget > 0; {
		req := s.running[i]
		n := min(req.numTokens()-req.numComputed, budget)
		if !s.allocateRunning(req, n) {
			break
		}
		s.add(batch, req, n)
		budget -= n
		i++
	}
	// vLLM admits nothing in a step that had to preempt: the blocks are
	// short, and a new request would only be preempted next.
	if s.stats.NumPreemptions != preemptionsBefore {
		return
	}
	for len(s.waiting) > 0 && budget > 0 && len(s.running) < s.cfg.MaxNumSeqs {
		n, ok := s.admit(0, budget)
		if !ok {
			break
		}
		s.add(batch, s.running[len(s.running)-1], n)
		budget -= n
	}
}

// admit moves waiting request i to the running queue, with KV for its
// cached prefix and up to budget tokens more, and returns the tokens to
// compute; false when its KV cannot be had now.
func (s *Scheduler) admit(i, budget int) (int, bool) {
	req := s.waiting[i]
	cached, n, ok := s.kv.admit(req, budget)
	if !ok {
		return 0, false
	}
	req.numComputed = cached
	s.stats.PrefixQueries += uint64(req.numTokens())
	s.stats.PrefixHits += uint64(cached)
	if !req.firstScheduled {
		req.firstScheduled = true
		req.numCachedTokens = cached
		req.queued = s.now().Sub(req.queuedAt)
	}
	s.waiting = slices.Delete(s.waiting, i, i+1)
	s.running = append(s.running, req)
	return n, true
}

// maxPassedOver bounds the prefill steps a request's prefill may be passed
// over for shorter ones: then it goes first.
const maxPassedOver = 8

// scheduleStreams is the order for KV in streams (llama.cpp), where a
// step of decodes and prefill chunks costs what a step of the decodes and
// one of the chunks cost: llama.cpp computes sequences of unequal token
// counts in passes of their own. A step is then either prefill or
// decodes. Prefill goes first, so that a request's first token does not
// wait for the others' decodes; decodes run at least every other step,
// so that they wait for no more than one prefill step. A prefill step
// takes the requests with the least prompt left to compute first, running
// or waiting, so that a short prompt does not wait behind a long one's
// chunks; one passed over maxPassedOver times goes first.
func (s *Scheduler) scheduleStreams(batch *Batch, budget int) {
	decodes, prefills := false, len(s.waiting) > 0 && len(s.running) < s.cfg.MaxNumSeqs
	for _, req := range s.running {
		if req.numTokens()-req.numComputed > 1 {
			prefills = true
		} else {
			decodes = true
		}
	}
	if prefills && !(decodes && s.lastPrefill) {
		s.lastPrefill = true
		s.schedulePrefill(batch, budget)
		if len(batch.Requests) > 0 {
			return
		}
	}
	s.lastPrefill = false
	for _, req := range s.running {
		if req.numTokens()-req.numComputed == 1 {
			s.kv.grow(req, 1)
			s.add(batch, req, 1)
		}
	}
}

// schedulePrefill fills a prefill step of scheduleStreams.
func (s *Scheduler) schedulePrefill(batch *Batch, budget int) {
	// Candidates: running requests in their prefill, then the waiting
	// ones that may start; by their tokens left to compute.
	cands := s.candidates[:0]
	for _, req := range s.running {
		if req.numTokens()-req.numComputed > 1 {
			cands = append(cands, req)
		}
	}
	for _, req := range s.waiting[:min(len(s.waiting), s.cfg.MaxNumSeqs-len(s.running))] {
		cands = append(cands, req)
	}
	slices.SortStableFunc(cands, func(a, b *Request) int {
		if sa, sb := a.passedOver >= maxPassedOver, b.passedOver >= maxPassedOver; sa != sb {
			if sa {
				return -1
			}
			return 1
		}
		return cmp.Compare(a.numTokens()-a.numComputed, b.numTokens()-b.numComputed)
	})
	// The step's prompt tokens whose logits are kept, for prompt
	// log-probabilities: at most a chunk, which the worker's output
	// buffer holds beside a row per sequence.
	logitsLeft := PromptLogprobsChunk
	for _, req := range cands {
		limit := math.MaxInt
		if req.keepsPromptLogits() {
			limit = logitsLeft
		}
		if budget == 0 || limit == 0 {
			req.passedOver++
			continue
		}
		if req.keepsPromptLogits() {
			// Taken now: the chunk below is at most limit.
			logitsLeft -= min(limit, budget, req.numTokens()-req.numComputed)
		}
		if req.seq != noSeq {
			n := min(req.numTokens()-req.numComputed, budget, limit)
			s.kv.grow(req, n)
			s.add(batch, req, n)
			budget -= n
			req.passedOver = 0
			continue
		}
		i := slices.Index(s.waiting, req)
		if len(s.running) >= s.cfg.MaxNumSeqs {
			req.passedOver++
			continue
		}
		n, ok := s.admit(i, min(budget, limit))
		if !ok {
			req.passedOver++
			continue
		}
		s.add(batch, req, n)
		budget -= n
		req.passedOver = 0
	}
	clear(cands)
	s.candidates = cands[:0]
}

func (s *Scheduler) add(batch *Batch, req *Request, n int) {
	total := req.numTokens()
	sr := ScheduledRequest{
		ID:              req.id,
		PromptHash:      req.promptHash,
		Sampling:        &req.sampling,
		NumComputed:     req.numComputed,
		NumNewTokens:    n,
		NumPromptTokens: len(req.prompt),
		SampleIndex:     -1,
		Decode:          n == 1 && req.numComputed == total-1 && len(req.output) > 0,
		Seq:             req.seq,
	}
	if req.seq != noSeq && !(sr.Decode && req.executorHasLast) {
		sr.Tokens = req.tokens(req.numComputed, req.numComputed+n)
	}
	if req.numComputed+n == total {
		sr.SampleIndex = len(req.output)
		if req.sampling.NeedsHistory() {
			sr.Prompt, sr.Output = req.prompt, req.output
		}
	}
	if req.sampling.PromptLogprobs && req.numComputed < len(req.prompt)-1 {
		sr.Prompt = req.prompt
	}
	if sr.Decode {
		batch.NumDecodeSeqs++
		batch.DecodeContextTokens += int64(total)
	} else {
		batch.NumPrefillTokens += n
		batch.PrefillContextProduct += int64(n) * (int64(req.numComputed) + int64(n)/2)
	}
	batch.Requests = append(batch.Requests, sr)
	if s.scheduled == nil {
		s.scheduled = s.spare[:0]
	}
	s.scheduled = append(s.scheduled, req)
}

// allocateRunning finds blocks for a running request's next n tokens,
// preempting from the back of the running queue until they fit. It reports
// false when req itself had to be preempted.
func (s *Scheduler) allocateRunning(req *Request, n int) bool {
	for !s.kv.grow(req, n) {
		victim := s.running[len(s.running)-1]
		s.preempt(victim)
		if victim == req {
			return false
		}
	}
	return true
}

// preempt frees a running request's blocks and puts it back at the front
// of the waiting queue; it will recompute its tokens (mostly from the
// prefix cache) when admitted again.
func (s *Scheduler) preempt(req *Request) {
	s.running = slices.DeleteFunc(s.running, func(r *Request) bool { return r == req })
	s.kv.release(req)
	req.numComputed = 0
	req.executorHasLast = false
	s.stats.NumPreemptions++
	s.waiting = slices.Insert(s.waiting, 0, req)
	// A request preempted after being scheduled in this step would be
	// computed with blocks it no longer holds.
	if i := slices.Index(s.scheduled, req); i >= 0 {
		panic(fmt.Sprintf("engine: preempted request %q already in the batch at %d", req.id, i))
	}
}

// Update applies the result of the step Schedule returned and reports each
// request's new tokens and finish. Requests aborted while the step ran are
// skipped.
func (s *Scheduler) Update(batch *Batch, res StepResult) []Output {
	return s.AppendUpdate(make([]Output, 0, len(s.scheduled)), batch, res)
}

// AppendUpdate is Update appending the outputs to outs: a caller that is
// done with them before the next step can keep one slice for every step.
func (s *Scheduler) AppendUpdate(outs []Output, batch *Batch, res StepResult) []Output {
	scheduled := s.scheduled
	s.scheduled = nil
	if len(scheduled) != len(batch.Requests) {
		panic("engine: Update with a batch that is not the one in flight")
	}
	// One array holds every output's new token: an allocation per step,
	// not per request.
	newTokens := make([]uint32, len(scheduled))
	s.finishes = slices.Grow(s.finishes[:0], len(scheduled))[:len(scheduled)]
	finished := false
	s.stats.ComputedTokens += uint64(res.ComputedTokens)
	// Two passes: first each request's own state, then the KV cache and
	// the outputs. A step's requests were last touched a whole step ago,
	// after every other rank's step in a simulation of hundreds, so their
	// state is rarely in the cache; in a loop this short the processor
	// waits for the loads of many requests at once, rather than for each
	// in turn. The second pass meets the cache, the requests and the
	// finishes in the order one pass would.
	for i, req := range scheduled {
		if req.gone {
			continue
		}
		sr := &batch.Requests[i]
		req.numComputed += sr.NumNewTokens
		if res.PromptLogprobs != nil && res.PromptLogprobs[i] != nil {
			req.promptLogprobs = append(req.promptLogprobs, res.PromptLogprobs[i]...)
		}
		if sr.SampleIndex < 0 {
			continue
		}
		tok := res.Tokens[i]
		req.output = append(req.output, tok)
		req.executorHasLast = true
		newTokens[i] = tok
		s.finishes[i] = s.checkStop(req, tok)
	}
	for i, req := range scheduled {
		if req.gone {
			continue
		}
		s.kv.computed(req)
		if batch.Requests[i].SampleIndex < 0 {
			continue
		}
		out := Output{ID: req.id, Client: req.client, Attempt: req.attempt, NewTokens: newTokens[i : i+1 : i+1], Finish: s.finishes[i]}
		if req.sampling.Logprobs && res.Logprobs != nil && res.Logprobs[i] != nil {
			out.Logprobs = res.Logprobs[i : i+1 : i+1]
		}
		if req.promptLogprobs != nil {
			out.PromptLogprobs, req.promptLogprobs = req.promptLogprobs, nil
		}
		if !req.reportedFirst {
			req.reportedFirst = true
			out.First = true
			out.NumCachedTokens = req.numCachedTokens
			out.Queued = req.queued
		}
		if out.Finish != NotFinished {
			finished = true
			delete(s.requests, req.id)
			req.gone = true
			s.kv.release(req)
		}
		outs = append(outs, out)
	}
	if finished {
		s.running = slices.DeleteFunc(s.running, func(r *Request) bool { return r.gone })
	}
	if scheduled != nil {
		clear(scheduled)
		s.spare = scheduled[:0]
	}
	return outs
}

func (s *Scheduler) checkStop(req *Request, tok uint32) FinishReason {
	n := len(req.output)
	sp := &req.sampling
	if n >= sp.MinTokens {
		if !sp.IgnoreEOS && s.eos.has(tok) {
			return FinishedStop
		}
		if req.stops.has(tok) {
			return FinishedStop
		}
	}
	if sp.MaxTokens > 0 && n >= sp.MaxTokens {
		return FinishedLength
	}
	if req.numTokens() >= s.cfg.MaxModelLen {
		return FinishedLength
	}
	return NotFinished
}
