package node_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// waveArgs runs a node of the MoE profile with expert parallelism.
func waveArgs(ip string, extra ...string) []string {
	return nodeArgs(ip, append([]string{"--host", ip, "--port", "0", "--sim-profile", "qwen3-30b-a3b-h200",
		"--enable-expert-parallel", "--ep-collective-timeout", "1s"}, extra...)...)
}

// startWavePair runs two nodes of two ranks each, stepping together.
func startWavePair(t *testing.T, ipA, ipB string) (a, b *proc) {
	t.Helper()
	a = startProc(t, ipA, waveArgs(ipA, "--data-parallel-size", "4", "--data-parallel-size-local", "2")...)
	b = startProc(t, ipB, waveArgs(ipB, "--data-parallel-size", "4", "--data-parallel-size-local", "2",
		"--data-parallel-start-rank", "2", "--seeds", ipA+":7946")...)
	for _, p := range []*proc{a, b} {
		p.waitView("the group has all four ranks", 10*time.Second, func(v clusterView) bool { return len(v.Coordinator.Group) == 4 })
	}
	return a, b
}

// engineSum adds up a metric over the ranks each process hosts.
func engineSum(name string, ps map[*proc][]int) map[int]float64 {
	out := map[int]float64{}
	for p, ranks := range ps {
		for _, r := range ranks {
			out[r] = p.metric(name, map[string]string{"engine": fmt.Sprint(r)})
		}
	}
	return out
}

// cpuTime is the process's user plus system CPU time.
func (p *proc) cpuTime() time.Duration {
	p.t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.cmd.Process.Pid))
	if err != nil {
		p.t.Fatal(err)
	}
	// The fields after the command name (which may hold spaces).
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	utime, _ := strconv.Atoi(f[11])
	stime, _ := strconv.Atoi(f[12])
	const ticks = 100 // USER_HZ on Linux
	return time.Duration(utime+stime) * time.Second / ticks
}

// TestOneRequestWakesFourRanks sends one request to an idle cluster of
// four ranks, on one node and on two: all four step in the wave (three of
// them dummy steps), the wave ends, and the idle cluster then runs no step
// and next to no CPU.
func TestOneRequestWakesFourRanks(t *testing.T) {
	t.Run("one node", func(t *testing.T) {
		a := startProc(t, "127.0.0.120", waveArgs("127.0.0.120", "--gpus", "4")...)
		a.waitView("the group has all four ranks", 10*time.Second, func(v clusterView) bool { return len(v.Coordinator.Group) == 4 })
		oneRequestWakesFourRanks(t, map[*proc][]int{a: {0, 1, 2, 3}}, a)
	})
	t.Run("two nodes", func(t *testing.T) {
		a, b := startWavePair(t, "127.0.0.121", "127.0.0.122")
		oneRequestWakesFourRanks(t, map[*proc][]int{a: {0, 1}, b: {2, 3}}, a)
	})
}

func oneRequestWakesFourRanks(t *testing.T, hosts map[*proc][]int, a *proc) {
	before := engineSum("dpnode_dummy_steps_total", hosts)
	status, body, err := complete(context.Background(), a.url, `{"prompt":"one request","max_tokens":5,"ignore_eos":true}`,
		map[string]string{"X-data-parallel-rank": "0"})
	if err != nil || status != 200 {
		t.Fatalf("%d %s %v", status, body, err)
	}
	a.waitView("the wave ended", 10*time.Second, func(v clusterView) bool { return v.Coordinator.Wave == 1 && !v.Coordinator.WaveRunning })
	for p := range hosts {
		p.waitView("every rank left the wave", 10*time.Second, func(v clusterView) bool {
			return !slices.ContainsFunc(v.Ranks, func(r rankView) bool { return r.WaveRunning })
		})
	}
	waves := engineSum("dpnode_waves_total", hosts)
	dummies := engineSum("dpnode_dummy_steps_total", hosts)
	for r := range 4 {
		if waves[r] != 1 {
			t.Errorf("rank %d stepped in %v waves, want 1", r, waves[r])
		}
		if got := dummies[r] - before[r]; (r == 0 && got != 1) || (r != 0 && got < 6) {
			t.Errorf("rank %d ran %v dummy steps in the wave", r, got)
		}
	}
	latency := 0.0
	for r, v := range engineSum("dpnode_wave_start_latency_seconds_sum", hosts) {
		if v == 0 {
			t.Errorf("rank %d recorded no wave start", r)
		}
		latency = max(latency, v)
	}
	t.Logf("wave start latency, %d process(es) (request at an idle cluster to all four ranks stepping): %.2f ms", len(hosts), latency*1000)

	// Idle: no dummy step and next to no CPU.
	idleDummies := engineSum("dpnode_dummy_steps_total", hosts)
	cpu := map[*proc]time.Duration{}
	for p := range hosts {
		cpu[p] = p.cpuTime()
	}
	const idle = 2 * time.Second
	time.Sleep(idle)
	// CPU first: reading /metrics costs the process CPU too.
	used := map[*proc]time.Duration{}
	for p, before := range cpu {
		used[p] = p.cpuTime() - before
	}
	for r, n := range engineSum("dpnode_dummy_steps_total", hosts) {
		if n != idleDummies[r] {
			t.Errorf("rank %d ran %v dummy steps while the cluster was idle", r, n-idleDummies[r])
		}
	}
	for p, used := range used {
		share := float64(used) / float64(idle)
		t.Logf("idle CPU of %s over %v: %v (%.1f%%)", p.ip, idle, used, 100*share)
		// Idle is 0 to 0.5% here, and up to 2% under -race beside the
		// rest of the suite on two cores (CPU time comes in 10 ms ticks);
		// a step loop that spins while idle costs most of a core.
		if share >= 0.1 {
			t.Errorf("%s used %.1f%% CPU while idle, want under 10%%", p.ip, 100*share)
		}
	}
}

