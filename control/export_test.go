package control

// Delegate is the memberlist delegate, for the tests of package
// control_test: FuzzGossipMeta hands its events to a running node of
// package actors, which imports this one.
type Delegate = delegate

// NewDelegate is the delegate of a node with cfg whose gossip address is
// addr, as StartMembership makes it.
func NewDelegate(cfg MembershipConfig, addr string) *Delegate {
	d := newDelegate(cfg, nil, 4)
	d.setAddr(addr)
	return d
}
