package actors

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	dpnodev1 "github.com/dpnode/dpnode/proto/dpnode/v1"
)

// RankView is one rank of the cluster as a node sees it.
type RankView struct {
	Rank int    `json:"rank"`
	Node string `json:"node"`
	// Local: hosted by this node. Balanced: this node's API server sends
	// it requests. A rank that is neither is known from the coordinator's
	// load snapshot only.
	Local    bool `json:"local"`
	Balanced bool `json:"balanced"`
	Ready    bool `json:"ready"`
	// Epoch numbers the rank's engine incarnation.
	Epoch uint64 `json:"engine_epoch"`
	// Failed: the rank's engine crashed too often and was stopped.
	Failed   bool `json:"failed"`
	InFlight int  `json:"in_flight"`
	// PendingPrefill is the prompt tokens the rank has yet to prefill
	// for the requests this node sent it.
	PendingPrefill int     `json:"pending_prefill_tokens"`
	Waiting        int     `json:"waiting"`
	Running        int     `json:"running"`
	KVUsage        float64 `json:"kv_cache_usage"`
	Restarts       int     `json:"restarts_last_window"`
	Steps          uint64  `json:"steps"`
	Device         string  `json:"device,omitempty"`
	// The engine's wave, with expert parallelism.
	Wave        uint64 `json:"wave"`
	WaveRunning bool   `json:"wave_running"`
}

// NodeView is one member of the cluster.
type NodeView struct {
	Name         string    `json:"name"`
	Self         bool      `json:"self"`
	ActorAddress string    `json:"actor_address"`
	HTTPAddress  string    `json:"http_address,omitempty"`
	BootTime     time.Time `json:"boot_time"`
	Mode         string    `json:"mode"`
	Headless     bool      `json:"headless"`
	FirstRank    int       `json:"first_rank"`
	LocalRanks   int       `json:"local_ranks"`
	// Draining: the node finishes what it has and takes nothing new.
	Draining bool `json:"draining"`
}

// CoordinatorView says where the coordinator runs, as this node sees it.
type CoordinatorView struct {
	// Node runs the coordinator; empty when none does (no majority).
	Node      string `json:"node"`
	Epoch     uint64 `json:"epoch"`
	Quorum    bool   `json:"quorum"`
	RanksSeen int    `json:"ranks_seen"`
	// RunningHere is true on the node that runs it.
	RunningHere bool `json:"running_here"`
	// The last load snapshot this node received from it, and how many
	// ranks had reported to it.
	SnapshotSeq   uint64    `json:"snapshot_seq"`
	LastSnapshot  time.Time `json:"last_snapshot,omitzero"`
	RanksReported int       `json:"ranks_reported"`
	// The wave, and the ranks stepping together (expert parallelism).
	Wave        uint64   `json:"wave"`
	WaveRunning bool     `json:"wave_running"`
	Group       []uint32 `json:"group,omitempty"`
}

// ClusterView is the whole cluster as one node sees it: /v1/cluster.
type ClusterView struct {
	Self             string          `json:"self"`
	Model            string          `json:"model"`
	Mode             string          `json:"mode"`
	DataParallelSize int             `json:"data_parallel_size"`
	Size             SizeView        `json:"size"`
	Nodes            []NodeView      `json:"nodes"`
	Ranks            []RankView      `json:"ranks"`
	Coordinator      CoordinatorView `json:"coordinator"`
	Parked           int             `json:"parked_requests"`
	InFlight         int             `json:"in_flight_requests"`
	// Events are what this node saw happen lately, oldest first.
	Events []ClusterEvent `json:"events"`
}

// SizeView is the deployment's size as cluster state: the roster's
// version, who holds which ranks, and the recent changes.
type SizeView struct {
	// Elastic is true when the size follows the cluster
	// (--data-parallel-size auto).
	Elastic bool `json:"elastic"`
	// Version is the roster's; 0 while no rank was ever given out.
	Version uint64       `json:"version"`
	Holds   []HoldView   `json:"holds,omitempty"`
	Changes []SizeChange `json:"changes,omitempty"`
}

// HoldView is one node's ranks in the roster.
type HoldView struct {
	Node      string `json:"node"`
	FirstRank int    `json:"first_rank"`
	Ranks     int    `json:"ranks"`
}

// apiServerView is the API server's part of the cluster view.
type apiServerView struct {
	ranks    []RankView
	parked   int
	inFlight int
	snapshot *dpnodev1.LoadSnapshot
}

func (a *APIServerActor) view() *apiServerView {
	now := time.Now()
	v := &apiServerView{parked: len(a.parked), inFlight: len(a.calls), snapshot: a.snapshot}
	for _, r := range a.ranks {
		rv := RankView{Rank: r.rank, Node: r.node, Local: r.local, Balanced: r.local || a.cfg.BalanceRemote,
			Ready: r.ready, Epoch: r.epoch.Load(), Failed: r.failed, InFlight: r.acct.InFlight, PendingPrefill: r.acct.PendingPrefill, Device: r.cfg.Device}
		for _, t := range r.crashes {
			if now.Sub(t) <= a.cfg.Restart.Window {
				rv.Restarts++
			}
		}
		if s := r.stats; s != nil {
			rv.Waiting, rv.Running, rv.KVUsage, rv.Steps = int(s.NumWaiting), int(s.NumRunning), float64(s.KvCacheUsage), s.Step
			rv.Wave, rv.WaveRunning = s.Wave, s.WaveRunning
		}
		v.ranks = append(v.ranks, rv)
	}
	return v
}

