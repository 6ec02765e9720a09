package actors

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/eventstream"
	"github.com/asynkron/protoactor-go/remote"

	"github.com/dpnode/dpnode/control"
	"github.com/dpnode/dpnode/dp"
	"github.com/dpnode/dpnode/engine"
	dpnodev1 "github.com/dpnode/dpnode/proto/dpnode/v1"
)

// SizeChange is one change of the deployment's size this node heard of.
type SizeChange struct {
	Version uint64    `json:"version"`
	Size    int       `json:"size"`
	From    int       `json:"from"`
	At      time.Time `json:"at"`
}

// membersView is the node actor's part of the cluster view.
type membersView struct {
	members  map[string]*dpnodev1.NodeMeta
	election control.Election
	running  bool
	roster   control.Roster
	changes  []SizeChange
}

// nodeActor is the root of a node. It owns the membership as seen by this
// node: it elects the coordinator (the oldest live member, with a
// majority of the ranks), runs it when the lot falls here, tells the API
// server and the other nodes where it runs, and turns a gossip death into
// protoactor Terminated messages for anyone watching the dead node's
// actors.
type nodeActor struct {
	cfg      NodeConfig
	self     *dpnodev1.NodeMeta
	metrics  *Metrics
	members  map[string]*dpnodev1.NodeMeta
	api      *actor.PID
	coord    *actor.PID
	election control.Election
	// coordAddr and coordEpoch are the coordinator this node follows, as
	// the API server was told last: empty and 0 while there is none.
	coordAddr  string
	coordEpoch uint64
	coordTold  bool
	// followed is the last nonzero epoch followed, to count failovers.
	followed uint64
	// deposed is the coordinator this node stopped, until it has.
	deposed *actor.PID
	// fail reports that the node cannot serve any more.
	fail     func(error)
	stopping bool
	// electing is false until the node knows its cluster.
	electing bool
	// gone are the members whose process was found gone before gossip
	// declared them dead, with what they gossiped last; gossip about them
	// is ignored until it declares them dead too.
	gone map[string]*dpnodev1.NodeMeta
	// probing are the addresses being probed.
	probing map[string]bool
	// endpoints delivers the actor transport's lost connections.
	endpoints *eventstream.Subscription
	// roster is the Node's newest roster; known is the one this actor
	// acts on, and changes are the size's recent changes.
	roster  *atomic.Pointer[control.Roster]
	known   control.Roster
	changes []SizeChange
	// keys are the members' roster keys; pending, the members in gossip
	// that have not started their actors (they wait for their ranks, or
	// load their model).
	keys    map[string]string
	pending map[string]pendingMember
	// engines are the ranks of the node's engines, by actor id: the node
	// actor supervises them for the API server.
	engines map[string]int
}

type pendingMember struct {
	key  string
	boot int64
}

