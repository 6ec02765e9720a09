package actors

import (
	"sync"
	"time"
)

// Event kinds: what an operator watching the cluster page wants to see
// happen.
const (
	EventRestart     = "restart"      // a rank's engine crashed and restarts
	EventRankFailed  = "rank_failed"  // a rank crashed too often and is stopped
	EventMoved       = "moved"        // requests moved off a lost rank
	EventNodeJoined  = "node_joined"  // a member joined gossip
	EventNodeLeft    = "node_left"    // a member left or was declared dead
	EventNodeGone    = "node_gone"    // a member's process was found gone
	EventCoordinator = "coordinator"  // the coordinator moved, or lost its quorum
	EventSize        = "size_changed" // the deployment grew or shrank
)

// maxEvents bounds the events a node keeps: enough for a page's worth of
// history, not a log.
const maxEvents = 200

// ClusterEvent is one thing that happened, as this node saw it.
type ClusterEvent struct {
	At   time.Time `json:"at"`
	Kind string    `json:"kind"`
	// Node is the member concerned, if any.
	Node string `json:"node,omitempty"`
	// Rank is the rank concerned; -1 for none.
	Rank   int    `json:"rank"`
	Detail string `json:"detail"`
}

// eventLog keeps the latest events. Actors add to it; views read it.
type eventLog struct {
	mu     sync.Mutex
	events []ClusterEvent
}

func (l *eventLog) add(kind, node string, rank int, detail string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.events = append(l.events, ClusterEvent{At: time.Now(), Kind: kind, Node: node, Rank: rank, Detail: detail})
	if len(l.events) > maxEvents {
		l.events = l.events[len(l.events)-maxEvents:]
	}
}

// recent returns a copy of the events, oldest first.
func (l *eventLog) recent() []ClusterEvent {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]ClusterEvent(nil), l.events...)
}
