package cluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"
	"google.golang.org/protobuf/proto"

	"github.com/dpnode/dpnode/actors"
	"github.com/dpnode/dpnode/dp"
	dpnodev1 "github.com/dpnode/dpnode/proto/dpnode/v1"
)

// MembershipConfig sets up a node's gossip membership.
type MembershipConfig struct {
	// Name is the node's name, unique per process incarnation.
	Name string
	// Bind is the host:port gossip listens on (TCP and UDP).
	Bind string
	// Advertise is the host[:port] other nodes reach this one at; empty
	// lets memberlist choose from the bind address and the interfaces.
	Advertise string
	// Seeds are members to join; none starts a new cluster.
	Seeds []string
	// SecretKey encrypts gossip (16, 24 or 32 bytes); nil leaves it clear.
	SecretKey []byte
	// Profile picks memberlist's timings: "lan" (the default) or "local"
	// (one machine: a full-state sync every 2 s that bounds how long a
	// missed join goes unseen). Both detect failures as detectFailures
	// says.
	Profile string
	// Meta is what this node gossips about itself.
	Meta *dpnodev1.NodeMeta
	// OnEvent receives membership changes. It runs on memberlist's
	// goroutines and must not block.
	OnEvent func(*actors.MemberEvent)
	// OnConflict is told when an older node turns out to host one of this
	// node's ranks after the join (two nodes joined at once): this node
	// must go.
	OnConflict func(error)
	Logger     *slog.Logger
}

// Membership is a node's view of the cluster, kept by gossip.
type Membership struct {
	list *memberlist.Memberlist
	d    *delegate
}

// StartMembership creates the node's gossip endpoint and joins the seeds.
// A node whose ranks another node already hosts is refused here, with an
// error naming that node.
func StartMembership(cfg MembershipConfig) (*Membership, error) {
	meta, err := proto.Marshal(cfg.Meta)
	if err != nil {
		return nil, fmt.Errorf("cluster: encoding node metadata: %w", err)
	}
	if len(meta) > memberlist.MetaMaxSize {
		return nil, fmt.Errorf("cluster: node metadata is %d bytes, over memberlist's %d; shorten --served-model-name", len(meta), memberlist.MetaMaxSize)
	}
	var mc *memberlist.Config
	switch cfg.Profile {
	case "", "lan":
		mc = memberlist.DefaultLANConfig()
	case "local":
		mc = memberlist.DefaultLocalConfig()
		// Gossip spreads a join with a few UDP retransmits; the local
		// profile's two missed a member of five in a third of joins here,
		// leaving it to the full-state sync (15 s). Four, as on a LAN, and
		// a sync every 2 s (cheap on one machine) bound convergence.
		mc.PushPullInterval = 2 * time.Second
		mc.RetransmitMult = 4
	default:
		return nil, fmt.Errorf("cluster: --gossip-profile must be lan or local, got %q", cfg.Profile)
	}
	detectFailures(mc)
	host, port, err := splitHostPort(cfg.Bind, 7946)
	if err != nil {
		return nil, fmt.Errorf("cluster: --bind: %w", err)
	}
	mc.Name, mc.BindAddr, mc.BindPort = cfg.Name, host, port
	if cfg.Advertise != "" {
		ahost, aport, err := splitHostPort(cfg.Advertise, port)
		if err != nil {
			return nil, fmt.Errorf("cluster: --advertise: %w", err)
		}
		mc.AdvertiseAddr, mc.AdvertisePort = ahost, aport
	} else if port == 0 {
		mc.AdvertisePort = 0
	}
	mc.SecretKey = cfg.SecretKey
	mc.Logger = log.New(&slogWriter{logger: cfg.Logger.With("component", "memberlist")}, "", 0)
	d := &delegate{cfg: cfg, meta: meta, self: dp.Member{Name: cfg.Name, Boot: cfg.Meta.BootUnixNano,
		StartRank: int(cfg.Meta.StartRank), LocalSize: int(cfg.Meta.LocalSize)}}
	mc.Delegate, mc.Events, mc.Merge, mc.Alive = d, d, d, d
	list, err := memberlist.Create(mc)
	if err != nil {
		return nil, fmt.Errorf("cluster: starting gossip on %s: %w", cfg.Bind, err)
	}
	d.selfAddr = list.LocalNode().Address()
	m := &Membership{list: list, d: d}
	if len(cfg.Seeds) > 0 {
		if _, err := list.Join(cfg.Seeds); err != nil {
			list.Shutdown()
			if c := d.refused(); c != nil {
				return nil, c
			}
			return nil, fmt.Errorf("cluster: could not join any of --seeds %v: %w", cfg.Seeds, err)
		}
	}
	return m, nil
}

