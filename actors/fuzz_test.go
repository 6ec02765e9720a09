package actors

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"runtime/debug"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/dpnode/dpnode/engine"
	dpnodev1 "github.com/dpnode/dpnode/proto/dpnode/v1"
)

// peerTarget is the actor of a node that takes a message from a peer.
type peerTarget int

const (
	toAPIServer peerTarget = iota
	toEngine
	toCoordinator
	toNode
)

// peerMessages are the messages a node's actors take from another node:
// every dpnodev1 message that one of their Receive methods handles, with
// the actor that handles it. (NodeMeta comes by gossip: see the control
// package's FuzzGossipMeta. The worker messages go between an engine and
// its own model worker process, never between nodes. CoordinatorChanged
// reaches the API server from its own node actor, which is what a peer
// addresses.)
var peerMessages = []struct {
	new func() proto.Message
	to  peerTarget
}{
	{func() proto.Message { return &dpnodev1.StepOutputs{} }, toAPIServer},
	{func() proto.Message { return &dpnodev1.EngineStats{} }, toAPIServer},
	{func() proto.Message { return &dpnodev1.EngineReady{} }, toAPIServer},
	{func() proto.Message { return &dpnodev1.LoadSnapshot{} }, toAPIServer},
	{func() proto.Message { return &dpnodev1.SubscribeRanks{} }, toAPIServer},
	{func() proto.Message { return &dpnodev1.RankStatuses{} }, toAPIServer},
	{func() proto.Message { return &dpnodev1.RankStatus{} }, toAPIServer},
	{func() proto.Message { return &dpnodev1.RequestList{} }, toAPIServer},
	{func() proto.Message { return &dpnodev1.AddRequest{} }, toEngine},
	{func() proto.Message { return &dpnodev1.ListRequests{} }, toEngine},
	{func() proto.Message { return &dpnodev1.AbortRequests{} }, toEngine},
	{func() proto.Message { return &dpnodev1.StartWave{} }, toEngine},
	{func() proto.Message { return &dpnodev1.StepReport{} }, toEngine},
	{func() proto.Message { return &dpnodev1.GroupChanged{} }, toEngine},
	{func() proto.Message { return &dpnodev1.SubscribeLoad{} }, toCoordinator},
	{func() proto.Message { return &dpnodev1.ReportStats{} }, toCoordinator},
	{func() proto.Message { return &dpnodev1.JoinGroup{} }, toCoordinator},
	{func() proto.Message { return &dpnodev1.FirstRequest{} }, toCoordinator},
	{func() proto.Message { return &dpnodev1.EngineStartedWave{} }, toCoordinator},
	{func() proto.Message { return &dpnodev1.WaveComplete{} }, toCoordinator},
	{func() proto.Message { return &dpnodev1.CollectiveTimeout{} }, toCoordinator},
	{func() proto.Message { return &dpnodev1.CoordinatorChanged{} }, toNode},
}

// Placeholders a seed (or the fuzzer) uses for values only the running
// node knows, so that inputs get past the epoch checks: an engine_epoch
// of 1 is the epoch of the message's rank (of the target rank when the
// message names none that is local), a coordinator epoch of 1 the
// coordinator's, and an actor_address of "@" the node's own address.
const (
	epochPlaceholder   = 1
	addressPlaceholder = "@"
)

// fuzzRanks is the number of ranks of each fuzzed node.
const fuzzRanks = 2

// fuzzRoute is how an input's kind byte is read: kind % len(peerMessages)
// is the message; the quotient picks the target rank (for an engine), the
// sender (a peer actor, or none: a message sent with Send carries no
// sender across nodes) and the node (plain or expert-parallel).
type fuzzRoute struct {
	msg      int
	rank     int
	noSender bool
	ep       bool
}

func routeOf(kind byte) fuzzRoute {
	sel := int(kind) / len(peerMessages)
	return fuzzRoute{msg: int(kind) % len(peerMessages), rank: sel % fuzzRanks, noSender: sel/fuzzRanks%2 == 1, ep: sel/(2*fuzzRanks)%2 == 1}
}

func (r fuzzRoute) kind() byte {
	sel := r.rank + fuzzRanks*(map[bool]int{false: 0, true: 1}[r.noSender]+2*map[bool]int{false: 0, true: 1}[r.ep])
	return byte(sel*len(peerMessages) + r.msg)
}

