// Package engine is one rank's serving loop: a scheduler with continuous
// batching in the manner of vLLM's v1 scheduler, a block KV cache with
// prefix caching, and the Executor interface that runs a step.
//
// The scheduler and the KV cache are a pure core: no goroutines, channels,
// sleeps or clocks. Schedule picks the next batch; Update applies what the
// executor produced and returns each request's new tokens. The caller (the
// engine actor) runs one step at a time, so a request's outputs are in
// order, and every request added is eventually finished, aborted or
// preempted and rescheduled.
package engine
