package node_test

import (
	"fmt"
	"os/exec"
	"regexp"
	"slices"
	"syscall"
	"testing"
	"time"
)

// failoverCluster is three nodes in internal mode on the default (lan)
// gossip profile, stepping in real time: H1, headless and the oldest, runs
// the coordinator; B serves the API over all three ranks; H2 is headless.
// When H1 goes, B (older than H2) takes the coordinator over.
type failoverCluster struct {
	h1, b, h2 *proc
	epoch     uint64
}

func startFailoverCluster(tb testing.TB) *failoverCluster {
	tb.Helper()
	args := func(ip string, extra ...string) []string {
		return nodeArgs(ip, append([]string{"--gossip-profile", "lan", "--sim-time-scale", "1",
			"--data-parallel-size", "3", "--data-parallel-size-local", "1"}, extra...)...)
	}
	c := &failoverCluster{}
	c.h1 = startProc(tb, "127.0.0.201", args("127.0.0.201", "--headless", "--host", "127.0.0.201", "--metrics-port", "0")...)
	c.b = startProc(tb, "127.0.0.202", args("127.0.0.202", "--host", "127.0.0.202", "--port", "0", "--data-parallel-lb", "internal",
		"--data-parallel-start-rank", "1", "--seeds", "127.0.0.201:7946")...)
	c.h2 = startProc(tb, "127.0.0.203", args("127.0.0.203", "--headless", "--host", "127.0.0.203", "--metrics-port", "0",
		"--data-parallel-start-rank", "2", "--seeds", "127.0.0.201:7946")...)
	v := c.b.waitView("H1 coordinates three ready ranks", 15*time.Second, func(v clusterView) bool {
		ready := 0
		for _, r := range v.Ranks {
			if r.Ready {
				ready++
			}
		}
		return v.Coordinator.Node == c.h1.name && ready == 3
	})
	c.epoch = v.Coordinator.Epoch
	return c
}

func (c *failoverCluster) stop() {
	for _, p := range []*proc{c.h1, c.b, c.h2} {
		p.kill()
	}
}

// newEpochAt is when B started the coordinator, from its log.
func (c *failoverCluster) newEpochAt(tb testing.TB, timeout time.Duration) (time.Time, bool) {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if v, err := c.b.view(); err == nil && v.Coordinator.RunningHere && v.Coordinator.Epoch > c.epoch {
			return logTime(tb, c.b.waitLog(`this node runs the coordinator`, time.Second)), true
		}
		time.Sleep(5 * time.Millisecond)
	}
	return time.Time{}, false
}

// reMoved is B's log line when it moved the requests off a dead node's
// rank.
var reMoved = regexp.MustCompile(`a node left; moved the requests on its ranks`)

// signalCoordinator sends sig to H1, the coordinator's node, and returns
// when it did and how long until B ran a new coordinator.
func (c *failoverCluster) signalCoordinator(b *testing.B, sig syscall.Signal, timeout time.Duration) (time.Time, time.Duration) {
	sent := time.Now()
	c.h1.signal(sig)
	at, ok := c.newEpochAt(b, timeout)
	if !ok {
		b.Fatalf("no new coordinator within %v of %v", timeout, sig)
	}
	return sent, at.Sub(sent)
}

// failoverStats collects one figure per try.
type failoverStats struct {
	b    *testing.B
	name string
	ms   []float64
}

func (s *failoverStats) add(d time.Duration) {
	s.ms = append(s.ms, float64(d.Microseconds())/1000)
}

func (s *failoverStats) report() {
	if len(s.ms) == 0 {
		return
	}
	slices.Sort(s.ms)
	s.b.ReportMetric(s.ms[len(s.ms)/2], s.name+"-median-ms")
	s.b.ReportMetric(s.ms[len(s.ms)-1], s.name+"-worst-ms")
	s.b.ReportMetric(s.ms[0], s.name+"-best-ms")
}