// fuzzBarrier is answered by the fuzz hook in front of the engine, API
// server and coordinator actors: once it is, the actor has handled every
// message sent to it before.
type fuzzBarrier struct{}

// actorPanic is a panic of an actor's Receive, with its stack.
type actorPanic struct {
	actor string
	value any
	stack string
}

// fuzzHook is faultHook while FuzzPeerMessage runs: it answers barriers
// and records the stack of any panic of the actors it fronts (protoactor
// keeps only the value) before the panic goes on to the supervisor.
type fuzzHook struct {
	prev   func(actor.Context) bool
	inside sync.Map // actor.Actor -> struct{}: Receive entered by the hook
	mu     sync.Mutex
	panics []actorPanic
}

func (h *fuzzHook) hook(ctx actor.Context) bool {
	if h.prev != nil && h.prev(ctx) {
		return true
	}
	if _, ok := ctx.Message().(*fuzzBarrier); ok {
		ctx.Respond(&fuzzBarrier{})
		return true
	}
	a := ctx.Actor()
	if _, in := h.inside.LoadOrStore(a, struct{}{}); in {
		return false // the hook's own call of Receive: the actor handles it
	}
	defer h.inside.Delete(a)
	defer func() {
		if v := recover(); v != nil {
			h.mu.Lock()
			h.panics = append(h.panics, actorPanic{actor: ctx.Self().String(), value: v, stack: string(debug.Stack())})
			h.mu.Unlock()
			panic(v)
		}
	}()
	a.Receive(ctx)
	return true
}

func (h *fuzzHook) taken() []actorPanic {
	h.mu.Lock()
	defer h.mu.Unlock()
	p := h.panics
	h.panics = nil
	return p
}

// fuzzNode is one in-process node the fuzzer sends messages to, with a
// peer actor that stands for the sender and takes whatever is answered.
type fuzzNode struct {
	*testNode
	ep bool
	tb *nodeTB
	// tainted is set once the node took a message with authority.
	tainted     bool
	peer        *actor.PID
	supervision atomic.Int64
	lastReason  atomic.Value
}

// nodeTB is the testing.TB a fuzzed node is started with: it keeps the
// node's cleanups for stop, so that a node outlives the input that
// started it (a fuzz function must not call its F's methods).
type nodeTB struct {
	testing.TB
	cleanups []func()
}

func (tb *nodeTB) Cleanup(f func()) { tb.cleanups = append(tb.cleanups, f) }

func startFuzzNode(t testing.TB, ep bool) *fuzzNode {
	t.Helper()
	profile, timeScale := "llama-3.1-8b-h100", 0.0
	if ep {
		profile = "qwen3-30b-a3b-h200"
	}
	tb := &nodeTB{TB: t}
	tn := startProfileNode(tb, profile, fuzzRanks, timeScale, -1, 0, func(cfg *NodeConfig) {
		cfg.Name = map[bool]string{false: "fuzz-plain", true: "fuzz-ep"}[ep]
		cfg.ExpertParallel = ep
		// Short, so that a group left waiting for a rank that is not
		// there (a peer said so) re-forms within the probe's patience.
		cfg.CollectiveTimeout = 300 * time.Millisecond
		// Whatever a peer adds to an engine ends within 256 tokens.
		cfg.Scheduler.MaxModelLen = 256
		cfg.Logger = slog.New(slog.DiscardHandler)
	})
	fn := &fuzzNode{testNode: tn, ep: ep, tb: tb}
	fn.peer = tn.System().Root.Spawn(actor.PropsFromFunc(func(actor.Context) {}))
	tn.System().EventStream.Subscribe(func(evt any) {
		if se, ok := evt.(*actor.SupervisorEvent); ok {
			fn.lastReason.Store(fmt.Sprintf("%v: %v (%v)", se.Child, se.Reason, se.Directive))
			fn.supervision.Add(1)
		}
	})
	if ep {
		tn.waitGroup(t, fuzzRanks)
	}
	return fn
}

// stop stops the node, giving up on a node that does not stop within a
// while (a wedged actor): the run goes on with a fresh one.
func (fn *fuzzNode) stop(t testing.TB) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := len(fn.tb.cleanups) - 1; i >= 0; i-- {
			fn.tb.cleanups[i]()
		}
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Logf("the %s node did not stop within 10s; left behind", map[bool]string{false: "plain", true: "expert-parallel"}[fn.ep])
	}
}