// detectFailures sets how fast gossip declares a silent member dead: a
// probe every 500 ms, and a suspicion of 3 s that the suspect can refute
// (up to 6 s in clusters of six or more nodes until other members confirm
// it, longer past ten, as memberlist scales it). A node that stops
// answering (SIGSTOP, a hung host) is declared dead 3.5 to 5 s later,
// while one paused for 2 s refutes the suspicion with a second to spare.
// A killed process is found sooner, by the node actor's probe of its
// port, with no waiting for gossip.
func detectFailures(mc *memberlist.Config) {
	mc.ProbeInterval = 500 * time.Millisecond
	mc.ProbeTimeout = min(mc.ProbeTimeout, 250*time.Millisecond)
	mc.SuspicionMult = 6
	mc.SuspicionMaxTimeoutMult = 2
}

// Address is where other nodes gossip with this one.
func (m *Membership) Address() string { return m.list.LocalNode().Address() }

// NumMembers counts the live members, this node included.
func (m *Membership) NumMembers() int { return m.list.NumMembers() }

// SetMeta gossips new node metadata (a node that starts draining).
func (m *Membership) SetMeta(meta *dpnodev1.NodeMeta) error {
	b, err := proto.Marshal(meta)
	if err != nil {
		return err
	}
	m.d.mu.Lock()
	m.d.meta = b
	m.d.mu.Unlock()
	return m.list.UpdateNode(2 * time.Second)
}

// Leave tells the others this node is going, so that they drop it at once
// instead of after failure detection, then stops gossiping.
func (m *Membership) Leave(timeout time.Duration) {
	_ = m.list.Leave(timeout)
	_ = m.list.Shutdown()
}

