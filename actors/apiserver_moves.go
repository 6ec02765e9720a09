package actors

import (
	"fmt"
	"slices"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	dpnodev1 "github.com/dpnode/dpnode/proto/dpnode/v1"
)

// move sends the calls of a rank that lost its engine to other ranks:
// re-dispatched if they had no output yet, migrated with their tokens so
// far if they had.
func (a *APIServerActor) move(ctx actor.Context, r *rankState, why string) int {
	var moved []*call
	for _, c := range a.calls {
		if c.rank == r {
			moved = append(moved, c)
		}
	}
	// Oldest first, so that the re-dispatch keeps arrival order.
	slices.SortFunc(moved, func(x, y *call) int { return x.sub.Arrival.Compare(y.sub.Arrival) })
	var counts [4]int
	for _, c := range moved {
		counts[a.moveCall(ctx, c)]++
	}
	if len(moved) > 0 {
		a.cfg.Metrics.events.add(EventMoved, r.node, r.rank, fmt.Sprintf("%d requests moved off rank %d (%s): %d migrated with their tokens, %d sent again, %d failed",
			len(moved), r.rank, why, counts[migrated], counts[redispatched], counts[moveFailed]))
	}
	return len(moved)
}

// What became of a moved call.
const (
	moveFailed = iota
	redispatched
	migrated
	moveEnded
)

// moveCall sends a call whose engine lost it elsewhere: again from the
// start if it had no output, or migrated with its tokens so far.
func (a *APIServerActor) moveCall(ctx actor.Context, c *call) int {
	r := c.rank
	a.release(c)
	tokens, done := c.p.detach()
	if done {
		// It ended at a local engine, whose word of it is on its way.
		delete(a.calls, c.sub.ID)
		return moveEnded
	}
	c.moves++
	switch {
	case c.moves > a.cfg.MaxMigrations:
		a.fail(c, fmt.Errorf("%w: %d crashes", ErrTooManyRestarts, c.moves), "too_many_restarts")
		return moveFailed
	case tokens > 0 && !a.cfg.Migration:
		a.fail(c, fmt.Errorf("%w (rank %d, after %d tokens)", ErrEngineLost, r.rank, tokens), "engine_lost")
		return moveFailed
	}
	outcome := redispatched
	if tokens == 0 {
		r.metrics.redispatched.Inc()
	} else {
		r.metrics.migrated.Inc()
		outcome = migrated
	}
	a.dispatch(ctx, c)
	return outcome
}

// reconcileInterval is how often an API server checks that the engines it
// sent requests to hold them.
const reconcileInterval = 5 * time.Second

func (a *APIServerActor) armReconcile() {
	if a.reconcileTimer == nil {
		self, root := a.self, a.root
		a.reconcileTimer = time.AfterFunc(reconcileInterval, func() { root.Send(self, &reconcile{}) })
	}
}

// reconcile asks each engine that holds calls of this API server which it
// holds. A message between nodes can be lost when a connection breaks (a
// peer restarted at the same address, a keepalive timeout); the answer
// shows a call whose request, or whose last output, was lost. Within a
// process nothing is lost, but asking costs one message per engine every
// few seconds, and one rule for every rank is simpler to trust.
func (a *APIServerActor) reconcile(ctx actor.Context) {
	a.reconcileTimer = nil
	now := time.Now()
	asked := map[*rankState]bool{}
	for _, c := range a.calls {
		if r := c.rank; r != nil && !asked[r] {
			asked[r] = true
			r.listAsked = now
			ctx.Request(r.pid, &dpnodev1.ListRequests{})
		}
	}
	if len(asked) > 0 {
		a.armReconcile()
	}
}

// requestList moves the calls an engine does not hold though they were
// sent to it before it was asked: they were lost on the way. Each is
// aborted at the engine first, so that it can never run twice.
func (a *APIServerActor) requestList(ctx actor.Context, msg *dpnodev1.RequestList) {
	r := a.byRank[int(msg.Rank)]
	if r == nil || msg.EngineEpoch != r.epoch.Load() {
		return
	}
	held := make(map[string]bool, len(msg.RequestIds))
	for _, id := range msg.RequestIds {
		held[id] = true
	}
	var lost []*call
	for id, c := range a.calls {
		if c.rank == r && !held[id] && c.dispatchedAt.Before(r.listAsked) {
			lost = append(lost, c)
		}
	}
	slices.SortFunc(lost, func(x, y *call) int { return x.sub.Arrival.Compare(y.sub.Arrival) })
	for _, c := range lost {
		a.cfg.Logger.Warn("a request, or its last output, was lost between this node and its engine; sending it again",
			"rank", r.rank, "request", c.sub.ID, "tokens_so_far", c.p.tokens())
		ctx.Send(r.pid, &dpnodev1.AbortRequests{RequestIds: []string{c.sub.ID}})
		a.moveCall(ctx, c)
	}
}
