package control

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"math/rand/v2"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/memberlist"
	"google.golang.org/protobuf/proto"

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
	// Seeds are members to join (host:port; a host name seeds from every
	// address it resolves to); none starts a new cluster.
	Seeds []string
	// Resolver looks up the host names among Seeds; nil is the system's.
	Resolver Resolver
	// Founder starts a new cluster when none of its seeds answers. The
	// others keep trying, with backoff, for JoinTimeout; zero tries once.
	Founder     bool
	JoinTimeout time.Duration
	// SecretKey encrypts gossip (16, 24 or 32 bytes); nil leaves it clear.
	SecretKey []byte
	// Profile picks memberlist's timings: "lan" (the default) or "local"
	// (one machine: a full-state sync every 2 s that bounds how long a
	// missed join goes unseen). Both detect failures as detectFailures
	// says.
	Profile string
	// Meta is what this node gossips about itself; its NodeId, when set,
	// is the node's identity in the roster (else its gossip address).
	Meta *dpnodev1.NodeMeta
	// OnEvent receives membership changes. It runs on memberlist's
	// goroutines and must not block.
	OnEvent func(*MemberEvent)
	// OnConflict is told when an older node turns out to host one of this
	// node's ranks after the join (two nodes joined at once): this node
	// must go.
	OnConflict func(error)
	// Roster is the roster the node starts with: Roster{Fixed: size},
	// or an empty elastic one; gossip brings newer ones.
	Roster Roster
	// VerifyPeer, when set, checks the actor transport at the actor
	// address a peer gossips (its actor_address, or while it waits for
	// its ranks its joining_actor_address): a certificate of the
	// cluster's CA there, and the peer's name. A peer is a member only
	// once it passed; a peer that gossips no address to check is none.
	// The gossip key alone does not make a member.
	VerifyPeer func(ctx context.Context, name, address string) error
	// SendClaim sends a claim for ranks, or a release, to the node actor
	// at a member's actor address (actors.Node.SendClaim): claims travel
	// over the actor transport, whose peers are authenticated, and never
	// by gossip, whose messages say nothing of who sent them.
	SendClaim func(address string, c *dpnodev1.RankClaim)
	// Seal, when set, signs the rosters this node decides and the
	// refusals it sends, and those are taken only signed by a certificate
	// it accepts (cluster TLS): the gossip key alone neither hands out
	// ranks nor turns a node away.
	Seal   Seal
	Logger *slog.Logger
}

// Handler is what a running node takes from gossip: membership changes,
// a conflict that ends it, rosters, and (on the leader)
// claims for ranks. actors.Node is one.
type Handler interface {
	MemberEvent(*MemberEvent)
	Fail(error)
	SetRoster(Roster)
	ClaimRanks(c Claim, release bool)
}

// Membership is a node's view of the cluster, kept by gossip.
type Membership struct {
	list *memberlist.Memberlist
	d    *delegate
}