func TestWaveBurstOnTwoNodes(t *testing.T) {
	a, b := startWavePair(t, "127.0.0.131", "127.0.0.132")
	var wg sync.WaitGroup
	for _, p := range []*proc{a, b} {
		wg.Go(func() {
			if failed, err := burst(p.url, 200, 8); failed > 0 {
				t.Errorf("%d of 200 requests to %s failed; first: %v", failed, p.url, err)
			}
		})
	}
	wg.Wait()
	hosts := map[*proc][]int{a: {0, 1}, b: {2, 3}}
	// A wave is counted when it ends, a step or an all-reduce after the
	// last request's output reached its client.
	for p := range hosts {
		p.waitView("every rank left the wave", 10*time.Second, func(v clusterView) bool {
			return !slices.ContainsFunc(v.Ranks, func(r rankView) bool { return r.WaveRunning })
		})
	}
	waves := engineSum("dpnode_waves_total", hosts)
	dummies := engineSum("dpnode_dummy_steps_total", hosts)
	balSum, balCount := engineSum("dpnode_step_balance_ratio_sum", hosts), engineSum("dpnode_step_balance_ratio_count", hosts)
	waitSum, waitCount := engineSum("dpnode_collective_wait_seconds_sum", hosts), engineSum("dpnode_collective_wait_seconds_count", hosts)
	for r := range 4 {
		if waves[r] < 1 || balCount[r] == 0 {
			t.Errorf("rank %d: %v waves, %v balance samples", r, waves[r], balCount[r])
		}
		t.Logf("rank %d: %v waves, %v dummy steps, %v steps, mean balance ratio %.2f, mean collective wait %.3f ms",
			r, waves[r], dummies[r], waitCount[r], balSum[r]/balCount[r], 1000*waitSum[r]/waitCount[r])
	}
}

// TestWaveSurvivesAKilledNode kills the node that does not run the
// coordinator in the middle of a wave: the coordinator finds the node's
// port refusing connections and re-forms the group without its ranks
// (or, had it not, the survivors would after the collective timeout), and
// the requests on the survivors finish. Then the survivor, with half the
// ranks, is no majority, and stops coordinating.
func TestWaveSurvivesAKilledNode(t *testing.T) {
	a, b := startWavePair(t, "127.0.0.141", "127.0.0.142")
	// Real-time steps for the survivors' requests, so that they are in
	// flight when B dies.
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for i := range 16 {
		wg.Go(func() {
			status, body, err := complete(context.Background(), a.url,
				fmt.Sprintf(`{"prompt":"survivor %d","max_tokens":2000,"ignore_eos":true}`, i), nil)
			if err == nil && status != 200 {
				err = fmt.Errorf("status %d: %s", status, body)
			}
			if err != nil {
				errs <- err
			}
		})
	}
	a.waitView("the wave runs", 10*time.Second, func(v clusterView) bool { return v.Coordinator.WaveRunning })
	killed := time.Now()
	b.signal(syscall.SIGKILL)
	line := a.waitLog(`the group goes on without them`, 10*time.Second)
	if !strings.Contains(line, `group="[0 1]"`) {
		t.Fatalf("the group re-formed as %q, want the survivors [0 1]", line)
	}
	reformed := logTime(t, line)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("a request on the surviving ranks failed: %v", err)
	}
	carryOn := reformed.Sub(killed)
	t.Logf("killed a node mid-wave: the survivors' group re-formed %v later (collective timeout 1s)", carryOn.Round(time.Millisecond))
	if carryOn > 2*time.Second {
		t.Fatalf("the survivors carried on after %v, want within the 1 s collective timeout plus 1 s", carryOn)
	}
}

// TestHungRankRejoinsTheGroup stops a node (SIGSTOP) for longer than the
// collective timeout, short of gossip declaring it dead: the running wave
// goes on without its ranks, and when the node resumes its ranks ask back
// in and the group is whole again.
func TestHungRankRejoinsTheGroup(t *testing.T) {
	a, b := startWavePair(t, "127.0.0.161", "127.0.0.162")
	done := make(chan error, 1)
	go func() {
		status, body, err := complete(context.Background(), a.url, `{"prompt":"keeps the wave running","max_tokens":3000,"ignore_eos":true}`, nil)
		if err == nil && status != 200 {
			err = fmt.Errorf("status %d: %s", status, body)
		}
		done <- err
	}()
	a.waitView("the wave runs", 10*time.Second, func(v clusterView) bool { return v.Coordinator.WaveRunning })
	b.signal(syscall.SIGSTOP)
	a.waitView("the group goes on without the hung ranks", 10*time.Second, func(v clusterView) bool { return len(v.Coordinator.Group) == 2 })
	b.signal(syscall.SIGCONT)
	a.waitView("the resumed ranks are back in the group", 10*time.Second, func(v clusterView) bool { return len(v.Coordinator.Group) == 4 })
	if err := <-done; err != nil {
		t.Fatalf("the request on the running ranks: %v", err)
	}
	b.waitLog(`this rank was left out of the expert-parallel group; asking to rejoin`, time.Second)
}
