package control

import dpnodev1 "github.com/dpnode/dpnode/proto/dpnode/v1"

// MemberEventKind says what happened to a member.
type MemberEventKind int

// The kinds of membership change.
const (
	MemberJoined MemberEventKind = iota
	MemberUpdated
	MemberLeft
)

// MemberEvent is a membership change, as gossip saw it.
type MemberEvent struct {
	Kind MemberEventKind
	Name string
	// Key is the member's identity in the roster (its --node-id, or else
	// its gossip address).
	Key  string
	Meta *dpnodev1.NodeMeta
}