// delegate is memberlist's view of this node. Its callbacks run on
// memberlist's goroutines: they decide from immutable data and hand
// events on without blocking.
type delegate struct {
	cfg      MembershipConfig
	self     dp.Member
	selfAddr string

	mu      sync.Mutex
	refusal error
	meta    []byte
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

// NotifyMsg implements memberlist.Delegate; dpnode sends no user messages
// over gossip (actors carry them).
func (d *delegate) NotifyMsg([]byte) {}

// GetBroadcasts implements memberlist.Delegate.
func (d *delegate) GetBroadcasts(int, int) [][]byte { return nil }

// LocalState implements memberlist.Delegate.
func (d *delegate) LocalState(bool) []byte { return nil }

// MergeRemoteState implements memberlist.Delegate.
func (d *delegate) MergeRemoteState([]byte, bool) {}

// decodeMeta reads a peer's metadata. Ranks beyond the deployment's size
// are refused like unreadable metadata: the election and the cluster view
// loop over a member's ranks, and a peer that claimed billions would hold
// the node actor for seconds at each membership change, and make a view
// (/health) allocate without bound.
func decodeMeta(n *memberlist.Node, size uint32) (*dpnodev1.NodeMeta, error) {
	var m dpnodev1.NodeMeta
	if err := proto.Unmarshal(n.Meta, &m); err != nil {
		return nil, fmt.Errorf("cluster: node %s sent unreadable metadata: %w", n.Name, err)
	}
	if end := uint64(m.StartRank) + uint64(m.LocalSize); end > uint64(size) {
		return nil, fmt.Errorf("cluster: node %s claims ranks %d to %d, but --data-parallel-size is %d", n.Name, m.StartRank, end-1, size)
	}
	return &m, nil
}

// conflict says why peer cannot be this node's peer: it serves something
// else (mismatch), or it hosts one of this node's ranks, and then
// rankTaken is true and meta is the peer's. A peer at this node's own
// gossip address is its previous incarnation, not a rival: a node
// restarted after a crash takes its ranks back.
func (d *delegate) conflict(peer *memberlist.Node) (meta *dpnodev1.NodeMeta, rankTaken bool, err error) {
	if peer.Name == d.cfg.Name || peer.Address() == d.selfAddr {
		return nil, false, nil
	}
	meta, err = decodeMeta(peer, d.cfg.Meta.DataParallelSize)
	if err != nil {
		return nil, false, err
	}
	if err := mismatch(d.cfg.Meta, meta, peer.Name); err != nil {
		return meta, false, err
	}
	err = dp.RankConflict(d.self, []dp.Member{{Name: peer.Name, Boot: meta.BootUnixNano, StartRank: int(meta.StartRank), LocalSize: int(meta.LocalSize)}})
	return meta, err != nil, err
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
	if peer.ExpertParallel != self.ExpertParallel {
		diffs = append(diffs, fmt.Sprintf("--enable-expert-parallel=%v (this node: %v)", peer.ExpertParallel, self.ExpertParallel))
	}
	if len(diffs) == 0 {
		return nil
	}
	return fmt.Errorf("cluster: node %s serves with %s; every node of a cluster must serve the same", name, strings.Join(diffs, ", "))
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
			if d.refusal == nil {
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
// joined at once), this node is the one that must go.
func (d *delegate) NotifyAlive(peer *memberlist.Node) error {
	meta, rankTaken, err := d.conflict(peer)
	if rankTaken && meta.BootUnixNano < d.self.Boot && d.cfg.OnConflict != nil {
		d.cfg.OnConflict(fmt.Errorf("cluster: another node took this node's ranks first: %w", err))
	}
	// A peer that serves something else is refused too; the node that
	// joined last is refused at its join (NotifyMerge).
	return err
}

func (d *delegate) event(kind actors.MemberEventKind, n *memberlist.Node) {
	if n.Name == d.cfg.Name || d.cfg.OnEvent == nil {
		return
	}
	meta, err := decodeMeta(n, d.cfg.Meta.DataParallelSize)
	if err != nil {
		d.cfg.Logger.Warn("ignoring a member", "error", err)
		return
	}
	d.cfg.OnEvent(&actors.MemberEvent{Kind: kind, Name: n.Name, Meta: meta})
}

// NotifyJoin implements memberlist.EventDelegate.
func (d *delegate) NotifyJoin(n *memberlist.Node) { d.event(actors.MemberJoined, n) }

// NotifyLeave implements memberlist.EventDelegate: the node left, or gossip
// declared it dead.
func (d *delegate) NotifyLeave(n *memberlist.Node) { d.event(actors.MemberLeft, n) }

// NotifyUpdate implements memberlist.EventDelegate.
func (d *delegate) NotifyUpdate(n *memberlist.Node) { d.event(actors.MemberUpdated, n) }

// slogWriter turns memberlist's log lines ("[WARN] memberlist: ...") into
// structured records at the matching level.
type slogWriter struct {
	logger *slog.Logger
}

func (w *slogWriter) Write(p []byte) (int, error) {
	line := string(bytes.TrimSpace(p))
	level := slog.LevelInfo
	for prefix, l := range map[string]slog.Level{"[DEBUG] ": slog.LevelDebug, "[INFO] ": slog.LevelInfo, "[WARN] ": slog.LevelWarn, "[ERR] ": slog.LevelError} {
		if rest, ok := bytes.CutPrefix([]byte(line), []byte(prefix)); ok {
			level, line = l, string(rest)
			break
		}
	}
	w.logger.Log(context.Background(), level, line)
	return len(p), nil
}

// splitHostPort reads host[:port], with defaultPort when there is none.
func splitHostPort(s string, defaultPort int) (string, int, error) {
	host, portStr, err := net.SplitHostPort(s)
	if err != nil {
		var addrErr *net.AddrError
		if errors.As(err, &addrErr) && addrErr.Err == "missing port in address" {
			return s, defaultPort, nil
		}
		return "", 0, err
	}
	port, err := strconv.Atoi(portStr)
	if err != nil || port < 0 || port > 65535 {
		return "", 0, fmt.Errorf("bad port in %q", s)
	}
	return host, port, nil
}