// View is the cluster as this node sees it: its members, every rank with
// its load (live for the ranks it balances over, from the coordinator's
// snapshot for the others), and the coordinator.
func (n *Node) View(ctx context.Context) (*ClusterView, error) {
	timeout, err := futureTimeout(ctx, 5*time.Second)
	if err != nil {
		return nil, err
	}
	res, err := n.system.Root.RequestFuture(n.root, &getMembers{}, timeout).Result()
	if err != nil {
		return nil, fmt.Errorf("actors: the node actor did not answer: %w", err)
	}
	mv := res.(*membersView)
	res, err = n.system.Root.RequestFuture(n.apiServer, &getView{}, timeout).Result()
	if err != nil {
		return nil, fmt.Errorf("actors: the API server did not answer: %w", err)
	}
	av := res.(*apiServerView)

	topo := n.cfg.Topology
	v := &ClusterView{Self: n.cfg.Name, Model: n.cfg.Model, Mode: topo.Mode.String(), DataParallelSize: mv.roster.Size(),
		Size:  SizeView{Elastic: mv.roster.Elastic(), Version: mv.roster.Version, Changes: mv.changes},
		Ranks: av.ranks, Parked: av.parked, InFlight: av.inFlight, Events: n.metrics.events.recent()}
	for _, h := range mv.roster.Holds {
		v.Size.Holds = append(v.Size.Holds, HoldView{Node: h.Node, FirstRank: h.Start, Ranks: h.Count})
	}
	owner := map[int]string{}
	for name, m := range mv.members {
		v.Nodes = append(v.Nodes, NodeView{Name: name, Self: name == n.cfg.Name, ActorAddress: m.ActorAddress, HTTPAddress: m.HttpAddress,
			BootTime: time.Unix(0, m.BootUnixNano), Mode: m.Mode, Headless: m.Headless, FirstRank: int(m.StartRank), LocalRanks: int(m.LocalSize), Draining: m.Draining})
		for r := int(m.StartRank); r < int(m.StartRank+m.LocalSize); r++ {
			owner[r] = name
		}
	}
	slices.SortFunc(v.Nodes, func(a, b NodeView) int { return cmp.Or(a.FirstRank-b.FirstRank, strings.Compare(a.Name, b.Name)) })
	for i, r := range v.Ranks {
		if _, member := mv.members[r.Node]; r.Node != "" && !member {
			// The API server remembers a dead node's ranks by its name
			// until another node serves them: no node serves them now.
			v.Ranks[i].Node, v.Ranks[i].Ready = "", false
		}
	}

	e := mv.election
	v.Coordinator = CoordinatorView{Epoch: e.Epoch, Quorum: e.Quorum, RanksSeen: e.RanksSeen, RunningHere: mv.running}
	if e.Quorum {
		v.Coordinator.Node = e.Leader.Name
	}
	v.addUnlisted(mv, av.snapshot, owner)
	slices.SortFunc(v.Ranks, func(a, b RankView) int { return a.Rank - b.Rank })
	return v, nil
}

// addUnlisted adds the ranks the API server does not balance over: from
// the coordinator's snapshot, then the members' ranks it has not reported,
// then the deployment's ranks that no member serves. owner maps a rank to
// the member that serves it.
func (v *ClusterView) addUnlisted(mv *membersView, snap *dpnodev1.LoadSnapshot, owner map[int]string) {
	// listed tracks the ranks in v.Ranks; list adds one that is not.
	listed := make(map[int]bool, len(v.Ranks))
	for _, r := range v.Ranks {
		listed[r.Rank] = true
	}
	list := func(r RankView) {
		if !listed[r.Rank] {
			listed[r.Rank] = true
			v.Ranks = append(v.Ranks, r)
		}
	}
	if snap != nil {
		v.Coordinator.SnapshotSeq, v.Coordinator.LastSnapshot = snap.Seq, time.Unix(0, snap.PublishedUnixNano)
		v.Coordinator.RanksReported = len(snap.Ranks)
		v.Coordinator.Wave, v.Coordinator.WaveRunning, v.Coordinator.Group = snap.CurrentWave, snap.EnginesRunning, snap.GroupRanks
		for _, l := range snap.Ranks {
			if owner[int(l.Rank)] == "" && !mv.roster.Has(int(l.Rank)) {
				// A rank that left the deployment, last reported by its
				// engine on the way out.
				continue
			}
			list(RankView{Rank: int(l.Rank), Node: owner[int(l.Rank)], Ready: owner[int(l.Rank)] != "",
				Waiting: int(l.NumWaiting), Running: int(l.NumRunning), KVUsage: float64(l.KvCacheUsage)})
		}
	}
	// Ranks of members the coordinator has not reported yet.
	for r, name := range owner {
		list(RankView{Rank: r, Node: name})
	}
	// The deployment's ranks that no member serves: their node died, or
	// has not joined yet.
	for r := range mv.roster.Span() {
		if mv.roster.Has(r) {
			list(RankView{Rank: r})
		}
	}
}