func (n *nodeActor) Receive(ctx actor.Context) {
	switch msg := ctx.Message().(type) {
	case *actor.Started:
		n.start(ctx)
	case *actor.Stopping:
		n.stopping = true
		if n.endpoints != nil {
			ctx.ActorSystem().EventStream.Unsubscribe(n.endpoints)
		}
	case *endpointLost:
		n.probe(ctx, msg.address)
	case *peerGone:
		n.peerGone(ctx, msg)
	case *recheckGone:
		if m := n.gone[msg.name]; m != nil {
			n.probeMember(ctx, msg.name, m.ActorAddress)
		}
	case *actor.Terminated:
		n.terminated(ctx, msg.Who)
	case *control.MemberEvent:
		n.memberEvent(ctx, msg)
	case *coordinatorStarted:
		n.announceCoordinator(ctx)
	case *membershipReady:
		n.electing = true
		n.reelect(ctx)
	case *apiServerStarted:
		ctx.Send(n.api, &rosterUpdate{roster: n.known})
		for name, m := range n.members {
			if name != n.cfg.Name {
				ctx.Send(n.api, &nodeUp{name: name, meta: m})
			}
		}
		if n.coordTold {
			ctx.Send(n.api, &dpnodev1.CoordinatorChanged{ActorAddress: n.coordAddr, Epoch: n.coordEpoch})
		}
	case *dpnodev1.CoordinatorChanged:
		// The coordinator this node elected restarted in place: same
		// epoch, but its subscribers and stats are gone. Announcements of
		// any other coordinator are not this node's to follow.
		if msg.ActorAddress != "" && msg.ActorAddress == n.coordAddr && msg.Epoch == n.coordEpoch {
			ctx.Send(n.api, msg)
		} else if msg.Epoch > n.coordEpoch && n.coordAddr != "" && n.coordAddr != n.self.ActorAddress {
			// Another node runs a newer coordinator: it may know that
			// the one this node follows is gone. Look for itself.
			n.probe(ctx, n.coordAddr)
		}
	case *getChildren:
		ctx.Respond(&children{apiServer: n.api})
	case *getMembers:
		ctx.Respond(&membersView{members: clone(n.members), election: n.election, running: n.coord != nil,
			roster: n.known, changes: slices.Clone(n.changes)})
	case *rosterChanged:
		n.adoptRoster(ctx)
	case *claimRanks:
		n.claim(ctx, msg)
	case *dpnodev1.RankClaim:
		// Another node's claim, over the actor transport: only a node
		// that gossip counts (a member, or one that waits for its ranks)
		// claims or gives back ranks, and only its own.
		if msg.Count > dp.MaxRanks || !n.keyLive(msg.Node) {
			n.cfg.Logger.Debug("ignored a claim for ranks from a node gossip does not count", "node", msg.Node)
			return
		}
		n.claim(ctx, &claimRanks{claim: control.Claim{Node: msg.Node, Start: int(msg.StartRank), Count: int(msg.Count), Experts: int(msg.Experts)}, release: msg.Release})
	}
}

func clone[K comparable, V any](m map[K]V) map[K]V {
	c := make(map[K]V, len(m))
	for k, v := range m {
		c[k] = v
	}
	return c
}

func (n *nodeActor) start(ctx actor.Context) {
	cfg := n.cfg
	n.members = map[string]*dpnodev1.NodeMeta{cfg.Name: n.self}
	n.keys = map[string]string{cfg.Name: cfg.Key}
	n.pending = map[string]pendingMember{}
	n.known = *n.roster.Load()
	n.metrics.dpSize.Set(float64(n.known.Size()))
	n.metrics.rosterVersion.Set(float64(n.known.Version))
	engines := n.startEngines(ctx)
	api, err := ctx.SpawnNamed(actor.PropsFromProducer(NewAPIServerProducer(APIServerConfig{
		Node:           cfg.Name,
		Engines:        engines,
		Roster:         n.known,
		BalanceRemote:  cfg.Topology.BalancesRemote(),
		ExpertParallel: cfg.ExpertParallel,
		MaxNumSeqs:     cfg.Scheduler.MaxNumSeqs,
		Policy:         cfg.Policy,
		BlockSize:      cfg.Scheduler.BlockSize,
		Restart:        cfg.Restart,
		ParkTimeout:    cfg.ParkTimeout,
		Migration:      cfg.Migration,
		MaxMigrations:  cfg.MaxMigrations,
		Metrics:        n.metrics,
		Logger:         cfg.Logger,
	})), "api-server")
	if err != nil {
		panic(fmt.Errorf("actors: spawning the API server: %w", err))
	}
	n.api = api
	n.electing = !cfg.AwaitMembership
	n.gone, n.probing = map[string]*dpnodev1.NodeMeta{}, map[string]bool{}
	self, system := ctx.Self(), ctx.ActorSystem()
	n.endpoints = system.EventStream.SubscribeWithPredicate(func(ev any) {
		system.Root.Send(self, &endpointLost{address: ev.(*remote.EndpointTerminatedEvent).Address})
	}, func(ev any) bool {
		_, ok := ev.(*remote.EndpointTerminatedEvent)
		return ok
	})
	n.reelect(ctx)
}

