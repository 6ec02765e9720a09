package control

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
	"google.golang.org/protobuf/proto"

	dpnodev1 "github.com/dpnode/dpnode/proto/dpnode/v1"
)

// tlsServer answers TLS handshakes with files' certificate until the test
// ends, as a node's actor transport does, and returns its address.
func tlsServer(t *testing.T, files TLSFiles) string {
	t.Helper()
	cfg, err := files.config()
	if err != nil {
		t.Fatal(err)
	}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_ = c.(*tls.Conn).Handshake()
			c.Close()
		}
	}()
	return ln.Addr().String()
}

// TestVerifierWantsThePeersNameAtItsAddress: a peer passes the check only
// when the node at the actor address it gossips shows a certificate of
// the CA and answers with the peer's name. Before, a handshake was all:
// a peer with the gossip key could gossip a real node's actor address and
// be counted.
func TestVerifierWantsThePeersNameAtItsAddress(t *testing.T) {
	ours, theirs := newTestCA(t, "ours"), newTestCA(t, "theirs")
	real := tlsServer(t, ours.Node(t, "b"))
	foreign := tlsServer(t, theirs.Node(t, "x"))
	asked := map[string]int{}
	identify := func(_ context.Context, address string) (string, error) {
		asked[address]++
		if address == real {
			return "node-b", nil
		}
		return "", errors.New("no answer")
	}
	verify, err := ours.Node(t, "a").Verifier(identify)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := verify(ctx, "node-b", real); err != nil {
		t.Errorf("the node at its own address: %v", err)
	}
	if err := verify(ctx, "intruder", real); err == nil || !strings.Contains(err.Error(), "is the node node-b's") {
		t.Errorf("a peer that gossips node-b's address: %v; want it refused, naming node-b", err)
	}
	if err := verify(ctx, "node-x", foreign); err == nil || !strings.Contains(err.Error(), "no certificate of this cluster's CA") {
		t.Errorf("a peer with another CA's certificate: %v; want it refused", err)
	}
	if asked[foreign] != 0 {
		t.Errorf("identify asked a peer whose certificate failed %d times; the handshake comes first", asked[foreign])
	}
}

// TestPeerWithNoAddressToCheckIsNoMember: with a check, a peer is counted
// only at an address that can be checked, its actor address or, while it
// waits for its ranks, its joining one. Before, a peer that gossiped no
// address (one waiting for ranks) was counted unchecked.
func TestPeerWithNoAddressToCheckIsNoMember(t *testing.T) {
	var checked []string
	d := &delegate{cfg: MembershipConfig{
		Name:   "self",
		Meta:   &dpnodev1.NodeMeta{Model: "m"},
		Logger: slog.New(slog.DiscardHandler),
		VerifyPeer: func(_ context.Context, name, address string) error {
			checked = append(checked, name+"@"+address)
			return nil
		},
	}}
	d.setAddr("127.0.0.1:7946")
	peer := func(name string, meta *dpnodev1.NodeMeta) *memberlist.Node {
		b, err := proto.Marshal(meta)
		if err != nil {
			t.Fatal(err)
		}
		return &memberlist.Node{Name: name, Addr: net.ParseIP("127.0.0.2"), Port: 7946, Meta: b}
	}
	if _, _, err := d.conflict(peer("silent", &dpnodev1.NodeMeta{Model: "m"})); err == nil || !strings.Contains(err.Error(), "gossips no actor address") {
		t.Errorf("a peer with no address to check: %v; want it refused", err)
	}
	if _, _, err := d.conflict(peer("joining", &dpnodev1.NodeMeta{Model: "m", JoiningActorAddress: "127.0.0.2:9000"})); err != nil {
		t.Errorf("a joining peer: %v", err)
	}
	if _, _, err := d.conflict(peer("serving", &dpnodev1.NodeMeta{Model: "m", ActorAddress: "127.0.0.3:9000", LocalSize: 1})); err != nil {
		t.Errorf("a serving peer: %v", err)
	}
	if want := []string{"joining@127.0.0.2:9000", "serving@127.0.0.3:9000"}; strings.Join(checked, " ") != strings.Join(want, " ") {
		t.Errorf("checked %v, want %v", checked, want)
	}
}

// TestClaimsByGossipAreIgnored: gossip says nothing of who sent a message,
// so a claim (or a release of another node's ranks) that comes by gossip
// reaches no node actor; claims come over the actor transport. Before,
// anyone with the gossip key could give back any node's ranks.
func TestClaimsByGossipAreIgnored(t *testing.T) {
	d := &delegate{cfg: MembershipConfig{Name: "self", Meta: &dpnodev1.NodeMeta{Model: "m"}, Logger: slog.New(slog.DiscardHandler)}}
	var claims int
	d.onClaim = func(Claim, bool) { claims++ }
	for _, release := range []bool{false, true} {
		d.receive(mustMarshal(&dpnodev1.GossipMessage{Body: &dpnodev1.GossipMessage_Claim{Claim: &dpnodev1.RankClaim{Node: "victim:7946", Count: 1, Release: release}}}))
	}
	if claims != 0 {
		t.Errorf("%d gossiped claims reached the node; want none", claims)
	}
}

