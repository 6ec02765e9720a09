package engine

import (
	"context"
	"time"
)

// Executor runs the model for one step.
//
// Concurrency: the engine calls Execute from one goroutine at a time, off
// the engine actor's mailbox, and never mutates a Batch after handing it
// over. An Executor may keep state between steps; it must return when ctx
// is done.
type Executor interface {
	Execute(ctx context.Context, batch *Batch) (StepResult, error)
}

// ScheduledRequest is one request's part of a step. It is a copy: the
// executor can read it while the scheduler moves on.
type ScheduledRequest struct {
	ID string
	// PromptHash keys deterministic sampling (see PromptHash).
	PromptHash uint64
	Sampling   *SamplingParams
	// NumComputed is how many leading tokens had their KV computed before
	// the step; the step computes NumNewTokens more.
	NumComputed  int
	NumNewTokens int
	// NumPromptTokens counts the prompt's tokens, without any output.
	NumPromptTokens int
	// SampleIndex is the index among the request's output tokens of the
	// token this step samples, or -1 when the step ends inside the prefill
	// (a chunk of a long prompt).
	SampleIndex int
	// Decode is true for a one-token step of a request past its prefill.
	Decode bool
	// Seq is the sequence that holds the request's KV, for an executor
	// that places KV by sequence (SchedulerConfig.SequenceSlots); -1
	// otherwise.
	Seq int32
	// Tokens are the NumNewTokens tokens to compute, for an executor that
	// places KV by sequence. They are nil when the one token to compute is
	// the one the executor itself sampled for Seq in the sequence's
	// previous step: sampled tokens stay where they were sampled.
	Tokens []uint32
	// Prompt and Output are the request's tokens so far, when it samples
	// in this step with penalties or a grammar (Sampling.NeedsHistory),
	// or computes prompt tokens for its prompt log-probabilities (Prompt
	// only); nil otherwise. They are the scheduler's: read, never written.
	Prompt, Output []uint32
}

// Shape is what a step computes, for cost models.
type Shape struct {
	NumPrefillTokens int
	// PrefillContextProduct sums, over prefill chunks, the chunk's tokens
	// times the mean context each of them attends to: the tokens before the
	// chunk plus half the chunk (causal attention within it).
	PrefillContextProduct int64
	NumDecodeSeqs         int
	DecodeContextTokens   int64
}

// Collective describes a step of an expert-parallel group: every rank of
// the group steps together, exchanging expert tokens, so the step lasts as
// long as the slowest rank's.
type Collective struct {
	// Shapes are the group's ranks' shapes in this step, this rank's
	// included; a rank in a dummy step has a zero shape.
	Shapes []Shape
	// TotalTokens is the tokens computed across the group.
	TotalTokens int
	// CrossNode is true when the group spans nodes.
	CrossNode bool
}

// Batch is what one step computes.
type Batch struct {
	// Step counts the engine's steps from 1.
	Step     uint64
	Requests []ScheduledRequest
	Shape
	// Collective is set for a step of an expert-parallel group. A batch
	// with no requests is then a dummy step: the rank has no work but must
	// take part in the collective.
	Collective *Collective
	// SeqOps are the KV moves an executor that places KV by sequence must
	// make, in order, before it computes the step's tokens: cached
	// prefixes copied to new requests' streams, and the KV of finished,
	// aborted or evicted requests given back.
	SeqOps []SeqOp
}

// SeqOpKind is what a SeqOp does.
type SeqOpKind uint8

const (
	// SeqCopy makes sequence Dst's stream a copy of sequence Src's whole
	// stream (P0 and P1 are -1), without computing it again: llama.cpp
	// copies whole streams only.
	SeqCopy SeqOpKind = iota + 1
	// SeqRemove takes positions [P0, P1) out of sequence Dst (P1 of -1:
	// to the end).
	SeqRemove
)

// SeqOp is one KV move of a step.
type SeqOp struct {
	Kind     SeqOpKind
	Src, Dst int32
	P0, P1   int32
}

// Empty reports whether the batch computes nothing.
func (b *Batch) Empty() bool { return len(b.Requests) == 0 }

// NumTokens is the number of tokens the step computes.
func (b *Batch) NumTokens() int {
	n := 0
	for i := range b.Requests {
		n += b.Requests[i].NumNewTokens
	}
	return n
}

// StepResult is what an executor produced.
type StepResult struct {
	// Tokens[i] is the token sampled for Batch.Requests[i]; it is ignored
	// where SampleIndex is -1.
	Tokens []uint32
	// Duration is how long the step took (the modelled time, for the
	// simulated executor).
	Duration time.Duration
	// ComputedTokens counts the tokens the model really computed in the
	// step, as the executor saw it; 0 where the executor does not tell.
	ComputedTokens int
	// ScheduledTokens counts the tokens the step was given: prompt chunks
	// and decodes (Batch.NumTokens); the core sets it.
	ScheduledTokens int
	// Phases split Duration where the executor can tell; zero where it
	// cannot (the simulator).
	Phases StepPhases
	// Logprobs[i], when the slice is not nil, is the log-probabilities of
	// Tokens[i], for a request that asked (Sampling.Logprobs).
	Logprobs []*TokenLogprobs
	// PromptLogprobs[i], when the slice is not nil, is the prompt
	// log-probabilities the step computed for Batch.Requests[i], one per
	// token after each of its first tokens in the step.
	PromptLogprobs [][]*TokenLogprobs
}

// StepPhases are the parts of an executor's step, so that the next
// bottleneck can be read off /metrics.
type StepPhases struct {
	// KVOps is the step's KV moves (Batch.SeqOps).
	KVOps time.Duration
	// Model is the forward pass, until its outputs are ready.
	Model time.Duration
	// Sample is drawing the step's tokens from the model's outputs.
	Sample time.Duration
}

// Limits are what an executor's model can serve under, for executors that
// learn them when the model loads: the engine's scheduler adopts them.
type Limits struct {
	// NumBlocks is the KV cache's capacity in blocks of the scheduler's
	// block size.
	NumBlocks int
	// SequenceSlots is the number of KV streams, one per sequence (0: KV
	// is a pool of blocks).
	SequenceSlots int
	// StreamCells is each stream's capacity in tokens.
	StreamCells int
	// MaxModelLen is the longest sequence the model serves.
	MaxModelLen int
	// MaxBatchTokens is the most tokens a step may compute; 0 for no
	// limit beyond the scheduler's.
	MaxBatchTokens int
	// EOSTokenIDs are the model's end-of-generation tokens.
	EOSTokenIDs []uint32
	// VocabSize bounds the token ids the model takes.
	VocabSize int
}

// Limited is implemented by executors whose model sets the scheduler's
// limits (see Limits).
type Limited interface {
	Limits() Limits
}

// Process is implemented by executors whose model runs in a process of
// its own, which can die between steps.
//
// Concurrency: Done and Err are safe for concurrent use; Close is called
// after the last Execute has returned, and again is harmless.
type Process interface {
	// Done is closed when the process has exited.
	Done() <-chan struct{}
	// Err says why the process exited, once Done is closed.
	Err() error
	// Close stops the process and waits for it.
	Close() error
}
