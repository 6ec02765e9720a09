package actors

import (
	"log/slog"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/dpnode/dpnode/control"
	"github.com/dpnode/dpnode/dp"
	dpnodev1 "github.com/dpnode/dpnode/proto/dpnode/v1"
)

// TestCoordinatorIgnoresStatsOfUnknownRanks: forged reports naming ranks
// the roster does not give out leave nothing behind; before, each distinct
// rank number grew the snapshot and every publication by one entry.
func TestCoordinatorIgnoresStatsOfUnknownRanks(t *testing.T) {
	system := actor.NewActorSystem()
	defer system.Shutdown()
	pids := make(chan *actor.PID, 1)
	parent, err := system.Root.SpawnNamed(actor.PropsFromFunc(func(ctx actor.Context) {
		if _, ok := ctx.Message().(*actor.Started); ok {
			pids <- ctx.Spawn(actor.PropsFromProducer(NewCoordinatorProducer(CoordinatorConfig{
				Epoch: 1, Publish: dp.PublishConfig{MinInterval: time.Millisecond, Heartbeat: time.Hour},
				Roster: control.Roster{Fixed: 2}, Metrics: NewMetrics(prometheus.NewRegistry(), "m", 1024), Logger: slog.New(slog.DiscardHandler),
			})))
		}
	}), "coordinator-parent")
	if err != nil {
		t.Fatal(err)
	}
	defer system.Root.Stop(parent)
	coord := <-pids
	for r := uint32(2); r < 10_002; r++ {
		system.Root.Send(coord, &dpnodev1.ReportStats{Stats: &dpnodev1.EngineStats{Rank: r, NumRunning: 1}})
	}
	system.Root.Send(coord, &dpnodev1.ReportStats{Stats: &dpnodev1.EngineStats{Rank: 1, NumRunning: 3}})
	// The snapshot a subscriber gets is made after every report above.
	res, err := system.Root.RequestFuture(coord, &dpnodev1.SubscribeLoad{}, 10*time.Second).Result()
	if err != nil {
		t.Fatal(err)
	}
	snap, ok := res.(*dpnodev1.LoadSnapshot)
	if !ok {
		t.Fatalf("got %T, want a load snapshot", res)
	}
	if len(snap.Ranks) != 1 || snap.Ranks[0].Rank != 1 || snap.Ranks[0].NumRunning != 3 {
		t.Fatalf("the snapshot holds %d ranks (first %v); want rank 1 alone", len(snap.Ranks), snap.Ranks[0])
	}
}
