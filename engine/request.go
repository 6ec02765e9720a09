package engine

import (
	"time"
)

// FinishReason says why a request stopped; the zero value means it has not.
// Its values are the wire's (dpnodev1.FinishReason), which the actors
// convert to and from.
type FinishReason int32

// The finish reasons.
const (
	NotFinished FinishReason = iota
	FinishedStop
	FinishedLength
	FinishedAbort
	FinishedError
)

// String names the reason as OpenAI's API does, "" when not finished.
func (f FinishReason) String() string {
	switch f {
	case FinishedStop:
		return "stop"
	case FinishedLength:
		return "length"
	case FinishedAbort:
		return "abort"
	case FinishedError:
		return "error"
	}
	return ""
}

// SamplingParams are the sampling settings the engine acts on.
type SamplingParams struct {
	// MaxTokens is the most tokens to generate, counting tokens generated
	// before a migration; 0 means up to the context length.
	MaxTokens int
	// MinTokens is the fewest tokens generated before EOS or a stop token
	// may end the request.
	MinTokens   int
	Temperature float32
	TopP        float32
	// TopK keeps the k most likely tokens; 0 keeps them all.
	TopK         int
	Seed         *int64
	IgnoreEOS    bool
	StopTokenIDs []uint32
	// PresencePenalty, FrequencyPenalty and RepetitionPenalty are vLLM's
	// (0, 0 and 0 or 1 are off): over the output's tokens, and for
	// repetition the prompt's too. MinP is off at 0. LogitBias is added to
	// its tokens' logits. The simulated executor, whose text is
	// deterministic, applies none of them.
	PresencePenalty, FrequencyPenalty, RepetitionPenalty float32
	MinP                                                 float32
	LogitBias                                            map[uint32]float32
	// Logprobs asks for each token's log-probability under the model's raw
	// logits, and those of the TopLogprobs most likely tokens (at most
	// MaxTopLogprobs). The simulated executor gives none.
	Logprobs    bool
	TopLogprobs int
	// PromptLogprobs asks for the prompt's log-probabilities, every
	// token's but the first, with TopLogprobs more each: the prompt is
	// then computed whole, in chunks of at most PromptLogprobsChunk, and
	// the prefix cache is not used.
	PromptLogprobs bool
	// PromptRanks, with PromptLogprobs, asks also for each prompt token's
	// rank (vLLM's prompt_logprobs): a second pass over each row.
	PromptRanks bool
	// Grammar, when not empty, constrains the output to a GBNF grammar
	// (start rule root): structured output. The simulated executor cannot
	// honour it; the API server refuses it there.
	Grammar string
}

// PromptLogprobsChunk bounds a prompt chunk whose every token's logits are
// kept (a vocabulary of floats each: 32 MiB for Llama 3's).
const PromptLogprobsChunk = 64

// MaxTopLogprobs bounds SamplingParams.TopLogprobs, as OpenAI's API does.
const MaxTopLogprobs = 20

// TokenLogprobs is a drawn token's log-probability and the most likely
// tokens'.
type TokenLogprobs struct {
	Logprob float32
	// TopTokenIds and TopLogprobs are the most likely tokens, most likely
	// first, and their log-probabilities.
	TopTokenIds []uint32
	TopLogprobs []float32
	// Rank is the token's place among the vocabulary by logit, from 1 for
	// the most likely: set for a prompt's tokens, which vLLM's
	// prompt_logprobs report it for.
	Rank uint32
}

// Penalized reports whether a penalty is on: the executor needs the
// request's tokens to draw.
func (p *SamplingParams) Penalized() bool {
	return p.PresencePenalty != 0 || p.FrequencyPenalty != 0 || (p.RepetitionPenalty != 0 && p.RepetitionPenalty != 1)
}

// NeedsHistory reports whether the executor needs the request's tokens to
// draw its next: a penalty counts them, and a grammar's state follows them.
func (p *SamplingParams) NeedsHistory() bool { return p.Penalized() || p.Grammar != "" }

// MaxStopTokenIDs bounds a request's stop token ids. Every sampled token
// is checked against them in constant time, but a client must not make an
// engine hold (and, in llama.cpp, ban before min_tokens) an unbounded list.
const MaxStopTokenIDs = 1024

// tokenSet is a set of token ids; nil is empty.
type tokenSet map[uint32]struct{}

func newTokenSet(ids []uint32) tokenSet {
	if len(ids) == 0 {
		return nil
	}
	s := make(tokenSet, len(ids))
	for _, id := range ids {
		s[id] = struct{}{}
	}
	return s
}

func (s tokenSet) has(id uint32) bool {
	_, ok := s[id]
	return ok
}