func (fn *fuzzNode) pid(to peerTarget, rank int) *actor.PID {
	addr := fn.System().Address()
	switch to {
	case toEngine:
		return actor.NewPID(addr, engineID(rank))
	case toCoordinator:
		return actor.NewPID(addr, coordinatorID)
	case toNode:
		return actor.NewPID(addr, nodeID)
	}
	return fn.APIServer()
}

// fill replaces the placeholders in m (see epochPlaceholder) with what
// the node holds now. It reports whether it put in a real epoch.
func (fn *fuzzNode) fill(m protoreflect.Message, rank int, v *ClusterView) (filled bool) {
	fields := m.Descriptor().Fields()
	if fd := fields.ByName("rank"); fd != nil && fd.Kind() == protoreflect.Uint32Kind && int(m.Get(fd).Uint()) < fuzzRanks {
		rank = int(m.Get(fd).Uint())
	}
	for i := range fields.Len() {
		fd := fields.Get(i)
		switch {
		case fd.Kind() == protoreflect.MessageKind && fd.IsList():
			l := m.Get(fd).List()
			for j := range l.Len() {
				filled = fn.fill(l.Get(j).Message(), rank, v) || filled
			}
		case fd.Kind() == protoreflect.MessageKind && !fd.IsMap() && m.Has(fd):
			filled = fn.fill(m.Mutable(fd).Message(), rank, v) || filled
		case fd.Kind() == protoreflect.Uint64Kind && !fd.IsList() && m.Get(fd).Uint() == epochPlaceholder:
			switch {
			case fd.Name() == "engine_epoch":
				for _, r := range v.Ranks {
					if r.Local && r.Rank == rank {
						m.Set(fd, protoreflect.ValueOfUint64(r.Epoch))
						filled = true
					}
				}
			case fd.Name() == "coordinator_epoch" || (fd.Name() == "epoch" && m.Descriptor().Name() == "CoordinatorChanged"):
				m.Set(fd, protoreflect.ValueOfUint64(v.Coordinator.Epoch))
				filled = true
			}
		case fd.Kind() == protoreflect.StringKind && !fd.IsList() && fd.Name() == "actor_address" && m.Get(fd).String() == addressPlaceholder:
			m.Set(fd, protoreflect.ValueOfString(fn.System().Address()))
		}
	}
	return filled
}

// speaksWithAuthority says whether msg, with the real epoch filled in,
// speaks for this node's own engine or for the coordinator: a group, a
// wave, a snapshot, an engine's outputs or readiness. A peer that forges
// those can take a rank out of service as the real sender would (a group
// without it), which is no fault of the receiver; such inputs are held to
// crash-freedom only, and the node is replaced when they leave it out of
// service. A request, an abort, or anything with a wrong epoch must leave
// the node serving.
func speaksWithAuthority(msg proto.Message, filled bool) bool {
	switch msg.(type) {
	case *dpnodev1.AddRequest, *dpnodev1.ReportStats:
		return false
	}
	return filled
}

// barrier waits until the actor at pid has handled what was sent to it.
func (fn *fuzzNode) barrier(pid *actor.PID, timeout time.Duration) error {
	_, err := fn.System().Root.RequestFuture(pid, &fuzzBarrier{}, timeout).Result()
	return err
}