// startEngines spawns the node's engines, before the API server, which
// watches them and must not find them missing.
func (n *nodeActor) startEngines(ctx actor.Context) []LocalEngine {
	cfg := n.cfg
	api := actor.NewPID(ctx.Self().Address, apiServerID)
	engines := make([]LocalEngine, cfg.Topology.LocalSize)
	n.engines = make(map[string]int, len(engines))
	for i := range engines {
		rank, dev := cfg.Topology.StartRank+i, cfg.Devices[i]
		ec := EngineConfig{
			Rank:              rank,
			Device:            fmt.Sprintf("%d:%s (%s)", dev.Index, dev.UUID, dev.Name),
			NewCore:           func(ctx context.Context) (engine.Core, error) { return cfg.NewCore(ctx, rank, dev) },
			ExpertParallel:    cfg.ExpertParallel,
			CollectiveTimeout: cfg.CollectiveTimeout,
			Metrics:           n.metrics.forRank(rank, true),
			APIServer:         api,
			Logger:            cfg.Logger.With("rank", rank),
			Ready:             cfg.RankReady,
		}
		// From the clock, not 1: other nodes' API servers that sent the
		// rank requests must see a restarted node's engines as new
		// incarnations.
		epoch := new(atomic.Uint64)
		epoch.Store(uint64(time.Now().UnixNano()))
		pid, err := ctx.SpawnNamed(actor.PropsFromProducer(NewEngineProducer(ec, epoch)), strings.TrimPrefix(engineID(rank), nodeID+"/"))
		if err != nil {
			panic(fmt.Errorf("actors: spawning the engine of rank %d: %w", rank, err))
		}
		n.engines[pid.Id] = rank
		engines[i] = LocalEngine{Config: ec, PID: pid, Epoch: epoch}
	}
	return engines
}

// childStrategy is how the node actor supervises its children other than
// engines: the API server and the coordinator restart at once, and stop
// for good after 10 crashes in a minute.
var childStrategy = actor.NewOneForOneStrategy(10, time.Minute, actor.DefaultDecider)

// HandleFailure makes the node actor the supervisor of its children (an
// actor that implements actor.SupervisorStrategy supervises them itself).
// An engine's crash goes to the API server, which moves the engine's
// requests and decides when, or whether, it restarts: the restart waits
// out a backoff, and the engine's mailbox keeps what comes meanwhile.
func (n *nodeActor) HandleFailure(system *actor.ActorSystem, sup actor.Supervisor, child *actor.PID, rs *actor.RestartStatistics, reason, message any) {
	rank, isEngine := n.engines[child.Id]
	if !isEngine {
		childStrategy.HandleFailure(system, sup, child, rs, reason, message)
		return
	}
	system.Root.Send(n.api, &engineFailed{rank: rank, reason: reason,
		restart: func() { sup.RestartChildren(child) }, stop: func() { sup.StopChildren(child) }})
}

func (n *nodeActor) memberEvent(ctx actor.Context, ev *control.MemberEvent) {
	if ev.Name == n.cfg.Name || ev.Meta == nil {
		return
	}
	if ev.Meta.ActorAddress == "" {
		// A node that joined gossip to be given its ranks, and has not
		// started its actors: not a member to send to yet, but its ranks
		// count for the quorum once they are the deployment's.
		if ev.Kind == control.MemberLeft {
			delete(n.pending, ev.Name)
			if !n.keyLive(ev.Key) {
				n.dropJoining(ctx, ev.Key)
			}
		} else {
			n.pending[ev.Name] = pendingMember{key: ev.Key, boot: ev.Meta.BootUnixNano}
		}
		n.reelect(ctx)
		return
	}
	delete(n.pending, ev.Name)
	if ev.Meta.ActorAddress == n.self.ActorAddress {
		// An earlier incarnation of this node, restarted before gossip
		// declared it dead: it is not a peer, and its death must not cut
		// this incarnation's connections.
		return
	}
	switch ev.Kind {
	case control.MemberJoined, control.MemberUpdated:
		if n.gone[ev.Name] != nil {
			return
		}
		if _, known := n.members[ev.Name]; !known {
			n.metrics.events.add(EventNodeJoined, ev.Name, -1, fmt.Sprintf("ranks %s", metaRanks(ev.Meta)))
		}
		n.members[ev.Name] = ev.Meta
		n.keys[ev.Name] = ev.Key
		ctx.Send(n.api, &nodeUp{name: ev.Name, meta: ev.Meta})
		n.commitJoining(ctx, ev.Key, ev.Meta)
	case control.MemberLeft:
		delete(n.gone, ev.Name)
		if m, known := n.members[ev.Name]; known {
			n.metrics.events.add(EventNodeLeft, ev.Name, -1, fmt.Sprintf("ranks %s", metaRanks(m)))
		}
		n.memberGone(ctx, ev.Name, true)
		delete(n.keys, ev.Name)
		if !n.keyLive(ev.Key) {
			n.dropJoining(ctx, ev.Key)
		}
	}
	n.reelect(ctx)
}

