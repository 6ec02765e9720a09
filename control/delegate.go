package control

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
	"google.golang.org/protobuf/proto"

	"github.com/dpnode/dpnode/dp"
	dpnodev1 "github.com/dpnode/dpnode/proto/dpnode/v1"
)

// rosterBroadcast is a roster on its way through gossip; a newer one
// replaces it in the queue.
type rosterBroadcast []byte

func (b rosterBroadcast) Invalidates(other memberlist.Broadcast) bool {
	_, ok := other.(rosterBroadcast)
	return ok
}
func (b rosterBroadcast) Message() []byte { return b }
func (b rosterBroadcast) Finished()       {}

// delegate is memberlist's view of this node. Its callbacks run on
// memberlist's goroutines: they decide from immutable data and hand
// events on without blocking.
type delegate struct {
	cfg MembershipConfig
	// selfAddr is this node's gossip address, known once memberlist runs,
	// which is when peers may already be joining it.
	selfAddr atomic.Pointer[string]
	// joining is true while this node's own Join runs.
	joining atomic.Bool
	// gossipClaims is set once a claim came by gossip (and was ignored).
	gossipClaims atomic.Bool
	// ignoredWarned is when a message was last ignored with a warning,
	// in Unix nanoseconds.
	ignoredWarned atomic.Int64
	queue         *memberlist.TransmitLimitedQueue

	mu      sync.Mutex
	list    *memberlist.Memberlist
	self    Member
	refusal error
	meta    []byte
	// roster is the newest heard of; changed is closed and replaced when
	// it changes, or a claim of this node's is refused (claimRefusal).
	roster Roster
	// rosterMsg is roster's gossip message, as it came or was signed.
	rosterMsg    []byte
	changed      chan struct{}
	claimRefusal error
	// The running node's handlers; events before it attached are kept in
	// pending.
	onEvent    func(*MemberEvent)
	onConflict func(error)
	onRoster   func(Roster)
	onClaim    func(Claim, bool)
	pending    []*MemberEvent
	// verified holds the peers' checks (verify).
	verified map[string]verified
}

// newDelegate makes the delegate of a node whose encoded metadata is
// meta; retransmit is memberlist's RetransmitMult.
func newDelegate(cfg MembershipConfig, meta []byte, retransmit int) *delegate {
	d := &delegate{cfg: cfg, meta: meta, self: Member{Name: cfg.Name, Boot: cfg.Meta.BootUnixNano,
		StartRank: int(cfg.Meta.StartRank), LocalSize: int(cfg.Meta.LocalSize)},
		roster: cfg.Roster, changed: make(chan struct{}), onEvent: cfg.OnEvent, onConflict: cfg.OnConflict}
	if d.roster.Elastic() && d.roster.Version == 0 && cfg.Meta.DataParallelSize > 0 {
		d.roster.Fixed = int(cfg.Meta.DataParallelSize)
	}
	d.queue = &memberlist.TransmitLimitedQueue{RetransmitMult: retransmit, NumNodes: d.numNodes}
	return d
}

func (d *delegate) numNodes() int {
	d.mu.Lock()
	l := d.list
	d.mu.Unlock()
	if l == nil {
		return 1
	}
	return l.NumMembers()
}

func (d *delegate) currentRoster() Roster {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.roster
}

// adopt keeps r when it is newer than the roster held, gossips it on and
// hands it to the node; it says whether it did. msg is the gossip message
// r came in, passed on as it is (its signer's signature with it); nil for
// a roster this node decided, which it encodes and signs. A roster of
// another kind (a fixed size where this node's is elastic) is not this
// cluster's.
func (d *delegate) adopt(r Roster, msg []byte) bool {
	if msg == nil {
		// Signed only when it will be kept: a leader publishes
		// its roster again for every claimant that has not heard of it.
		if cur := d.currentRoster(); r.Fixed != cur.Fixed || !r.Newer(cur) {
			return false
		}
		var err error
		if msg, err = encodeRoster(r, d.cfg.Seal); err != nil {
			d.cfg.Logger.Error("cannot spread a roster this node decided", "error", err)
			return false
		}
	}
	d.mu.Lock()
	if r.Fixed != d.roster.Fixed || !r.Newer(d.roster) {
		d.mu.Unlock()
		return false
	}
	d.roster, d.rosterMsg = r, msg
	close(d.changed)
	d.changed = make(chan struct{})
	onRoster := d.onRoster
	d.mu.Unlock()
	d.queue.QueueBroadcast(rosterBroadcast(msg))
	if onRoster != nil {
		onRoster(r)
	}
	return true
}