// serves checks that the node still serves: every rank is ready, a
// request submitted now completes, and no actor crashed meanwhile (which
// fails t).
func (fn *fuzzNode) serves(t *testing.T, h *fuzzHook, restartsBefore float64, what string, patience time.Duration) error {
	t.Helper()
	deadline := time.Now().Add(patience)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		v, err := fn.View(ctx)
		cancel()
		if err != nil {
			return fmt.Errorf("after %s: the node does not answer a view: %w", what, err)
		}
		if !slices.ContainsFunc(v.Ranks, func(r RankView) bool { return r.Local && (!r.Ready || r.Failed) }) {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("after %s: a rank stays out of service: %+v", what, v.Ranks)
		}
		time.Sleep(2 * time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	id := fmt.Sprint("probe-", probeSeq.Add(1))
	s := NewStream()
	prompt := fn.tok.Tokens("a probe after " + id)
	sp := engine.SamplingParams{MaxTokens: 2, IgnoreEOS: true}
	fn.Submit(&Submission{ID: id, Prompt: prompt, Sampling: sp, Rank: AnyRank, Stream: s, Arrival: time.Now()})
	r := collect(ctx, s)
	fn.checkNoCrash(t, h, restartsBefore, what)
	if r.err != nil || r.finish != engine.FinishedLength || !slices.Equal(r.tokens, fn.expected(prompt, sp)) {
		state := ""
		if v, err := fn.View(context.Background()); err == nil {
			state = fmt.Sprintf("; the node then: coordinator %+v, ranks %+v", v.Coordinator, v.Ranks)
		}
		return fmt.Errorf("after %s: a request submitted then ends with %v (%v, %d tokens)%s", what, r.err, r.finish, len(r.tokens), state)
	}
	return nil
}

var probeSeq atomic.Int64

func (fn *fuzzNode) restarts(t *testing.T) float64 {
	total := 0.0
	for r := range fuzzRanks {
		total += metricSum(t, fn.reg, "dpnode_engine_restarts_total", r)
	}
	return total
}

func (fn *fuzzNode) checkNoCrash(t *testing.T, h *fuzzHook, restartsBefore float64, what string) {
	t.Helper()
	if ps := h.taken(); len(ps) > 0 {
		t.Fatalf("after %s: %s panicked: %v\n%s", what, ps[0].actor, ps[0].value, ps[0].stack)
	}
	if n := fn.supervision.Swap(0); n > 0 {
		t.Fatalf("after %s: %d actor failures; the last: %v", what, n, fn.lastReason.Load())
	}
	if r := fn.restarts(t); r != restartsBefore {
		// The crash was recorded before the restart was: it may have come
		// in since the check above.
		if ps := h.taken(); len(ps) > 0 {
			t.Fatalf("after %s: %s panicked: %v\n%s", what, ps[0].actor, ps[0].value, ps[0].stack)
		}
		t.Fatalf("after %s: %v engine restarts", what, r-restartsBefore)
	}
}

// FuzzPeerMessage sends one message, as another node would, to the actor
// of a running node that takes it, and checks that the node still serves:
// nothing crashed, every rank is ready, and a request submitted afterwards
// completes token-exactly. One plain and one expert-parallel node live for
// the whole run, so inputs meet whatever state the earlier ones left.
func FuzzPeerMessage(f *testing.F) {
	seed := func(route fuzzRoute, m proto.Message) {
		for i, pm := range peerMessages {
			if proto.MessageName(pm.new()) == proto.MessageName(m) {
				route.msg = i
				b, err := proto.Marshal(m)
				if err != nil {
					f.Fatal(err)
				}
				f.Add(route.kind(), b)
				return
			}
		}
		f.Fatalf("no peer message %s", proto.MessageName(m))
	}
	const maxU32, maxU64 = math.MaxUint32, uint64(math.MaxUint64)
	seedArrival := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano()
	seven := int64(7)
	valid := []proto.Message{
		&dpnodev1.StepOutputs{Rank: 0, EngineEpoch: epochPlaceholder, Step: 3, Outputs: []*dpnodev1.RequestOutput{
			{RequestId: "probe-1", NewTokenIds: []uint32{17}, FinishReason: dpnodev1.FinishReason_FINISH_REASON_UNSPECIFIED}},
			Stats: &dpnodev1.EngineStats{Rank: 0, EngineEpoch: epochPlaceholder, NumRunning: 1, Step: 3}},
		&dpnodev1.EngineStats{Rank: 1, EngineEpoch: epochPlaceholder, NumWaiting: 2, NumRunning: 3, KvCacheUsage: 0.25, Step: 10, ComputedTokens: 100},
		&dpnodev1.EngineReady{Rank: 0, EngineEpoch: epochPlaceholder},
		&dpnodev1.LoadSnapshot{CoordinatorEpoch: epochPlaceholder, Seq: 1000, Ranks: []*dpnodev1.RankLoad{{Rank: 0, NumWaiting: 1}, {Rank: 1, NumRunning: 2}},
			PublishedUnixNano: seedArrival, GroupRanks: []uint32{0, 1}},
		&dpnodev1.SubscribeRanks{},
		&dpnodev1.RankStatuses{Ranks: []*dpnodev1.RankStatus{{Rank: 2, EngineEpoch: 5, Ready: true}, {Rank: 3, EngineEpoch: 5, Ready: true}}},
		&dpnodev1.RankStatus{Rank: 2, EngineEpoch: 6, Ready: true},
		&dpnodev1.RequestList{Rank: 0, EngineEpoch: epochPlaceholder, RequestIds: []string{"probe-1"}},
		&dpnodev1.AddRequest{RequestId: "peer-1", PromptTokenIds: []uint32{16, 17, 18, 19}, Sampling: &dpnodev1.SamplingParams{MaxTokens: 4, Temperature: 1},
			EngineEpoch: epochPlaceholder, ArrivalUnixNano: seedArrival},
		&dpnodev1.ListRequests{},
		&dpnodev1.AbortRequests{RequestIds: []string{"peer-1", "probe-1"}},
		&dpnodev1.StartWave{CoordinatorEpoch: epochPlaceholder, Wave: 1, ExcludeRank: 1, TriggerUnixNano: seedArrival},
		&dpnodev1.StepReport{Rank: 1, Wave: 0, Step: 0, NumTokens: 4, HasUnfinished: true, Shape: &dpnodev1.StepShape{PrefillTokens: 4, PrefillContextProduct: 16}},
		&dpnodev1.GroupChanged{CoordinatorEpoch: epochPlaceholder, Seq: 3, Members: []*dpnodev1.GroupMember{{Rank: 0, ActorAddress: addressPlaceholder}, {Rank: 1, ActorAddress: addressPlaceholder}}},
		&dpnodev1.SubscribeLoad{Ranks: []uint32{0}},
		&dpnodev1.ReportStats{Stats: &dpnodev1.EngineStats{Rank: 0, EngineEpoch: epochPlaceholder, NumRunning: 1}},
		&dpnodev1.JoinGroup{Rank: 1},
		&dpnodev1.FirstRequest{TargetRank: 0, Wave: 0, ArrivalUnixNano: seedArrival},
		&dpnodev1.EngineStartedWave{Rank: 1, Wave: 1},
		&dpnodev1.WaveComplete{Rank: 0, Wave: 0},
		&dpnodev1.CollectiveTimeout{CoordinatorEpoch: epochPlaceholder, Seq: 2, Rank: 0, Missing: []uint32{1}},
		&dpnodev1.CoordinatorChanged{ActorAddress: addressPlaceholder, Epoch: epochPlaceholder},
	}
	hostile := []proto.Message{
		&dpnodev1.StepOutputs{Rank: maxU32, EngineEpoch: 0},
		&dpnodev1.StepOutputs{Rank: 1, EngineEpoch: epochPlaceholder, Outputs: []*dpnodev1.RequestOutput{
			{RequestId: "", FinishReason: 99}, {RequestId: "probe-2", NewTokenIds: []uint32{maxU32}, FinishReason: dpnodev1.FinishReason_FINISH_REASON_ERROR, Attempt: maxU32}}},
		&dpnodev1.EngineStats{Rank: 0, EngineEpoch: epochPlaceholder, NumWaiting: maxU32, NumRunning: maxU32, KvCacheUsage: float32(math.NaN()),
			PrefixCacheQueries: maxU64, PrefixCacheHits: maxU64, NumPreemptions: maxU64, Step: maxU64, Wave: maxU64, WaveRunning: true, ComputedTokens: maxU64},
		&dpnodev1.EngineStats{Rank: 0, EngineEpoch: epochPlaceholder, Step: 0, KvCacheUsage: float32(math.Inf(-1))},
		&dpnodev1.EngineReady{Rank: maxU32, EngineEpoch: maxU64},
		&dpnodev1.LoadSnapshot{CoordinatorEpoch: epochPlaceholder, Seq: maxU64, Ranks: []*dpnodev1.RankLoad{{Rank: maxU32, NumWaiting: maxU32}, nil},
			CurrentWave: maxU64, EnginesRunning: true, GroupRanks: []uint32{maxU32, 7}},
		&dpnodev1.LoadSnapshot{CoordinatorEpoch: 0},
		&dpnodev1.RankStatuses{Ranks: []*dpnodev1.RankStatus{{Rank: 0, EngineEpoch: 0, Ready: false}, {Rank: maxU32, Ready: true}, nil}},
		&dpnodev1.RankStatus{Rank: 1, EngineEpoch: 0},
		&dpnodev1.RequestList{Rank: 1, EngineEpoch: epochPlaceholder},
		&dpnodev1.RequestList{Rank: maxU32, EngineEpoch: maxU64, RequestIds: []string{""}},
		&dpnodev1.AddRequest{RequestId: "", PromptTokenIds: []uint32{16}, EngineEpoch: epochPlaceholder},
		&dpnodev1.AddRequest{RequestId: "empty", EngineEpoch: epochPlaceholder},
		&dpnodev1.AddRequest{RequestId: "vocab", PromptTokenIds: []uint32{maxU32, 128256, 0}, Sampling: &dpnodev1.SamplingParams{MaxTokens: 2}, EngineEpoch: epochPlaceholder},
		&dpnodev1.AddRequest{RequestId: "zero-max", PromptTokenIds: []uint32{16, 17}, Sampling: &dpnodev1.SamplingParams{MaxTokens: 0, IgnoreEos: true}, EngineEpoch: epochPlaceholder},
		&dpnodev1.AddRequest{RequestId: "huge-max", PromptTokenIds: []uint32{16, 17}, Sampling: &dpnodev1.SamplingParams{MaxTokens: maxU32, MinTokens: maxU32, IgnoreEos: true,
			Temperature: float32(math.NaN()), TopP: -1, TopK: math.MinInt32, Seed: &seven, StopTokenIds: []uint32{maxU32, 2}}, EngineEpoch: epochPlaceholder},
		&dpnodev1.AddRequest{RequestId: "long", PromptTokenIds: make([]uint32, 300), EngineEpoch: epochPlaceholder},
		&dpnodev1.AddRequest{RequestId: "output", PromptTokenIds: []uint32{16}, OutputTokenIds: []uint32{17, 18, 19}, Sampling: &dpnodev1.SamplingParams{MaxTokens: 2},
			EngineEpoch: epochPlaceholder, Wave: maxU64, Attempt: maxU32, ArrivalUnixNano: math.MinInt64},
		&dpnodev1.AddRequest{RequestId: "peer-1", PromptTokenIds: []uint32{16}, EngineEpoch: 0},
		&dpnodev1.AbortRequests{RequestIds: []string{"", "peer-1", "peer-1"}},
		&dpnodev1.StartWave{CoordinatorEpoch: epochPlaceholder, Wave: maxU64, ExcludeRank: math.MinInt32, TriggerUnixNano: math.MaxInt64},
		&dpnodev1.StartWave{CoordinatorEpoch: 0, Wave: 2},
		&dpnodev1.StepReport{Rank: 1, Wave: maxU64, Step: maxU64, NumTokens: maxU32, Shape: &dpnodev1.StepShape{PrefillTokens: maxU32, PrefillContextProduct: math.MinInt64, DecodeSeqs: maxU32}},
		&dpnodev1.StepReport{Rank: maxU32, Wave: 1},
		&dpnodev1.StepReport{Rank: 0, Wave: 0, Step: 1},
		&dpnodev1.GroupChanged{CoordinatorEpoch: epochPlaceholder, Seq: maxU64, Members: []*dpnodev1.GroupMember{{Rank: 1, ActorAddress: addressPlaceholder}}},
		&dpnodev1.GroupChanged{CoordinatorEpoch: epochPlaceholder, Seq: 1 << 40, Members: []*dpnodev1.GroupMember{{Rank: 0, ActorAddress: addressPlaceholder}, {Rank: maxU32, ActorAddress: "nowhere:1"}, nil}},
		&dpnodev1.GroupChanged{CoordinatorEpoch: epochPlaceholder, Seq: 100},
		&dpnodev1.SubscribeLoad{Ranks: []uint32{maxU32, 0, 0}},
		&dpnodev1.ReportStats{Stats: &dpnodev1.EngineStats{Rank: maxU32, NumWaiting: maxU32, KvCacheUsage: float32(math.Inf(1))}},
		&dpnodev1.ReportStats{},
		&dpnodev1.JoinGroup{Rank: maxU32},
		&dpnodev1.JoinGroup{Rank: 7},
		&dpnodev1.FirstRequest{TargetRank: maxU32, Wave: maxU64, ArrivalUnixNano: math.MinInt64},
		&dpnodev1.EngineStartedWave{Rank: maxU32, Wave: maxU64},
		&dpnodev1.WaveComplete{Rank: 0, Wave: maxU64},
		&dpnodev1.CollectiveTimeout{CoordinatorEpoch: epochPlaceholder, Seq: 1, Rank: maxU32, Missing: []uint32{0, 1, maxU32}},
		&dpnodev1.CollectiveTimeout{CoordinatorEpoch: 0, Seq: maxU64, Rank: 0},
		&dpnodev1.CoordinatorChanged{ActorAddress: "nowhere:1", Epoch: epochPlaceholder},
		&dpnodev1.CoordinatorChanged{ActorAddress: "", Epoch: maxU64},
		&dpnodev1.CoordinatorChanged{ActorAddress: addressPlaceholder, Epoch: 0},
	}
	for _, ep := range []bool{false, true} {
		for _, m := range valid {
			seed(fuzzRoute{rank: 0, ep: ep}, m)
		}
	}
	for _, m := range valid {
		// Sent with Send: across nodes, such a message has no sender.
		seed(fuzzRoute{rank: 1, noSender: true, ep: true}, m)
	}
	for i, m := range hostile {
		seed(fuzzRoute{rank: i % fuzzRanks, ep: i%4 >= 2}, m)
	}
	seed(fuzzRoute{rank: 1, ep: true}, valid[8]) // the AddRequest, to the other rank
	f.Add(byte(0), []byte{0xff})                 // not a message: refused by the transport

	h := &fuzzHook{prev: faultHook}
	faultHook = h.hook
	nodes := map[bool]*fuzzNode{}
	f.Cleanup(func() {
		for _, fn := range nodes {
			fn.stop(f)
		}
		faultHook = h.prev
	})
	nodes[false], nodes[true] = startFuzzNode(f, false), startFuzzNode(f, true)

	// deliver sends the input to its node's actor and checks that the node
	// goes on serving. Any crash fails the input. A node that stops
	// serving after a message with authority (see speaksWithAuthority) is
	// replaced; after any other message it fails the input, unless the
	// node had taken a message with authority before: then that message
	// may be what broke it, and the input is tried again on a fresh node,
	// where it must not fail.
	var deliver func(t *testing.T, route fuzzRoute, payload []byte)
	deliver = func(t *testing.T, route fuzzRoute, payload []byte) {
		pm := peerMessages[route.msg]
		msg := pm.new()
		if err := proto.Unmarshal(payload, msg); err != nil {
			t.Fatal(err)
		}
		fn := nodes[route.ep]
		restarts := fn.restarts(t)
		fn.checkNoCrash(t, h, restarts, "the previous input")
		v, err := fn.View(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		authority := speaksWithAuthority(msg, fn.fill(msg.ProtoReflect(), route.rank, v))
		what := fmt.Sprintf("%s {%v} to %v (rank %d, no sender %v, expert parallel %v)", proto.MessageName(msg), msg, pm.to, route.rank, route.noSender, route.ep)
		to := fn.pid(pm.to, route.rank)
		if route.noSender {
			fn.System().Root.Send(to, msg)
		} else {
			fn.System().Root.RequestWithCustomSender(to, msg, fn.peer)
		}
		if pm.to != toNode {
			if err := fn.barrier(to, 5*time.Second); err != nil {
				fn.checkNoCrash(t, h, restarts, what)
				t.Fatalf("after %s: the actor does not answer: %v", what, err)
			}
		}
		fn.checkNoCrash(t, h, restarts, what)
		patience := 5 * time.Second
		if authority {
			fn.tainted, patience = true, time.Second
		}
		err = fn.serves(t, h, restarts, what, patience)
		switch {
		case err == nil:
		case authority:
			t.Logf("%v; a forged message of an engine or the coordinator may do that; the node is replaced", err)
			fn.stop(t)
			nodes[route.ep] = startFuzzNode(t, route.ep)
		case fn.tainted:
			t.Logf("%v; the node had taken forged messages of an engine or the coordinator before: trying again on a fresh node", err)
			fn.stop(t)
			nodes[route.ep] = startFuzzNode(t, route.ep)
			deliver(t, route, payload)
		default:
			t.Fatal(err)
		}
	}

	f.Fuzz(func(t *testing.T, kind byte, payload []byte) {
		route := routeOf(kind)
		msg := peerMessages[route.msg].new()
		if err := proto.Unmarshal(payload, msg); err != nil {
			t.Skip("the transport refuses what does not unmarshal")
		}
		// A failed input leaves its node in whatever state failed: the
		// next input gets a fresh one.
		defer func() {
			if t.Failed() {
				h.taken()
				nodes[route.ep].stop(t)
				nodes[route.ep] = startFuzzNode(t, route.ep)
			}
		}()
		deliver(t, route, payload)
	})
}

func (t peerTarget) String() string {
	return [...]string{"the API server", "an engine", "the coordinator", "the node actor"}[t]
}
