package httpapi

import (
	"net/http"
	"time"

	"github.com/dpnode/dpnode/actors"
)

// ClusterInfo describes this node for /v1/cluster.
type ClusterInfo struct {
	NodeName    string
	HTTPAddress string
	BootTime    time.Time
}

type nodeView struct {
	Name        string    `json:"name"`
	HTTPAddress string    `json:"http_address"`
	BootTime    time.Time `json:"boot_time"`
	Ranks       []int     `json:"ranks"`
}

type rankView struct {
	actors.RankView
	Node string `json:"node"`
}

type coordinatorView struct {
	Node         string    `json:"node"`
	Epoch        uint64    `json:"epoch"`
	Seq          uint64    `json:"snapshot_seq"`
	LastSnapshot time.Time `json:"last_snapshot"`
}

type clusterView struct {
	DataParallelSize int              `json:"data_parallel_size"`
	Model            string           `json:"model"`
	Self             string           `json:"self"`
	Nodes            []nodeView       `json:"nodes"`
	Ranks            []rankView       `json:"ranks"`
	Coordinator      *coordinatorView `json:"coordinator"`
	Parked           int              `json:"parked_requests"`
	InFlight         int              `json:"in_flight_requests"`
}

func (s *Server) cluster(w http.ResponseWriter, r *http.Request) {
	v, err := s.cfg.Backend.View(r.Context())
	if err != nil {
		writeError(w, &apiError{Status: http.StatusServiceUnavailable, Message: err.Error(), Type: "server_error"})
		return
	}
	topo := s.cfg.Backend.Topology()
	info := s.cfg.Cluster
	out := clusterView{
		DataParallelSize: topo.Size,
		Model:            s.cfg.Backend.Model(),
		Self:             info.NodeName,
		Nodes:            []nodeView{{Name: info.NodeName, HTTPAddress: info.HTTPAddress, BootTime: info.BootTime, Ranks: topo.LocalRanks()}},
		Parked:           v.Parked,
		InFlight:         v.InFlight,
	}
	for _, rk := range v.Ranks {
		out.Ranks = append(out.Ranks, rankView{RankView: rk, Node: info.NodeName})
	}
	if snap := v.Snapshot; snap != nil {
		out.Coordinator = &coordinatorView{Node: info.NodeName, Epoch: snap.CoordinatorEpoch, Seq: snap.Seq, LastSnapshot: time.Unix(0, snap.PublishedUnixNano)}
	}
	writeJSON(w, http.StatusOK, out)
}
