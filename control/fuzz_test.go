package control_test

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
	"google.golang.org/protobuf/proto"

	"github.com/dpnode/dpnode/actors"
	"github.com/dpnode/dpnode/actors/actorstest"
	"github.com/dpnode/dpnode/control"
	"github.com/dpnode/dpnode/dp"
	"github.com/dpnode/dpnode/engine"
	"github.com/dpnode/dpnode/engine/sim"
	dpnodev1 "github.com/dpnode/dpnode/proto/dpnode/v1"
)

// gossipNode is the node FuzzGossipMeta hands membership events to, as
// node.Start wires it: ranks 0 and 1 of 4, balancing over the cluster
// (internal mode), on the simulated zero-cost executor.
type gossipNode struct {
	node *actors.Node
	tok  *sim.Tokenizer
}

func startGossipNode(t testing.TB) *gossipNode {
	t.Helper()
	n, tok := actorstest.StartSimNode(t, actorstest.Config{Name: "fuzz-self", Model: "fuzz-model",
		Topology: dp.Topology{Mode: dp.Internal, Size: 4, LocalSize: 2}, MaxModelLen: 256})
	return &gossipNode{node: n, tok: tok}
}

// stop stops the node, leaving behind one that does not stop in a while
// (its actors wedged), so that the run can go on with a fresh one.
func (g *gossipNode) stop(t testing.TB) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		g.node.Stop()
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Logf("the node did not stop within 10s; left behind")
	}
}

var gossipProbes int

// serves checks that the node answers a view and serves a request within
// a few seconds.
func (g *gossipNode) serves(what string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if _, err := g.node.View(ctx); err != nil {
		return fmt.Errorf("after %s: the node does not answer a view within 2s: %w", what, err)
	}
	gossipProbes++
	s := actors.NewStream()
	ctx, cancel = context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	g.node.Submit(&actors.Submission{ID: fmt.Sprint("probe-", gossipProbes), Prompt: g.tok.Tokens("a probe"),
		Sampling: engine.SamplingParams{MaxTokens: 2, IgnoreEOS: true}, Rank: actors.AnyRank, Stream: s, Arrival: time.Now()})
	var buf []actors.Event
	for {
		evs, err := s.Next(ctx, buf)
		if err != nil {
			return fmt.Errorf("after %s: a request does not finish within 5s: %w", what, err)
		}
		for _, ev := range evs {
			switch {
			case ev.Err != nil:
				return fmt.Errorf("after %s: a request fails: %w", what, ev.Err)
			case ev.Finish != engine.NotFinished:
				return nil
			}
		}
		buf = evs
	}
}

// FuzzGossipMeta hands arbitrary bytes, as a peer's gossiped metadata
// (memberlist.Node.Meta), to the delegate that decides on peers: the
// merge and alive checks must refuse what does not decode, the join,
// update and leave notices must ignore it, and a peer they admit is handed
// to a running node, as node.Start wires it (OnEvent is Node.MemberEvent),
// which must go on serving: answer a view, serve a request.
func FuzzGossipMeta(f *testing.F) {
	addGossipSeeds(f)
	z := &gossipFuzz{g: startGossipNode(f)}
	f.Cleanup(func() { z.g.stop(f) })
	self := z.g.node.Meta()
	z.d = control.NewDelegate(control.MembershipConfig{Name: z.g.node.Name(), Meta: self, Logger: slog.New(slog.DiscardHandler),
		OnEvent: func(ev *control.MemberEvent) {
			z.mu.Lock()
			z.events = append(z.events, ev)
			z.mu.Unlock()
			z.g.node.MemberEvent(ev)
		},
		OnConflict: func(error) {}}, "127.0.0.1:7946") // this node's own gossip address
	f.Fuzz(func(t *testing.T, meta []byte) {
		defer func() {
			if t.Failed() {
				z.g.stop(t)
				z.g = startGossipNode(t)
				z.taken()
			}
		}()
		z.check(t, meta)
	})
}