// keyLive reports whether a member or a pending node has the roster
// identity key: the new incarnation of a node whose old one just left
// (--node-id at another address), whose ranks must stay its own.
func (n *nodeActor) keyLive(key string) bool {
	for name, k := range n.keys {
		if k == key && n.members[name] != nil {
			return true
		}
	}
	for _, p := range n.pending {
		if p.key == key {
			return true
		}
	}
	return false
}

// memberGone forgets a member that left, was declared dead by gossip or
// was found gone: the coordinator stops waiting for its ranks, whoever
// watches its actors hears Terminated (when cut: a hung node's
// connections may still be open), and the API server stops sending to
// it.
func (n *nodeActor) memberGone(ctx actor.Context, name string, cut bool) {
	left, known := n.members[name]
	if !known {
		return
	}
	delete(n.members, name)
	if n.coord != nil && left.LocalSize > 0 {
		// Its ranks will not report again: the waves go on without
		// them now rather than after a collective timeout.
		var ranks []int
		for r := int(left.StartRank); r < int(left.StartRank+left.LocalSize); r++ {
			ranks = append(ranks, r)
		}
		ctx.Send(n.coord, &dropRanks{ranks: ranks})
	}
	// Whoever watches its actors hears Terminated now, not when a TCP
	// timeout fires (a hung process keeps its connections open). Not when
	// a new incarnation already holds the address (a node restarted
	// before its death was declared): that would cut the new one's
	// connections, and the messages on them.
	if addr := left.ActorAddress; cut && addr != "" && n.memberAt(addr) == "" {
		ctx.ActorSystem().EventStream.Publish(&remote.EndpointTerminatedEvent{Address: addr})
	}
	ctx.Send(n.api, &nodeDown{name: name})
}

// reelect runs the election on the members this node sees, starts or
// stops the local coordinator to match, and tells the API server where the
// coordinator runs when that changed.
func (n *nodeActor) reelect(ctx actor.Context) {
	if !n.electing {
		return
	}
	var ms []control.Member
	for name, m := range n.members {
		ms = append(ms, control.Member{Name: name, Boot: m.BootUnixNano, StartRank: int(m.StartRank), LocalSize: int(m.LocalSize), Key: n.keys[name]})
	}
	for name, p := range n.pending {
		ms = append(ms, control.Member{Name: name, Boot: p.boot, Key: p.key, Pending: true})
	}
	e := control.Elect(ms, n.known)
	decided := n.decides()
	n.election = e
	if !decided && n.decides() {
		// Joining holds a previous leader left behind.
		defer n.sweepJoining(ctx)
	}
	mine := e.Quorum && e.Leader.Name == n.cfg.Name
	switch {
	case mine && n.coord == nil:
		pid, err := ctx.SpawnNamed(actor.PropsFromProducer(NewCoordinatorProducer(CoordinatorConfig{
			Epoch:          e.Epoch,
			Publish:        n.cfg.Publish,
			ExpertParallel: n.cfg.ExpertParallel,
			Roster:         n.known,
			Metrics:        n.metrics,
			Logger:         n.cfg.Logger,
		})), "coordinator")
		if err != nil {
			// The previous incarnation is still stopping; Terminated
			// brings us back here.
			n.cfg.Logger.Debug("coordinator not started yet", "error", err)
		} else {
			n.coord = pid
			n.metrics.coordHere.Set(1)
			n.cfg.Logger.Info("this node runs the coordinator", "epoch", e.Epoch, "ranks_seen", e.RanksSeen)
		}
	case !mine && n.coord != nil:
		n.cfg.Logger.Info("this node stops its coordinator", "leader", e.Leader.Name, "quorum", e.Quorum)
		// Poison, not Stop: what was sent to it before (the ranks of a
		// node that just left) is handled first, so the group it leaves
		// behind has no dead ranks in it. The API server, and through it
		// the engines, hear that it is gone once it is: a group it sends
		// on its way out is still its epoch's, and heard.
		ctx.Poison(n.coord)
		n.deposed, n.coord = n.coord, nil
		n.metrics.coordHere.Set(0)
	}
	if n.deposed != nil {
		return
	}
	addr, epoch := "", uint64(0)
	if e.Quorum {
		addr, epoch = n.members[e.Leader.Name].ActorAddress, e.Epoch
	}
	if !n.coordTold || addr != n.coordAddr || epoch != n.coordEpoch {
		if epoch != 0 && n.followed != 0 && epoch != n.followed {
			n.metrics.coordFailovers.Inc()
		}
		switch {
		case epoch != 0:
			n.metrics.events.add(EventCoordinator, e.Leader.Name, -1, fmt.Sprintf("coordinates (epoch %d)", epoch))
		case n.coordTold:
			n.metrics.events.add(EventCoordinator, "", -1, fmt.Sprintf("no coordinator: this node sees %d of %d ranks, no majority", e.RanksSeen, n.known.Size()))
		}
		if epoch != 0 {
			n.followed = epoch
		}
		n.metrics.coordEpoch.Set(float64(epoch) / 1e9)
		n.coordTold, n.coordAddr, n.coordEpoch = true, addr, epoch
		ctx.Send(n.api, &dpnodev1.CoordinatorChanged{ActorAddress: addr, Epoch: epoch})
	}
}

