package actors

import (
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/dpnode/dpnode/control"
	"github.com/dpnode/dpnode/engine"
	dpnodev1 "github.com/dpnode/dpnode/proto/dpnode/v1"
)

// AnyRank lets the API server choose the rank of a request.
const AnyRank = -1

// Submission asks the API server to serve one request of a client call.
// It never leaves the process: the Stream is a local queue.
type Submission struct {
	// ID is unique among the node's requests in flight.
	ID       string
	Prompt   []uint32
	Sampling engine.SamplingParams
	// Rank pins the request to a rank (X-data-parallel-rank), or is AnyRank.
	Rank int
	// Stream receives the request's events, tagged with Index.
	Stream *Stream
	Index  int
	// Arrival is when the client call arrived, for latency metrics.
	Arrival time.Time
	// CacheSalt keeps the request's prefix-cache blocks apart from other
	// salts' (engine.NewRequest.CacheSalt).
	CacheSalt string
	// Whole means the caller reads only the request's end (a whole
	// response, with no stop string to look for as tokens come): its
	// stream gets one event when it finishes, with every output token,
	// rather than one per step.
	Whole bool
}

// Abort cancels a request: its client went away, or a stop string
// matched. Its stream gets no further events.
type Abort struct {
	ID string
}

// Outcome is how a request ended for its client, recorded once per request
// where its output is processed (the stop strings matched, the text
// decoded): only there is the finish reason the client saw known.
type Outcome struct {
	// Rank served the request's last tokens; -1 when none did.
	Rank         int
	Reason       engine.FinishReason
	PromptTokens int
	// Latency is from arrival to the end.
	Latency time.Duration
	// Of a request that finished (stop or length): the tokens it
	// generated, from arrival to its first token, and how long its engine
	// kept it waiting before its first step.
	GenerationTokens int
	FirstToken       time.Duration
	Queued           time.Duration
	// MaxTokens is the max_tokens the client asked, 0 when it did not.
	MaxTokens int
	// N is the call's n on the last of a prompt's n requests to finish,
	// with MaxGenerationTokens the most any of them generated; 0 on the
	// others.
	N, MaxGenerationTokens int
}

// awaitReady asks the API server to answer with ready once all of its
// engines have started.
type awaitReady struct{}

// ready answers awaitReady; err says why an engine could not start.
type ready struct {
	err error
}

// reconcile fires when an API server checks its calls on remote ranks.
type reconcile struct{}

// retryHosts fires when members whose connection broke may be reachable
// again.
type retryHosts struct{}

// failAll ends every request in flight with err: a drain's deadline
// passed.
type failAll struct {
	err error
}

// getView asks the API server for its ranks, for /v1/cluster.
type getView struct{}

// engineFailed tells the API server that one of the node's engines
// crashed (the node actor supervises them); restart brings the engine
// back.
type engineFailed struct {
	rank    int
	reason  any
	restart func()
	// stop stops the engine for good, when it crashed too often.
	stop func()
}

// attachEngine asks a local engine to tell the API server that has just
// started what it needs of it (see EngineActor.attach).
type attachEngine struct{}

// expireParked fires when the oldest parked request may have waited too
// long for a rank.
type expireParked struct{}

// coordinatorTick wakes the coordinator when a snapshot may be due.
type coordinatorTick struct {
	gen uint64
}

// The node actor's own messages.

type getChildren struct{}

type children struct {
	apiServer *actor.PID
}

// nodeUp and nodeDown tell the API server about other nodes.
type nodeUp struct {
	name string
	meta *dpnodev1.NodeMeta
}

type nodeDown struct {
	name string
}

// coordinatorStarted tells the node that its coordinator (re)started and
// must be told to everyone.
type coordinatorStarted struct{}

type membershipReady struct{}

// apiServerStarted asks the node actor to tell a (re)started API server
// what it knows: the members and the coordinator.
type apiServerStarted struct{}

// endpointLost tells the node that the actor transport lost its
// connection to a peer's address; peerGone, that the peer's port refused
// a connection since: its process is gone.
type endpointLost struct {
	address string
}

type peerGone struct {
	name, address string
	err           error
}

// dropRanks tells the coordinator that ranks left the cluster.
type dropRanks struct {
	ranks []int
}

type getMembers struct{}

// rosterChanged tells the node actor that Node.roster moved on.
type rosterChanged struct{}

// claimRanks is a node's claim, for the leader to decide.
type claimRanks struct {
	claim   control.Claim
	release bool
}