// addGossipSeeds adds FuzzGossipMeta's seed corpus: peers of the node's
// cluster, and metadata that does not decode.
func addGossipSeeds(f *testing.F) {
	add := func(m *dpnodev1.NodeMeta) {
		b, err := proto.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	boot := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano()
	peer := func(mut func(*dpnodev1.NodeMeta)) *dpnodev1.NodeMeta {
		m := &dpnodev1.NodeMeta{ActorAddress: "127.0.0.2:50051", HttpAddress: "127.0.0.2:8000", StartRank: 2, LocalSize: 2,
			DataParallelSize: 4, BootUnixNano: boot, Mode: "internal", Model: "fuzz-model"}
		if mut != nil {
			mut(m)
		}
		return m
	}
	add(peer(nil)) // the other half of the cluster
	add(peer(func(m *dpnodev1.NodeMeta) { m.BootUnixNano = math.MaxInt64 }))
	add(peer(func(m *dpnodev1.NodeMeta) { m.Draining = true }))
	add(peer(func(m *dpnodev1.NodeMeta) { m.LocalSize, m.StartRank, m.HttpAddress = 0, 0, "" })) // an API-only node
	add(peer(func(m *dpnodev1.NodeMeta) { m.Headless, m.HttpAddress = true, "" }))
	add(peer(func(m *dpnodev1.NodeMeta) { m.StartRank = 0 }))              // takes ranks of this node
	add(peer(func(m *dpnodev1.NodeMeta) { m.ExpertParallel = true }))      // disagrees on expert parallelism
	add(peer(func(m *dpnodev1.NodeMeta) { m.DataParallelSize = 9 }))       // disagrees on the size
	add(peer(func(m *dpnodev1.NodeMeta) { m.StartRank = 7 }))              // ranks beyond the size
	add(peer(func(m *dpnodev1.NodeMeta) { m.LocalSize = math.MaxUint32 })) // ranks 2 to 2^32
	add(peer(func(m *dpnodev1.NodeMeta) { m.StartRank, m.LocalSize = math.MaxUint32, 2 }))
	add(peer(func(m *dpnodev1.NodeMeta) { m.BootUnixNano, m.ActorAddress = math.MinInt64, "" }))
	add(peer(func(m *dpnodev1.NodeMeta) { m.ActorAddress = "fuzz-self" }))
	add(peer(func(m *dpnodev1.NodeMeta) { m.Model, m.Mode = "another-model", "nonsense" }))
	f.Add([]byte{})
	f.Add([]byte{0x0a})                   // a field cut short
	f.Add([]byte{0x0a, 0x02, 0xff, 0xfe}) // an address that is not UTF-8
	f.Add([]byte{0x20, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01})
	f.Add([]byte{0x7a, 0x00})     // an unknown field
	f.Add([]byte("not protobuf")) // JSON, say, from an older version
}

// gossipFuzz is what FuzzGossipMeta runs on: the delegate under test, the
// node it hands its events to, and the events not looked at yet.
type gossipFuzz struct {
	d      *control.Delegate
	g      *gossipNode
	mu     sync.Mutex
	events []*control.MemberEvent
}

// taken returns the events since the last call.
func (z *gossipFuzz) taken() []*control.MemberEvent {
	z.mu.Lock()
	defer z.mu.Unlock()
	evs := z.events
	z.events = nil
	return evs
}

// check gives the delegate a peer whose metadata is meta, as a stranger
// and as this node's earlier incarnation.
func (z *gossipFuzz) check(t *testing.T, meta []byte) {
	var want dpnodev1.NodeMeta
	decodes := proto.Unmarshal(meta, &want) == nil

	// A peer at an address of its own: the checks decide.
	n := &memberlist.Node{Name: "peer", Addr: net.IPv4(127, 0, 0, 2), Port: 7946, Meta: meta, State: memberlist.StateAlive}
	aliveErr := z.d.NotifyAlive(n)
	mergeErr := z.d.NotifyMerge([]*memberlist.Node{n})
	switch {
	case !decodes && (aliveErr == nil || mergeErr == nil):
		t.Fatalf("metadata that does not decode was admitted: alive %v, merge %v", aliveErr, mergeErr)
	case (aliveErr == nil) != (mergeErr == nil):
		t.Fatalf("the alive check says %v and the merge check %v", aliveErr, mergeErr)
	}
	if aliveErr == nil {
		z.notices(t, n, &want, 3)
	} else if !decodes {
		// memberlist drops a peer its delegate refuses: no notice of
		// it follows, but for metadata that does not decode, which
		// the notices must ignore on their own.
		z.notices(t, n, nil, 0)
	}
	if err := z.g.serves("the notices of a peer"); err != nil {
		t.Fatal(err)
	}

	// A peer at this node's own gossip address: an earlier incarnation
	// of this node, which the checks admit whatever its metadata
	// (it hosted these ranks): the notices must ignore what does not
	// decode, and the node must take the rest.
	n = &memberlist.Node{Name: "peer-before-restart", Addr: net.IPv4(127, 0, 0, 1), Port: 7946, Meta: meta, State: memberlist.StateAlive}
	if err := z.d.NotifyAlive(n); err != nil && !decodes {
		return
	}
	if decodes {
		z.notices(t, n, &want, -1)
	} else {
		z.notices(t, n, nil, 0)
	}
	if err := z.g.serves("the notices of an earlier incarnation"); err != nil {
		t.Fatal(err)
	}
}

// notices gives the delegate n's join, update and leave, as memberlist
// does for a member it admitted, and checks the events: each of its
// notice's kind, with want as the metadata, handed to the node, which
// must go on serving after each. events is how many of the three
// notices must make one: 0, 3, or -1 for either (the delegate may
// refuse metadata at the notices too, but for all three alike).
func (z *gossipFuzz) notices(t *testing.T, n *memberlist.Node, want *dpnodev1.NodeMeta, events int) {
	t.Helper()
	got := 0
	for _, step := range []struct {
		notify func(*memberlist.Node)
		kind   control.MemberEventKind
	}{{z.d.NotifyJoin, control.MemberJoined}, {z.d.NotifyUpdate, control.MemberUpdated}, {z.d.NotifyLeave, control.MemberLeft}} {
		step.notify(n)
		evs := z.taken()
		if len(evs) > 1 || (len(evs) == 1 && (events == 0 || evs[0].Kind != step.kind || evs[0].Name != n.Name || !proto.Equal(evs[0].Meta, want))) {
			t.Fatalf("notice of kind %v of %s made events %+v", step.kind, n.Name, evs)
		}
		got += len(evs)
		if err := z.g.serves(fmt.Sprintf("member event %v of %s with %v", step.kind, n.Name, want)); err != nil {
			t.Fatal(err)
		}
	}
	if got != 0 && got != 3 || events >= 0 && got != events {
		t.Fatalf("%d of the join, update and leave notices of %s made an event; want %d", got, n.Name, events)
	}
	// Nothing of a peer that left may stay.
	v, err := z.g.node.View(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if slices.ContainsFunc(v.Nodes, func(nv actors.NodeView) bool { return nv.Name == n.Name }) {
		t.Fatalf("%s is still a member after it left: %+v", n.Name, v.Nodes)
	}
}