// receive acts on a gossip message: a roster is adopted when newer, a
// refusal of this node's claim ends the wait for ranks.
func (d *delegate) receive(b []byte) {
	var msg dpnodev1.GossipMessage
	if err := proto.Unmarshal(b, &msg); err != nil {
		d.cfg.Logger.Warn("ignoring an unreadable gossip message", "error", err)
		return
	}
	switch body := msg.Body.(type) {
	case *dpnodev1.GossipMessage_Roster:
		if d.cfg.Seal != nil {
			d.warnIgnored(errors.New("cluster: an unsigned roster, under cluster TLS"))
			return
		}
		d.takeRoster(body.Roster, b)
	case *dpnodev1.GossipMessage_SignedRoster:
		var pr dpnodev1.Roster
		if err := d.open(body.SignedRoster, &pr); err != nil {
			d.warnIgnored(err)
			return
		}
		d.takeRoster(&pr, b)
	case *dpnodev1.GossipMessage_Claim:
		// Anyone with the gossip key could send one, naming any node:
		// claims come over the actor transport only.
		if d.gossipClaims.CompareAndSwap(false, true) {
			d.cfg.Logger.Warn("ignoring a claim for ranks sent by gossip: claims come over the actor transport, from a node of this version or newer", "node", body.Claim.Node)
		}
	case *dpnodev1.GossipMessage_Refused:
		if d.cfg.Seal != nil {
			d.warnIgnored(errors.New("cluster: an unsigned refusal of a claim, under cluster TLS"))
			return
		}
		d.takeRefusal(body.Refused)
	case *dpnodev1.GossipMessage_SignedRefused:
		var cr dpnodev1.ClaimRefused
		if err := d.open(body.SignedRefused, &cr); err != nil {
			d.warnIgnored(err)
			return
		}
		d.takeRefusal(&cr)
	}
}

// open checks a signed message (under cluster TLS) and reads its body
// into m.
func (d *delegate) open(s *dpnodev1.Signed, m proto.Message) error {
	if d.cfg.Seal != nil {
		if err := d.cfg.Seal.Check(s); err != nil {
			return err
		}
	}
	return proto.Unmarshal(s.Body, m)
}

// takeRoster adopts a roster that came in msg, when it is newer.
func (d *delegate) takeRoster(pr *dpnodev1.Roster, msg []byte) {
	r, err := decodeRoster(pr)
	if err != nil {
		d.warnIgnored(err)
		return
	}
	d.adopt(r, msg)
}

// takeRefusal ends this node's wait for ranks, when the refusal is of its
// claim.
func (d *delegate) takeRefusal(cr *dpnodev1.ClaimRefused) {
	if cr.Node != d.key() {
		return
	}
	d.mu.Lock()
	d.claimRefusal = fmt.Errorf("cluster: the leader refused this node's ranks: %s", cr.Reason)
	close(d.changed)
	d.changed = make(chan struct{})
	d.mu.Unlock()
}

func (d *delegate) refused() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.refusal
}

// NodeMeta implements memberlist.Delegate.
func (d *delegate) NodeMeta(int) []byte {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.meta
}

// NotifyMsg implements memberlist.Delegate: rosters and claims for ranks
// travel by gossip (requests and everything else, by actors).
func (d *delegate) NotifyMsg(b []byte) { d.receive(b) }

// GetBroadcasts implements memberlist.Delegate.
func (d *delegate) GetBroadcasts(overhead, limit int) [][]byte {
	return d.queue.GetBroadcasts(overhead, limit)
}

// LocalState implements memberlist.Delegate: the roster, so that a node
// that joins has it from its first exchange, and a roster whose broadcast
// was missed arrives with the next full sync.
func (d *delegate) LocalState(bool) []byte { return d.rosterMessage() }

// rosterMessage is the gossip message of the roster held; nil before
// there is one.
func (d *delegate) rosterMessage() []byte {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.rosterMsg
}

// warnIgnored says why a gossip message was ignored, at most once per
// warnIgnoredEvery: a peer with the gossip key can send many.
func (d *delegate) warnIgnored(err error) {
	now := time.Now().UnixNano()
	last := d.ignoredWarned.Load()
	if now-last >= int64(warnIgnoredEvery) && d.ignoredWarned.CompareAndSwap(last, now) {
		d.cfg.Logger.Warn("ignoring a gossip message", "error", err)
	}
}

const warnIgnoredEvery = 10 * time.Second

// MergeRemoteState implements memberlist.Delegate.
func (d *delegate) MergeRemoteState(b []byte, _ bool) {
	if len(b) > 0 {
		d.receive(b)
	}
}