// announceCoordinator tells this node's API server and every other node
// that the coordinator here (re)started, so that they subscribe to it and
// their engines report to it afresh.
func (n *nodeActor) announceCoordinator(ctx actor.Context) {
	if n.coord == nil {
		return
	}
	msg := &dpnodev1.CoordinatorChanged{ActorAddress: n.self.ActorAddress, Epoch: n.election.Epoch}
	ctx.Send(n.api, msg)
	for name, m := range n.members {
		if name != n.cfg.Name {
			ctx.Send(actor.NewPID(m.ActorAddress, nodeID), msg)
		}
	}
}

func (n *nodeActor) terminated(ctx actor.Context, who *actor.PID) {
	if _, isEngine := n.engines[who.Id]; n.stopping || isEngine {
		// An engine stopped for good: the API server watches it.
		return
	}
	if n.api != nil && who.Equal(n.api) {
		// The API server stops only when its supervisor gives up on it
		// after repeated crashes; then the node is broken, and saying so
		// (the process exits) beats serving nothing.
		n.cfg.Logger.Error("the API server crashed too often and was stopped")
		n.fail(fmt.Errorf("%w (it crashed too often)", ErrAPIServerGone))
		return
	}
	// A coordinator we stopped, or one that crashed too often: the
	// election decides whether one runs here again.
	if n.coord != nil && who.Equal(n.coord) {
		n.coord = nil
	}
	if n.deposed != nil && who.Equal(n.deposed) {
		n.deposed = nil
	}
	n.reelect(ctx)
}

// maxSizeChanges is how many of the size's changes the view keeps.
const maxSizeChanges = 32

// adoptRoster acts on a newer roster: the size and its change are
// recorded, the API server learns which ranks exist, and the election
// counts the new ranks.
func (n *nodeActor) adoptRoster(ctx actor.Context) {
	r := *n.roster.Load()
	if !r.Newer(n.known) {
		return
	}
	from, to := n.known.Size(), r.Size()
	n.known = r
	n.metrics.dpSize.Set(float64(to))
	n.metrics.rosterVersion.Set(float64(r.Version))
	if to != from {
		if to > from {
			n.metrics.scaleUps.Inc()
		} else {
			n.metrics.scaleDowns.Inc()
		}
		n.changes = append(n.changes, SizeChange{Version: r.Version, Size: to, From: from, At: time.Now()})
		if len(n.changes) > maxSizeChanges {
			n.changes = n.changes[len(n.changes)-maxSizeChanges:]
		}
		n.cfg.Logger.Info("the deployment's size changed", "from", from, "to", to, "roster_version", r.Version)
		n.metrics.events.add(EventSize, "", -1, fmt.Sprintf("%d ranks to %d (roster version %d)", from, to, r.Version))
	}
	ctx.Send(n.api, &rosterUpdate{roster: r})
	if n.coord != nil {
		ctx.Send(n.coord, &rosterUpdate{roster: r})
	}
	n.reelect(ctx)
}
