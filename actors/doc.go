// Package actors runs a node as protoactor-go actors: the node actor at the
// root supervises one EngineActor per local data-parallel rank, the
// APIServerActor, and the CoordinatorActor when the node leads. The API
// server watches the engines and decides their restarts, but it is not
// their parent: its crash restarts it alone, and the engines keep their
// models loaded.
//
// The data plane: an engine in the API server's process delivers each
// step's outputs straight to the requests' Streams, from its own mailbox,
// through the attempt (a sink) the API server sent with the request; the
// API server then hears only what its balancer needs (prompts prefilled,
// requests ended, the engine's stats). A remote engine sends one
// StepOutputs message per step to each API server with requests in the
// step, and that API server delivers them the same way. Either way a
// request's tokens arrive in order. A request that loses its engine is
// re-dispatched (no output yet) or migrated with its tokens so far, and
// only its current attempt can deliver, so its stream continues without a
// gap or a duplicate; a request is finished on its stream exactly once.
// No actor blocks on a network write or a step: steps run off the engine's
// mailbox and report back as messages; streams are unbounded queues that
// HTTP handlers drain.
//
// Actors are the I/O shell and read the wall clock; the decisions that
// depend on time (when to publish, which rank) are dp's pure code, which
// takes times as arguments.
package actors