// decodeMeta reads a peer's metadata. Ranks beyond the deployment's size
// (dp.MaxRanks for an elastic one, size 0) are refused like unreadable
// metadata: the election and the cluster view loop over a member's ranks,
// and a peer that claimed billions would hold the node actor for seconds
// at each membership change, and make a view (/health) allocate without
// bound.
func decodeMeta(n *memberlist.Node, size uint32) (*dpnodev1.NodeMeta, error) {
	var m dpnodev1.NodeMeta
	if err := proto.Unmarshal(n.Meta, &m); err != nil {
		return nil, fmt.Errorf("cluster: node %s sent unreadable metadata: %w", n.Name, err)
	}
	if size == 0 {
		size = dp.MaxRanks
	}
	if end := uint64(m.StartRank) + uint64(m.LocalSize); end > uint64(size) {
		return nil, fmt.Errorf("cluster: node %s claims ranks %d to %d, but --data-parallel-size is %d", n.Name, m.StartRank, end-1, size)
	}
	return &m, nil
}

func (d *delegate) setAddr(a string) { d.selfAddr.Store(&a) }

// key is this node's identity in the roster: its --node-id, or else its
// gossip address.
func (d *delegate) key() string {
	return cmp.Or(d.cfg.Meta.NodeId, d.addr())
}

// addr is this node's gossip address; empty until memberlist runs.
func (d *delegate) addr() string {
	if a := d.selfAddr.Load(); a != nil {
		return *a
	}
	return ""
}

// conflict says why peer cannot be this node's peer: it serves something
// else (mismatch), or it hosts one of this node's ranks, and then
// rankTaken is true and meta is the peer's. A peer at this node's own
// gossip address, or with its --node-id, is its previous incarnation, not
// a rival: a node restarted after a crash takes its ranks back.
func (d *delegate) conflict(peer *memberlist.Node) (meta *dpnodev1.NodeMeta, rankTaken bool, err error) {
	if peer.Name == d.cfg.Name || peer.Address() == d.addr() {
		return nil, false, nil
	}
	meta, err = decodeMeta(peer, d.cfg.Meta.DataParallelSize)
	if err != nil {
		return nil, false, err
	}
	if err := mismatch(d.cfg.Meta, meta, peer.Name); err != nil {
		return meta, false, err
	}
	if d.cfg.Meta.NodeId != "" && meta.NodeId == d.cfg.Meta.NodeId {
		// This node's previous incarnation, at another address (a pod
		// recreated elsewhere): its ranks are this node's to take back.
		return meta, false, nil
	}
	d.mu.Lock()
	self := d.self
	d.mu.Unlock()
	err = RankConflict(self, []Member{{Name: peer.Name, Boot: meta.BootUnixNano, StartRank: int(meta.StartRank), LocalSize: int(meta.LocalSize)}})
	if err != nil {
		return meta, true, err
	}
	return meta, false, d.verify(peer.Name, cmp.Or(meta.ActorAddress, meta.JoiningActorAddress))
}

// verifyTimeout bounds a peer's check, which runs on memberlist's
// goroutine; verifyRetry is how long a failed one stands before the peer
// is checked again.
const (
	verifyTimeout = 2 * time.Second
	verifyRetry   = 5 * time.Second
)

// verified is a peer's check, kept by name and actor address.
type verified struct {
	err error
	at  time.Time
}

// verify checks the peer at address once (VerifyPeer), and again after a
// failure once verifyRetry has passed.
func (d *delegate) verify(name, address string) error {
	if d.cfg.VerifyPeer == nil {
		return nil
	}
	if address == "" {
		return fmt.Errorf("cluster: %s gossips no actor address at which to check its certificate (a node from before they were checked?): it is not counted as a member", name)
	}
	key := name + " " + address
	d.mu.Lock()
	v, ok := d.verified[key]
	d.mu.Unlock()
	if ok && (v.err == nil || time.Since(v.at) < verifyRetry) {
		return v.err
	}
	ctx, cancel := context.WithTimeout(context.Background(), verifyTimeout)
	defer cancel()
	err := d.cfg.VerifyPeer(ctx, name, address)
	if err != nil {
		err = fmt.Errorf("cluster: %s is not counted as a member: %w", name, err)
		d.cfg.Logger.Warn(err.Error())
	}
	d.mu.Lock()
	if d.verified == nil {
		d.verified = map[string]verified{}
	}
	d.verified[key] = verified{err: err, at: time.Now()}
	d.mu.Unlock()
	return err
}