// StartMembership creates the node's gossip endpoint and joins the seeds.
// A node whose ranks another node already hosts is refused here, with an
// error naming that node.
// The join waits for a seed as MembershipConfig says, or until ctx is done.
func StartMembership(ctx context.Context, cfg MembershipConfig) (*Membership, error) {
	meta, err := proto.Marshal(cfg.Meta)
	if err != nil {
		return nil, fmt.Errorf("cluster: encoding node metadata: %w", err)
	}
	if len(meta) > memberlist.MetaMaxSize {
		return nil, fmt.Errorf("cluster: node metadata is %d bytes, over memberlist's %d; shorten --served-model-name or --node-id", len(meta), memberlist.MetaMaxSize)
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
	host, port, err := SplitHostPort(cfg.Bind, 7946)
	if err != nil {
		return nil, fmt.Errorf("cluster: --bind: %w", err)
	}
	mc.Name, mc.BindAddr, mc.BindPort = cfg.Name, host, port
	if cfg.Advertise != "" {
		ahost, aport, err := SplitHostPort(cfg.Advertise, port)
		if err != nil {
			return nil, fmt.Errorf("cluster: --advertise: %w", err)
		}
		mc.AdvertiseAddr, mc.AdvertisePort = ahost, aport
	} else if port == 0 {
		mc.AdvertisePort = 0
	}
	mc.SecretKey = cfg.SecretKey
	mc.Logger = log.New(&slogWriter{logger: cfg.Logger.With("component", "memberlist")}, "", 0)
	d := newDelegate(cfg, meta, mc.RetransmitMult)
	mc.Delegate, mc.Events, mc.Merge, mc.Alive = d, d, d, d
	list, err := memberlist.Create(mc)
	if err != nil {
		return nil, fmt.Errorf("cluster: starting gossip on %s: %w", cfg.Bind, err)
	}
	d.mu.Lock()
	d.list = list
	d.mu.Unlock()
	d.setAddr(list.LocalNode().Address())
	m := &Membership{list: list, d: d}
	if len(cfg.Seeds) > 0 {
		if err := m.join(ctx, cfg); err != nil {
			list.Shutdown()
			return nil, err
		}
	}
	return m, nil
}

// Resolver looks up a host name's addresses; *net.Resolver is one.
type Resolver interface {
	LookupHost(ctx context.Context, host string) ([]string, error)
}

// Join backoff: pods of a StatefulSet start together, and a seed's
// address resolves before its gossip port opens.
const (
	joinBackoffFirst = 250 * time.Millisecond
	joinBackoffMax   = 5 * time.Second
)

// LookupTimeout bounds one lookup of a host name: a seed's, or --bind's.
const LookupTimeout = 5 * time.Second

// join joins the seeds, resolving them afresh on each try: a headless
// Service's name gains addresses as pods start. The founder starts the
// cluster if none answers at once; the others wait for one to, so that
// nodes started together form one cluster, never several.
func (m *Membership) join(ctx context.Context, cfg MembershipConfig) error {
	resolver := cfg.Resolver
	if resolver == nil {
		resolver = net.DefaultResolver
	}
	self := m.list.LocalNode()
	deadline := time.Now().Add(cfg.JoinTimeout)
	wait := joinBackoffFirst
	for attempt := 1; ; attempt++ {
		addrs, err := seedAddresses(resolver, cfg.Seeds, int(self.Port), net.JoinHostPort(self.Addr.String(), strconv.Itoa(int(self.Port))))
		if len(addrs) > 0 {
			m.d.joining.Store(true)
			_, joinErr := m.list.Join(addrs)
			m.d.joining.Store(false)
			if joinErr == nil && m.list.NumMembers() > 1 {
				return nil
			}
			if c := m.d.refused(); c != nil {
				return c
			}
			if joinErr == nil {
				// A seed that routes back here (loopback, another of
				// this machine's addresses, a Service over this pod).
				joinErr = errors.New("the seeds that answered are this node itself")
			}
			err = errors.Join(err, joinErr)
		}
		if cfg.Founder {
			// Warn: a founder that could not reach a cluster that runs
			// starts a second one.
			cfg.Logger.Warn("none of the seeds answers: this node starts the cluster", "seeds", cfg.Seeds, "error", err)
			return nil
		}
		if !time.Now().Add(wait).Before(deadline) {
			return fmt.Errorf("cluster: could not join any of --seeds %v in %d tries over %v (raise --join-timeout, or name this node the cluster's --founder): %w",
				cfg.Seeds, attempt, cfg.JoinTimeout, err)
		}
		cfg.Logger.Info("waiting for a seed to answer", "seeds", cfg.Seeds, "try", attempt, "retry_in", wait, "error", err)
		// Jitter, so that nodes started together do not retry together.
		select {
		case <-time.After(wait/2 + rand.N(wait/2)):
		case <-ctx.Done():
			return fmt.Errorf("cluster: stopped while waiting for one of --seeds %v to answer: %w", cfg.Seeds, ctx.Err())
		}
		wait = min(2*wait, joinBackoffMax)
	}
}

// seedAddresses turns the seeds into the addresses to join: every address
// a host name resolves to, without this node's own (self), in order and
// without repeats; and the seeds that could not be resolved, or an error
// when there is no address at all.
func seedAddresses(r Resolver, seeds []string, defaultPort int, self string) ([]string, error) {
	var addrs []string
	var errs []error
	for _, seed := range seeds {
		host, port, err := SplitHostPort(seed, defaultPort)
		if ip := net.ParseIP(strings.Trim(seed, "[]")); ip != nil {
			// An address with no port; IPv6 in brackets or not.
			host, port, err = ip.String(), defaultPort, nil
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("seed %q: %w", seed, err))
			continue
		}
		ips := []string{host}
		if net.ParseIP(host) == nil {
			ctx, cancel := context.WithTimeout(context.Background(), LookupTimeout)
			ips, err = r.LookupHost(ctx, host)
			cancel()
			if err != nil {
				errs = append(errs, fmt.Errorf("seed %q: %w", seed, err))
				continue
			}
		}
		for _, ip := range ips {
			a := net.JoinHostPort(ip, strconv.Itoa(port))
			if a != self && !slices.Contains(addrs, a) {
				addrs = append(addrs, a)
			}
		}
	}
	if len(addrs) == 0 && len(errs) == 0 {
		errs = append(errs, errors.New("the seeds name only this node"))
	}
	return addrs, errors.Join(errs...)
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

// SetMeta gossips new node metadata: a node that started its actors, or
// one that starts draining.
func (m *Membership) SetMeta(meta *dpnodev1.NodeMeta) error {
	b, err := proto.Marshal(meta)
	if err != nil {
		return err
	}
	m.d.mu.Lock()
	m.d.meta = b
	m.d.self.StartRank, m.d.self.LocalSize = int(meta.StartRank), int(meta.LocalSize)
	m.d.mu.Unlock()
	return m.list.UpdateNode(2 * time.Second)
}

// Key is the node's identity in the roster, the same across restarts: its
// --node-id, or else its gossip address.
func (m *Membership) Key() string { return m.d.key() }

// Attach hands gossip over to the running node: the membership changes
// seen since the join, then every later one, and the newest roster.
func (m *Membership) Attach(h Handler) {
	d := m.d
	d.mu.Lock()
	d.onEvent, d.onConflict, d.onRoster, d.onClaim = h.MemberEvent, h.Fail, h.SetRoster, h.ClaimRanks
	for _, ev := range d.pending {
		h.MemberEvent(ev)
	}
	d.pending = nil
	r := d.roster
	d.mu.Unlock()
	h.SetRoster(r)
}

// Roster is the newest roster this node has heard of.
func (m *Membership) Roster() Roster {
	m.d.mu.Lock()
	defer m.d.mu.Unlock()
	return m.d.roster
}

// Publish spreads a roster this node decided as the leader, in answer to
// the claim of the node whose key is claimant (or to none): a new roster
// by gossip and to every member over TCP, since gossip carries a message
// only within a UDP packet, and a roster of a few dozen nodes outgrows
// one; the roster a claimant has not heard of yet, to it.
func (m *Membership) Publish(r Roster, claimant string) {
	if m.d.adopt(r, nil) {
		m.sendAll(m.d.rosterMessage())
		return
	}
	if b := m.d.rosterMessage(); b != nil {
		m.sendTo(claimant, b)
	}
}

// sendTo sends b over TCP to the other members whose roster identity is
// key (a node and, until gossip drops it, its previous incarnation).
func (m *Membership) sendTo(key string, b []byte) {
	for _, n := range m.list.Members() {
		if n.Name != m.d.cfg.Name && keyOf(n) == key {
			go func() { _ = m.list.SendReliable(n, b) }()
		}
	}
}

// sendAll sends b to every other member over TCP, each on its own
// goroutine: a dead member costs its send a timeout, not the others.
func (m *Membership) sendAll(b []byte) {
	for _, n := range m.list.Members() {
		if n.Name != m.d.cfg.Name {
			go func() { _ = m.list.SendReliable(n, b) }()
		}
	}
}

// sendClaim sends c to the node actor of every member that serves (the
// leader is one of them); members that wait for their ranks
// have none yet.
func (m *Membership) sendClaim(c *dpnodev1.RankClaim) {
	if m.d.cfg.SendClaim == nil {
		return
	}
	for _, n := range m.list.Members() {
		var meta dpnodev1.NodeMeta
		if n.Name == m.d.cfg.Name || proto.Unmarshal(n.Meta, &meta) != nil || meta.ActorAddress == "" {
			continue
		}
		m.d.cfg.SendClaim(meta.ActorAddress, c)
	}
}

// Refuse tells the node whose key is node that it gets no ranks, and why.
func (m *Membership) Refuse(node string, err error) {
	cr := &dpnodev1.ClaimRefused{Node: node, Reason: err.Error()}
	msg := &dpnodev1.GossipMessage{Body: &dpnodev1.GossipMessage_Refused{Refused: cr}}
	if seal := m.d.cfg.Seal; seal != nil {
		signed, err := seal.Sign(mustMarshal(cr))
		if err != nil {
			m.d.cfg.Logger.Error("cannot tell a node why it gets no ranks", "node", node, "error", err)
			return
		}
		msg.Body = &dpnodev1.GossipMessage_SignedRefused{SignedRefused: signed}
	}
	m.sendTo(node, mustMarshal(msg))
}

// keyOf is a member's identity in the roster: its --node-id, or else its
// gossip address.
func keyOf(n *memberlist.Node) string {
	var meta dpnodev1.NodeMeta
	if proto.Unmarshal(n.Meta, &meta) == nil && meta.NodeId != "" {
		return meta.NodeId
	}
	return n.Address()
}

// ErrNoLeader says that no leader answered a claim for ranks.
var ErrNoLeader = errors.New("no leader answered: the oldest node leads once the live nodes hold a majority of the deployment's ranks")

// serving lists the members that serve ranks they were not given by a
// roster (their flags named them): ranks a founder must not take.
func (m *Membership) serving() []Member {
	var busy []Member
	for _, n := range m.list.Members() {
		var meta dpnodev1.NodeMeta
		if n.Name == m.d.cfg.Name || proto.Unmarshal(n.Meta, &meta) != nil || meta.ActorAddress == "" || meta.LocalSize == 0 {
			continue
		}
		busy = append(busy, Member{Name: n.Name, StartRank: int(meta.StartRank), LocalSize: int(meta.LocalSize)})
	}
	return busy
}

// claimEvery is how often a claim is sent again until it is answered.
const claimEvery = time.Second

// Claim asks the leader for this node's ranks and waits for the
// roster that gives them, or for its refusal. A node that starts a new
// cluster (founder) has no leader to ask: it writes the first roster
// itself.
func (m *Membership) Claim(ctx context.Context, c Claim, founder bool) (Hold, error) {
	c.Node = m.Key()
	return m.untilRoster(ctx, &dpnodev1.RankClaim{Node: c.Node, StartRank: int32(c.Start), Count: uint32(c.Count), Experts: uint32(c.Experts)},
		func(r Roster) (Hold, bool, error) {
			if h, ok := r.Holding(c.Node); ok && h.Count == c.Count && (c.Start < 0 || h.Start == c.Start) {
				return h, true, nil
			}
			if founder && r.Version == 0 {
				// Nobody else serves: the founder's ranks are the
				// deployment's from the start.
				next, _, err := r.Assign(c, m.serving(), uint64(m.d.cfg.Meta.BootUnixNano))
				if err != nil {
					return Hold{}, false, err
				}
				next, _ = next.Commit(c.Node, next.Epoch)
				next.Version = 1
				m.d.cfg.Logger.Info("no roster yet: this node founds the deployment", "ranks", next.Holds[0].String())
				m.d.adopt(next, nil)
			}
			return Hold{}, false, nil
		})
}

// Release gives this node's ranks back as it leaves, and waits for the
// roster without them.
func (m *Membership) Release(ctx context.Context) error {
	_, err := m.untilRoster(ctx, &dpnodev1.RankClaim{Node: m.Key(), Release: true}, func(r Roster) (Hold, bool, error) {
		_, held := r.Holding(m.Key())
		return Hold{}, !held, nil
	})
	return err
}

// untilRoster sends claim to every member (the leader is the
// one that acts) until done says the roster answered it.
func (m *Membership) untilRoster(ctx context.Context, claim *dpnodev1.RankClaim, done func(Roster) (Hold, bool, error)) (Hold, error) {
	d := m.d
	d.mu.Lock()
	d.claimRefusal = nil
	d.mu.Unlock()
	var next time.Time
	for {
		d.mu.Lock()
		r, refusal, changed, onClaim := d.roster, d.claimRefusal, d.changed, d.onClaim
		d.mu.Unlock()
		if refusal != nil {
			return Hold{}, refusal
		}
		h, ok, err := done(r)
		if err != nil || ok {
			return h, err
		}
		if d.currentRoster().Newer(r) {
			continue
		}
		if now := time.Now(); now.After(next) {
			next = now.Add(claimEvery)
			if onClaim != nil {
				onClaim(Claim{Node: claim.Node, Start: int(claim.StartRank), Count: int(claim.Count), Experts: int(claim.Experts)}, claim.Release)
			}
			m.sendClaim(claim)
		}
		t := time.NewTimer(time.Until(next))
		select {
		case <-changed:
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return Hold{}, fmt.Errorf("%w (%v)", ErrNoLeader, ctx.Err())
		}
		t.Stop()
	}
}

func mustMarshal(msg proto.Message) []byte {
	b, err := proto.Marshal(msg)
	if err != nil {
		panic(err)
	}
	return b
}

// encodeRoster is the gossip message of a roster this node decided:
// signed with seal, when there is one.
func encodeRoster(r Roster, seal Seal) ([]byte, error) {
	pr := &dpnodev1.Roster{Version: r.Version, Epoch: r.Epoch, FixedSize: uint32(r.Fixed)}
	for _, h := range r.Holds {
		pr.Holds = append(pr.Holds, &dpnodev1.RankHold{Node: h.Node, StartRank: uint32(h.Start), Count: uint32(h.Count)})
	}
	if seal == nil {
		return mustMarshal(&dpnodev1.GossipMessage{Body: &dpnodev1.GossipMessage_Roster{Roster: pr}}), nil
	}
	signed, err := seal.Sign(mustMarshal(pr))
	if err != nil {
		return nil, err
	}
	return mustMarshal(&dpnodev1.GossipMessage{Body: &dpnodev1.GossipMessage_SignedRoster{SignedRoster: signed}}), nil
}

// decodeRoster reads a gossiped roster, refusing one whose holds overlap
// or run past dp.MaxRanks: a node acts on every rank of it.
func decodeRoster(pr *dpnodev1.Roster) (Roster, error) {
	r := Roster{Version: pr.Version, Epoch: pr.Epoch, Fixed: int(pr.FixedSize)}
	end := 0
	for _, h := range pr.Holds {
		if h.StartRank < uint32(end) || uint64(h.StartRank)+uint64(h.Count) > dp.MaxRanks || h.Count == 0 {
			return Roster{}, fmt.Errorf("cluster: a gossiped roster holds bad ranks (%s: %d ranks from %d)", h.Node, h.Count, h.StartRank)
		}
		r.Holds = append(r.Holds, Hold{Node: h.Node, Start: int(h.StartRank), Count: int(h.Count)})
		end = int(h.StartRank + h.Count)
	}
	return r, nil
}

// Leave tells the others this node is going, so that they drop it at once
// instead of after failure detection, then stops gossiping.
func (m *Membership) Leave(timeout time.Duration) {
	_ = m.list.Leave(timeout)
	_ = m.list.Shutdown()
}

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

// SplitHostPort reads host[:port], with defaultPort when there is none.
func SplitHostPort(s string, defaultPort int) (string, int, error) {
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