// NewRequest is what a caller hands the scheduler.
type NewRequest struct {
	ID     string
	Prompt []uint32
	// Output holds tokens generated elsewhere before a migration; the
	// request continues after them.
	Output   []uint32
	Sampling SamplingParams
	Arrival  time.Time
	// Client is carried back in every Output of the request, so that the
	// caller can route it without a lookup of its own; so is Attempt.
	Client  any
	Attempt uint32
	// CacheSalt keeps the request's prefix-cache blocks apart from those
	// of requests with another salt (vLLM's cache_salt): a tenant's.
	CacheSalt string
	// BlockHashes, when set, are the hashes of the prompt's leading full
	// blocks (PrefixHashes of Prompt and CacheSalt) as the caller already
	// computed them, so that no block is hashed twice in a process. The
	// scheduler trusts them, and keeps the slice: the caller must not
	// change it.
	BlockHashes []BlockHash
	// PromptHash, when not 0, is PromptHash(Prompt, Sampling.Seed) as
	// the caller already computed it (a simulator, ahead of the engines;
	// a hash that is 0 is computed again, to 0).
	PromptHash uint64
}

// Request is the scheduler's state of one request. Its fields are the
// scheduler's; callers read them only through Output.
//
// The fields every step reads or writes come first, in 192 bytes that
// end after sampling.IgnoreEOS: an engine of hundreds of running
// requests, or a simulation of hundreds of engines, waits on memory more
// than it computes.
type Request struct {
	// numComputed counts leading tokens whose KV is computed.
	numComputed int
	output      []uint32
	blocks      []int32
	// numCachedBlocks counts leading blocks findable by hash.
	numCachedBlocks int32
	// gone is set when the request leaves the scheduler (finished or
	// aborted), possibly while a step that computes it is in flight.
	gone bool
	// executorHasLast is set when the request's last token was sampled by
	// the executor into seq: the next step need not send it.
	executorHasLast bool
	firstScheduled  bool
	reportedFirst   bool
	prompt          []uint32
	id              string
	client          any
	attempt         uint32
	// seq is the KV stream the request holds (SchedulerConfig.
	// SequenceSlots), or noSeq.
	seq int32
	// promptHash keys the executor's deterministic sampling.
	promptHash uint64
	// stops is sampling.StopTokenIDs as a set: it is checked for every
	// token sampled, inside the step every request of the rank waits on.
	stops    tokenSet
	sampling SamplingParams
	// blockHashes holds the hashes of the leading full blocks of
	// prompt+output computed so far; it only grows.
	blockHashes []BlockHash
	arrival     time.Time
	// salt keeps the request's blocks apart from other salts' (its first
	// block's parent is SaltHash(salt)).
	salt string
	// numCachedTokens is the prefix-cache hit of the first schedule, reported
	// with the first output.
	numCachedTokens int
	// queuedAt is when the scheduler took the request; queued is how long
	// it waited for its first schedule, reported with the first output.
	queuedAt time.Time
	queued   time.Duration
	// passedOver counts the prefill steps that passed this request's
	// prefill over for shorter ones (streams only).
	passedOver int
	// promptLogprobs are the prompt's log-probabilities computed so far,
	// given to the caller with the first output.
	promptLogprobs []*TokenLogprobs
}

func (r *Request) numTokens() int { return len(r.prompt) + len(r.output) }

// tokens returns a copy of the request's tokens [from, to) of prompt and
// output.
func (r *Request) tokens(from, to int) []uint32 {
	out := make([]uint32, 0, to-from)
	if from < len(r.prompt) {
		out = append(out, r.prompt[from:min(to, len(r.prompt))]...)
	}
	if to > len(r.prompt) {
		out = append(out, r.output[max(from-len(r.prompt), 0):to-len(r.prompt)]...)
	}
	return out
}

func (r *Request) tokenAt(i int) uint32 {
	if i < len(r.prompt) {
		return r.prompt[i]
	}
	return r.output[i-len(r.prompt)]
}

// extendHashes computes the hashes of the first n full blocks.
func (r *Request) extendHashes(blockSize, n int) {
	if n*blockSize > r.numTokens() {
		panic("engine: hashing a block that is not full")
	}
	var buf []uint32
	for i := len(r.blockHashes); i < n; i++ {
		from, to := i*blockSize, (i+1)*blockSize
		var block []uint32
		switch p := len(r.prompt); {
		case to <= p:
			block = r.prompt[from:to]
		case from >= p:
			block = r.output[from-p : to-p]
		default:
			// The block that spans the end of the prompt.
			buf = buf[:0]
			for j := from; j < to; j++ {
				buf = append(buf, r.tokenAt(j))
			}
			block = buf
		}
		var parent BlockHash
		if i > 0 {
			parent = r.blockHashes[i-1]
		} else {
			parent = SaltHash(r.salt)
		}
		r.blockHashes = append(r.blockHashes, HashBlock(parent, block))
	}
}

// PromptHash is the key of deterministic sampling: a hash of the prompt's
// tokens and the request's seed, so that token i of a request depends only
// on the prompt, the seed and i, wherever it runs.
func PromptHash(prompt []uint32, seed *int64) uint64 {
	var s uint64
	if seed != nil {
		s = uint64(*seed)
	}
	return fnvTokens(s, prompt)
}

// keepsPromptLogits reports whether req's next prefill keeps the logits of
// its prompt tokens, for its prompt log-probabilities.
func (req *Request) keepsPromptLogits() bool {
	return req.sampling.PromptLogprobs && req.numComputed < len(req.prompt)-1
}