// mismatch names what the node called name serves differently from this
// node, whose metadata is self: the model clients name, the engine, what
// the engine serves, expert parallelism. Nodes of one cluster balance
// requests over each other's ranks, so they must agree on all of it. A
// field the peer leaves empty (a node from before it was gossiped) is not
// compared.
func mismatch(self, peer *dpnodev1.NodeMeta, name string) error {
	var diffs []string
	differ := func(flag, theirs, ours string) {
		if theirs != "" && theirs != ours {
			diffs = append(diffs, fmt.Sprintf("%s %q (this node: %q)", flag, theirs, ours))
		}
	}
	differ("the model", peer.Model, self.Model)
	differ("--engine", peer.Engine, self.Engine)
	differ("the engine's model", peer.Profile, self.Profile)
	if peer.DataParallelSize != self.DataParallelSize {
		diffs = append(diffs, fmt.Sprintf("--data-parallel-size %s (this node: %s)", sizeFlag(peer.DataParallelSize), sizeFlag(self.DataParallelSize)))
	}
	if peer.ExpertParallel != self.ExpertParallel {
		diffs = append(diffs, fmt.Sprintf("--enable-expert-parallel=%v (this node: %v)", peer.ExpertParallel, self.ExpertParallel))
	}
	if len(diffs) == 0 {
		return nil
	}
	return fmt.Errorf("cluster: node %s serves with %s; every node of a cluster must serve the same", name, strings.Join(diffs, ", "))
}

func sizeFlag(size uint32) string {
	if size == 0 {
		return "auto"
	}
	return strconv.Itoa(int(size))
}

// NotifyMerge implements memberlist.MergeDelegate: when this node joins
// (or a node joins it), a peer that hosts one of its ranks or serves
// something else cancels the merge, and the joining node is refused.
func (d *delegate) NotifyMerge(peers []*memberlist.Node) error {
	for _, p := range peers {
		if p.State != memberlist.StateAlive && p.State != memberlist.StateSuspect {
			continue
		}
		if _, _, err := d.conflict(p); err != nil {
			d.mu.Lock()
			// Only this node's own join is refused here; a node that
			// joins this one hears its refusal on its side.
			if d.refusal == nil && d.joining.Load() {
				d.refusal = fmt.Errorf("cluster: refused to join: %w", err)
			}
			d.mu.Unlock()
			return err
		}
	}
	return nil
}

// NotifyAlive implements memberlist.AliveDelegate: a node that hosts one
// of this node's ranks, or serves something else, is not accepted as a
// peer. If it took this node's ranks and is the older of the two (both
// joined at once), this node is the one that must go. So must this node
// when a newer one with its --node-id serves: this one is the previous
// incarnation (a pod that was cut off and replaced), and two nodes with
// one identity would serve the same ranks.
func (d *delegate) NotifyAlive(peer *memberlist.Node) error {
	meta, rankTaken, err := d.conflict(peer)
	d.mu.Lock()
	onConflict := d.onConflict
	d.mu.Unlock()
	if rankTaken && meta.BootUnixNano < d.cfg.Meta.BootUnixNano && onConflict != nil {
		onConflict(fmt.Errorf("cluster: another node took this node's ranks first: %w", err))
	}
	if err == nil && meta != nil && d.cfg.Meta.NodeId != "" && meta.NodeId == d.cfg.Meta.NodeId && peer.Address() != d.addr() &&
		meta.ActorAddress != "" && meta.BootUnixNano > d.cfg.Meta.BootUnixNano && onConflict != nil {
		onConflict(fmt.Errorf("cluster: a newer node with this node's --node-id %q serves, at %s: this node is its previous incarnation, and goes", d.cfg.Meta.NodeId, peer.Address()))
	}
	// A peer that serves something else is refused too; the node that
	// joined last is refused at its join (NotifyMerge).
	return err
}

func (d *delegate) event(kind MemberEventKind, n *memberlist.Node) {
	if n.Name == d.cfg.Name {
		return
	}
	meta, err := decodeMeta(n, d.cfg.Meta.DataParallelSize)
	if err != nil {
		d.cfg.Logger.Warn("ignoring a member", "error", err)
		return
	}
	ev := &MemberEvent{Kind: kind, Name: n.Name, Key: keyOf(n), Meta: meta}
	// Under the lock, so that an event is never handed over before one
	// kept earlier (Attach).
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.onEvent == nil {
		d.pending = append(d.pending, ev)
		return
	}
	d.onEvent(ev)
}

// NotifyJoin implements memberlist.EventDelegate.
func (d *delegate) NotifyJoin(n *memberlist.Node) { d.event(MemberJoined, n) }

// NotifyLeave implements memberlist.EventDelegate: the node left, or gossip
// declared it dead.
func (d *delegate) NotifyLeave(n *memberlist.Node) { d.event(MemberLeft, n) }

// NotifyUpdate implements memberlist.EventDelegate.
func (d *delegate) NotifyUpdate(n *memberlist.Node) { d.event(MemberUpdated, n) }