// TestRosterUnderTLSMustBeSigned: under cluster TLS a node adopts a roster
// only signed by a certificate of the CA, and passes it on as it came.
// Before, a roster was adopted from anyone with the gossip key, who could
// so hand out or take away every rank.
func TestRosterUnderTLSMustBeSigned(t *testing.T) {
	ours, theirs := newTestCA(t, "ours"), newTestCA(t, "theirs")
	leader, stranger := ours.Seal(t, "leader"), theirs.Seal(t, "stranger")
	roster := func(version uint64) []byte {
		return mustMarshal(&dpnodev1.Roster{Version: version, Epoch: 1, Holds: []*dpnodev1.RankHold{{Node: "127.0.0.9:7946", Count: 1}}})
	}
	signed := func(s Seal, body []byte, tamper bool) []byte {
		sr, err := s.Sign(body)
		if err != nil {
			t.Fatal(err)
		}
		if tamper {
			sr.Body = roster(99)
		}
		return mustMarshal(&dpnodev1.GossipMessage{Body: &dpnodev1.GossipMessage_SignedRoster{SignedRoster: sr}})
	}
	unsigned := func(version uint64) []byte {
		var pr dpnodev1.Roster
		if err := proto.Unmarshal(roster(version), &pr); err != nil {
			t.Fatal(err)
		}
		return mustMarshal(&dpnodev1.GossipMessage{Body: &dpnodev1.GossipMessage_Roster{Roster: &pr}})
	}
	d := newDelegate(MembershipConfig{Name: "self", Meta: &dpnodev1.NodeMeta{Model: "m"}, Seal: ours.Seal(t, "self"),
		Logger: slog.New(slog.DiscardHandler)}, nil, 4)
	for _, c := range []struct {
		name string
		msg  []byte
	}{
		{"unsigned", unsigned(1)},
		{"signed by another CA's certificate", signed(stranger, roster(2), false)},
		{"altered after signing", signed(leader, roster(3), true)},
	} {
		d.receive(c.msg)
		if v := d.currentRoster().Version; v != 0 {
			t.Fatalf("a roster %s was adopted (version %d)", c.name, v)
		}
	}
	good := signed(leader, roster(4), false)
	d.receive(good)
	if v := d.currentRoster().Version; v != 4 {
		t.Fatalf("the leader's signed roster: version %d, want 4", v)
	}
	if !bytes.Equal(d.rosterMessage(), good) {
		t.Error("the roster is not passed on as it came, with its signature")
	}
	// A roster this node decides goes out signed.
	if !d.adopt(Roster{Version: 5, Epoch: 1, Holds: []Hold{{Node: "127.0.0.9:7946", Count: 2}}}, nil) {
		t.Fatal("a newer roster of this node's was not adopted")
	}
	var msg dpnodev1.GossipMessage
	if err := proto.Unmarshal(d.rosterMessage(), &msg); err != nil || msg.GetSignedRoster() == nil {
		t.Fatalf("this node's roster goes out as %v (%v); want it signed", msg.Body, err)
	}
	if err := leader.Check(msg.GetSignedRoster()); err != nil {
		t.Errorf("another node of the cluster refuses this node's signature: %v", err)
	}
	// Without TLS, the gossip key is the whole check.
	plain := newDelegate(MembershipConfig{Name: "self", Meta: &dpnodev1.NodeMeta{Model: "m"}, Logger: slog.New(slog.DiscardHandler)}, nil, 4)
	plain.receive(unsigned(1))
	if v := plain.currentRoster().Version; v != 1 {
		t.Errorf("without TLS an unsigned roster: version %d, want 1", v)
	}
}

// TestRefusalUnderTLSMustBeSigned: under cluster TLS a joining node takes
// a refusal of its claim only signed by a certificate of the CA. Before,
// anyone with the gossip key could turn a joining node away.
func TestRefusalUnderTLSMustBeSigned(t *testing.T) {
	ours, theirs := newTestCA(t, "ours"), newTestCA(t, "theirs")
	refusal := mustMarshal(&dpnodev1.ClaimRefused{Node: "me", Reason: "the deployment is full"})
	signed := func(s Seal) []byte {
		sr, err := s.Sign(refusal)
		if err != nil {
			t.Fatal(err)
		}
		return mustMarshal(&dpnodev1.GossipMessage{Body: &dpnodev1.GossipMessage_SignedRefused{SignedRefused: sr}})
	}
	var cr dpnodev1.ClaimRefused
	if err := proto.Unmarshal(refusal, &cr); err != nil {
		t.Fatal(err)
	}
	unsigned := mustMarshal(&dpnodev1.GossipMessage{Body: &dpnodev1.GossipMessage_Refused{Refused: &cr}})
	d := newDelegate(MembershipConfig{Name: "self", Meta: &dpnodev1.NodeMeta{Model: "m", NodeId: "me"}, Seal: ours.Seal(t, "me"),
		Logger: slog.New(slog.DiscardHandler)}, nil, 4)
	refused := func() error {
		d.mu.Lock()
		defer d.mu.Unlock()
		return d.claimRefusal
	}
	d.receive(unsigned)
	d.receive(signed(theirs.Seal(t, "stranger")))
	if err := refused(); err != nil {
		t.Fatalf("an unsigned refusal, or one signed by another CA, was taken: %v", err)
	}
	d.receive(signed(ours.Seal(t, "leader")))
	if err := refused(); err == nil || !strings.Contains(err.Error(), "the deployment is full") {
		t.Fatalf("the leader's signed refusal: %v", err)
	}
}