// BenchmarkFailover measures what issue-level users ask of coordinator
// failover, one fresh three-node cluster per try (-benchtime 10x for ten):
//
//   - kill: kill -9 of the coordinator's node under load: time to a new
//     coordinator epoch, time until the requests on the dead node's rank
//     move, and requests failed meanwhile;
//   - stop: SIGSTOP of the coordinator's node, left stopped: time to a new
//     epoch;
//   - pause: SIGSTOP for 2 s, then SIGCONT: failovers that should not have
//     happened;
//   - saturated: the coordinator's node pinned to one core with four busy
//     loops for 10 s: failovers that should not have happened.
//
// docs/bench/failover.sh runs it.
func BenchmarkFailover(b *testing.B) {
	b.Run("kill", func(b *testing.B) {
		epoch, move := &failoverStats{b: b, name: "epoch"}, &failoverStats{b: b, name: "move"}
		var sent, failed int
		for range b.N {
			c := startFailoverCluster(b)
			stop := make(chan struct{})
			wait := closedLoop(c.b.url, 8, stop, func(w, i int) string {
				return fmt.Sprintf(`{"prompt":"failover %d %d","max_tokens":24,"ignore_eos":true}`, w, i)
			})
			time.Sleep(500 * time.Millisecond)
			killed, took := c.signalCoordinator(b, syscall.SIGKILL, 15*time.Second)
			epoch.add(took)
			if took > 500*time.Millisecond {
				// What B heard, for a slow try.
				b.Logf("slow try: new epoch %v after the kill; B's log:\n%s", took, c.b.logs)
			}
			if line, _ := c.b.logs.find(reMoved, 0); line != "" {
				move.add(logTime(b, line).Sub(killed))
			}
			time.Sleep(time.Second)
			close(stop)
			s, f, first := wait()
			sent, failed = sent+s, failed+f
			if f > 0 {
				b.Logf("%d of %d requests failed; first: %v", f, s, first)
			}
			c.stop()
		}
		epoch.report()
		move.report()
		b.ReportMetric(float64(failed), "failed-requests")
		b.ReportMetric(float64(sent), "sent-requests")
	})
	b.Run("stop", func(b *testing.B) {
		epoch := &failoverStats{b: b, name: "epoch"}
		for range b.N {
			c := startFailoverCluster(b)
			_, took := c.signalCoordinator(b, syscall.SIGSTOP, 20*time.Second)
			epoch.add(took)
			c.stop()
		}
		epoch.report()
	})
	b.Run("pause", func(b *testing.B) {
		falseFailovers := 0
		for range b.N {
			c := startFailoverCluster(b)
			c.h1.signal(syscall.SIGSTOP)
			time.Sleep(2 * time.Second)
			c.h1.signal(syscall.SIGCONT)
			if _, ok := c.newEpochAt(b, 8*time.Second); ok {
				falseFailovers++
				b.Logf("a 2 s pause cost H1 the coordinator")
			}
			c.stop()
		}
		b.ReportMetric(float64(falseFailovers), "false-failovers")
	})
	b.Run("saturated", func(b *testing.B) {
		if _, err := exec.LookPath("taskset"); err != nil {
			b.Skip("taskset (util-linux) is not installed")
		}
		falseFailovers := 0
		for range b.N {
			c := startFailoverCluster(b)
			if out, err := exec.Command("taskset", "-a", "-p", "-c", "0", fmt.Sprint(c.h1.cmd.Process.Pid)).CombinedOutput(); err != nil {
				b.Fatalf("taskset: %v %s", err, out)
			}
			var hogs []*exec.Cmd
			for range 4 {
				h := exec.Command("taskset", "-c", "0", "sh", "-c", "while :; do :; done")
				if err := h.Start(); err != nil {
					b.Fatal(err)
				}
				hogs = append(hogs, h)
			}
			_, lost := c.newEpochAt(b, 10*time.Second)
			for _, h := range hogs {
				_ = h.Process.Kill()
				_ = h.Wait()
			}
			if lost {
				falseFailovers++
				b.Logf("a saturated core cost H1 the coordinator")
			}
			c.stop()
		}
		b.ReportMetric(float64(falseFailovers), "false-failovers")
	})
}
