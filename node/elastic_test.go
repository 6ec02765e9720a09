package node_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
)

// streamLoad is a closed loop of streamed completions, each held to the
// simulated engine's text for its prompt.
type streamLoad struct {
	client openai.Client
	stop   chan struct{}
	wg     sync.WaitGroup

	mu              sync.Mutex
	sent, completed int
	failures        []string
}

func startStreamLoad(url string, clients int) *streamLoad {
	l := &streamLoad{client: openai.NewClient(option.WithBaseURL(url+"/v1"), option.WithAPIKey("none"), option.WithMaxRetries(0)),
		stop: make(chan struct{})}
	for w := range clients {
		l.wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-l.stop:
					return
				default:
				}
				prompt := fmt.Sprintf("elastic client %d request %d", w, i)
				maxTokens := 8 + (w*7+i*13)%40
				err := l.stream(prompt, maxTokens)
				l.mu.Lock()
				l.sent++
				if err != nil {
					l.failures = append(l.failures, fmt.Sprintf("%s: %v", prompt, err))
				} else {
					l.completed++
				}
				l.mu.Unlock()
			}
		})
	}
	return l
}

// stream sends one request; an error says it failed, hung (no end within
// 60 s) or came back with another text than the engine's.
func (l *streamLoad) stream(prompt string, maxTokens int) error {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	s := l.client.Completions.NewStreaming(ctx, openai.CompletionNewParams{
		Prompt:      openai.CompletionNewParamsPromptUnion{OfString: openai.String(prompt)},
		MaxTokens:   openai.Int(int64(maxTokens)),
		Temperature: openai.Float(0),
	}, option.WithJSONSet("ignore_eos", true))
	defer s.Close()
	var text strings.Builder
	for s.Next() {
		for _, c := range s.Current().Choices {
			text.WriteString(c.Text)
		}
	}
	switch err := s.Err(); {
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("hung: no end within 60s")
	case err != nil:
		return err
	}
	if want := simText(prompt, maxTokens); text.String() != want {
		return fmt.Errorf("lost tokens: got %q, want %q", text.String(), want)
	}
	return nil
}

// finish stops the loop, waits for the requests in flight, and returns
// what was sent, completed and failed.
func (l *streamLoad) finish() (sent, completed int, failures []string) {
	close(l.stop)
	l.wg.Wait()
	return l.sent, l.completed, l.failures
}

func (l *streamLoad) counts() (sent int, failed int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.sent, len(l.failures)
}

// waitSize waits until p's view has the deployment at size ranks, every
// one of them ready and balanced.
func waitSize(p *proc, size int, timeout time.Duration) clusterView {
	p.t.Helper()
	return p.waitView(fmt.Sprintf("the deployment at %d ranks, all ready", size), timeout, func(v clusterView) bool {
		ready := 0
		for _, r := range v.Ranks {
			if r.Ready && r.Balanced {
				ready++
			}
		}
		return v.Size == size && ready == size && len(v.Ranks) == size
	})
}

// ranksOf lists the ranks of the node called name in v.
func ranksOf(v clusterView, name string) []int {
	var out []int
	for _, r := range v.Ranks {
		if r.Node == name {
			out = append(out, r.Rank)
		}
	}
	return out
}

// firstServed waits until a request finished on one of ranks, as p counts
// them, and returns when that was seen.
func firstServed(t *testing.T, p *proc, ranks []int, timeout time.Duration) time.Time {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		for _, r := range ranks {
			if p.metric("vllm:request_success_total", map[string]string{"engine": fmt.Sprint(r)}) > 0 {
				return time.Now()
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no request served on ranks %v within %v", ranks, timeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestElasticGrowAndShrinkUnderLoad grows an internal-mode deployment of
// --data-parallel-size auto from two nodes (4 ranks) to three and four
// under a steady closed loop of streams, then takes two nodes out again,
// one by POST /admin/leave and one by SIGTERM with --leave-on-terminate.
// Every stream completes, token-exact; the new ranks serve before the load
// ends; the size follows each change.
func TestElasticGrowAndShrinkUnderLoad(t *testing.T) {
	growAndShrink(t, [4]string{"127.0.0.241", "127.0.0.242", "127.0.0.243", "127.0.0.244"}, nil)
}

// TestElasticExpertParallelGrowsAndShrinks does the same with the ranks
// stepping in expert-parallel waves: each new node's ranks join the group,
// each leaving node's ranks leave it, and no step waits out the collective
// timeout for a planned change. The model has 24 experts, so that every
// size on the way (4, 6, 8) divides them.
func TestElasticExpertParallelGrowsAndShrinks(t *testing.T) {
	growAndShrink(t, [4]string{"127.0.0.211", "127.0.0.212", "127.0.0.213", "127.0.0.214"},
		[]string{"--enable-expert-parallel", "--sim-profile", moeProfile(t, 24)})
}

// moeProfile writes the Qwen3 MoE profile with another expert count and
// returns its path.
func moeProfile(t *testing.T, experts int) string {
	t.Helper()
	b, err := os.ReadFile("../testdata/profiles/qwen3-30b-a3b-h200.json")
	if err != nil {
		t.Fatal(err)
	}
	var p map[string]any
	if err := json.Unmarshal(b, &p); err != nil {
		t.Fatal(err)
	}
	p["name"] = fmt.Sprintf("qwen3-30b-a3b-h200-%d-experts", experts)
	p["moe"].(map[string]any)["num_experts"] = experts
	if b, err = json.Marshal(p); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "moe.json")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func growAndShrink(t *testing.T, ips [4]string, extra []string) {
	ipA := ips[0]
	node := func(ip string, more ...string) []string {
		args := append([]string{"--data-parallel-size", "auto", "--data-parallel-size-local", "2", "--sim-time-scale", "1"}, extra...)
		return nodeArgs(ip, append(args, more...)...)
	}
	headless := func(ip string, more ...string) []string {
		return node(ip, append([]string{"--headless", "--host", ip, "--metrics-port", "0", "--seeds", ipA + ":7946"}, more...)...)
	}
	a := startProc(t, ipA, node(ipA, "--host", ipA, "--port", "0", "--data-parallel-lb", "internal")...)
	b := startProc(t, ips[1], headless(ips[1])...)
	waitSize(a, 4, 20*time.Second)

	load := startStreamLoad(a.url, 8)
	defer func() {
		select {
		case <-load.stop:
		default:
			load.finish()
		}
	}()
	time.Sleep(time.Second)

	grow := func(ip string, size int, more ...string) *proc {
		launched := time.Now()
		p := startProc(t, ip, headless(ip, more...)...)
		v := waitSize(a, size, 20*time.Second)
		served := firstServed(t, a, ranksOf(v, p.name), 20*time.Second)
		t.Logf("%s joined: ranks %v; from launch to serving %v, to its first request served %v", ip, ranksOf(v, p.name),
			logTime(t, p.waitLog(`dpnode serving`, time.Second)).Sub(launched).Round(time.Millisecond), served.Sub(launched).Round(time.Millisecond))
		return p
	}
	c := grow(ips[2], 6)
	d := grow(ips[3], 8, "--leave-on-terminate")
	time.Sleep(time.Second)

	timeouts := 0.0
	shrink := func(p *proc, size int, how string, leave func()) {
		asked := time.Now()
		leave()
		select {
		case <-p.done:
		case <-time.After(30 * time.Second):
			t.Fatalf("%s did not exit within 30s of its leave", p.ip)
		}
		if p.err != nil {
			t.Fatalf("%s left with %v, want exit status 0", p.ip, p.err)
		}
		exited := time.Since(asked)
		if line, _ := p.logs.find(regexp.MustCompile(`could not give this node's ranks back`), 0); line != "" {
			t.Fatalf("%s: %s", p.ip, line)
		}
		waitSize(a, size, 20*time.Second)
		t.Logf("%s left (%s): from the leave to its exit %v", p.ip, how, exited.Round(time.Millisecond))
	}
	shrink(c, 6, "POST /admin/leave", func() {
		resp, err := adminPost(c.url + "/admin/leave")
		if err != nil || resp.StatusCode != http.StatusAccepted {
			t.Fatalf("POST /admin/leave: %v %v", resp, err)
		}
		resp.Body.Close()
	})
	timeouts += d.metric("dpnode_collective_timeouts_total", nil)
	shrink(d, 4, "SIGTERM, --leave-on-terminate", func() { d.signal(syscall.SIGTERM) })
	time.Sleep(time.Second)

	sent, completed, failures := load.finish()
	t.Logf("%d streams sent, %d completed token-exact", sent, completed)
	if len(failures) > 0 {
		t.Fatalf("%d of %d streams failed; the first: %s", len(failures), sent, failures[0])
	}
	v, err := a.view()
	if err != nil {
		t.Fatal(err)
	}
	if len(v.Nodes) != 2 || v.Size != 4 {
		t.Fatalf("after the leaves: %d nodes, size %d; want 2 and 4", len(v.Nodes), v.Size)
	}
	// The API node saw the size grow three times (B, C, D joined) and
	// shrink twice.
	ups, downs := a.metric("dpnode_scale_ups_total", nil), a.metric("dpnode_scale_downs_total", nil)
	if ups != 3 || downs != 2 || a.metric("dpnode_data_parallel_size", nil) != 4 {
		t.Fatalf("scale-ups %v, scale-downs %v, size gauge %v; want 3, 2 and 4", ups, downs, a.metric("dpnode_data_parallel_size", nil))
	}
	if got := slices.Sorted(slices.Values(ranksOf(v, a.name))); !slices.Equal(got, []int{0, 1}) {
		t.Fatalf("the API node's ranks are %v, want [0 1]", got)
	}
	// A planned change costs no collective timeout.
	if timeouts += a.metric("dpnode_collective_timeouts_total", nil) + b.metric("dpnode_collective_timeouts_total", nil); timeouts != 0 {
		t.Fatalf("%v steps waited out the collective timeout", timeouts)
	}
	if slices.Contains(extra, "--enable-expert-parallel") {
		if g := v.Coordinator.Group; !slices.Equal(g, []int{0, 1, 2, 3}) {
			t.Fatalf("the expert-parallel group is %v, want [0 1 2 3]", g)
		}
		// The load keeps one wave running, often from its first request
		// to its last: that wave ends a step after the last stream does.
		a.waitView("the wave ended", 10*time.Second, func(v clusterView) bool { return !v.Coordinator.WaveRunning })
		if w := a.metric("dpnode_waves_total", nil); w == 0 {
			t.Fatal("no wave ran")
		}
	}
}

// holdsOf reads the roster's holds from p's view, by node key.
func holdsOf(t *testing.T, p *proc) map[string][2]int {
	t.Helper()
	v, err := p.view()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][2]int{}
	for _, h := range v.Roster.Holds {
		out[h.Node] = [2]int{h.FirstRank, h.Ranks}
	}
	return out
}

// TestSimultaneousJoinsTakeDistinctRanks launches three nodes into an
// elastic deployment at the same moment: the coordinator gives each its
// own ranks. A node killed keeps its ranks (the size does not shrink), and
// gets them back when it restarts.
func TestSimultaneousJoinsTakeDistinctRanks(t *testing.T) {
	const ipA = "127.0.0.245"
	node := func(ip string, extra ...string) []string {
		return nodeArgs(ip, append([]string{"--data-parallel-size", "auto", "--data-parallel-size-local", "2", "--host", ip, "--port", "0"}, extra...)...)
	}
	a := startProc(t, ipA, node(ipA)...)
	ips := []string{"127.0.0.246", "127.0.0.247", "127.0.0.248"}
	procs := make([]*proc, len(ips))
	errs := make([]error, len(ips))
	var wg sync.WaitGroup
	for i, ip := range ips {
		wg.Go(func() { procs[i], errs[i] = launch(t, ip, node(ip, "--seeds", ipA+":7946")...) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("%s did not start: %v\n%s", ips[i], err, procs[i].logs)
		}
	}
	a.waitView("the deployment at 8 ranks", 20*time.Second, func(v clusterView) bool { return v.Size == 8 && len(v.Nodes) == 4 })
	holds := holdsOf(t, a)
	taken := map[int]string{}
	for key, h := range holds {
		for r := h[0]; r < h[0]+h[1]; r++ {
			if taken[r] != "" {
				t.Fatalf("rank %d given to %s and %s", r, taken[r], key)
			}
			taken[r] = key
		}
	}
	if len(taken) != 8 {
		t.Fatalf("roster %v holds %d ranks, want 8", holds, len(taken))
	}

	// A crash does not shrink the deployment; the node comes back to its
	// ranks.
	victim := ips[1] + ":7946"
	procs[1].kill()
	a.waitView("the killed node gone", 20*time.Second, func(v clusterView) bool { return len(v.Nodes) == 3 })
	if v, _ := a.view(); v.Size != 8 {
		t.Fatalf("a node crashed and the size went from 8 to %d", v.Size)
	}
	again := startProc(t, ips[1], node(ips[1], "--seeds", ipA+":7946")...)
	a.waitView("the node back", 20*time.Second, func(v clusterView) bool { return len(v.Nodes) == 4 })
	if got := holdsOf(t, a)[victim]; got != holds[victim] {
		t.Fatalf("the restarted node holds %v, before its crash %v", got, holds[victim])
	}
	again.waitLog(fmt.Sprintf(`the leader gave this node its ranks" ranks="ranks %d to %d"`, holds[victim][0], holds[victim][0]+1), time.Second)
}

// TestFullDeploymentRefusesAJoin: a fixed size with ranks given out
// refuses the node that does not fit, and says why.
func TestFullDeploymentRefusesAJoin(t *testing.T) {
	const ipA, ipB, ipC = "127.0.0.249", "127.0.0.250", "127.0.0.251"
	node := func(ip string, extra ...string) []string {
		return nodeArgs(ip, append([]string{"--data-parallel-size", "4", "--data-parallel-start-rank", "auto",
			"--data-parallel-size-local", "2", "--host", ip, "--port", "0"}, extra...)...)
	}
	// Known by --node-id: the coordinator's answers reach a claimant by
	// its ID.
	startProc(t, ipA, node(ipA, "--node-id", "node-a")...)
	b := startProc(t, ipB, node(ipB, "--seeds", ipA+":7946", "--node-id", "node-b")...)
	b.waitLog(`the leader gave this node its ranks" ranks="ranks 2 to 3"`, time.Second)
	c, err := launch(t, ipC, node(ipC, "--seeds", ipA+":7946", "--node-id", "node-c", "--join-timeout", "20s")...)
	if err == nil {
		t.Fatalf("a third node of 2 ranks joined a deployment of 4 that two nodes fill")
	}
	c.waitLog(`the leader refused this node's ranks: control: no 2 free consecutive ranks below 4 .* the deployment is full`, time.Second)
}

// TestExternalRanksGivenOut: in external mode each node serves one rank,
// and --data-parallel-rank auto has the coordinator give each its own.
func TestExternalRanksGivenOut(t *testing.T) {
	const ipA, ipB = "127.0.0.252", "127.0.0.253"
	node := func(ip string, extra ...string) []string {
		return nodeArgs(ip, append([]string{"--data-parallel-size", "auto", "--data-parallel-rank", "auto", "--host", ip, "--port", "0"}, extra...)...)
	}
	a := startProc(t, ipA, node(ipA)...)
	b := startProc(t, ipB, node(ipB, "--seeds", ipA+":7946")...)
	a.waitLog(`the leader gave this node its ranks" ranks="rank 0"`, time.Second)
	b.waitLog(`the leader gave this node its ranks" ranks="rank 1"`, time.Second)
	a.waitView("the deployment at 2 ranks", 10*time.Second, func(v clusterView) bool { return v.Size == 2 && len(v.Nodes) == 2 })
	// Each serves its own rank, and only it.
	for _, p := range []*proc{a, b} {
		if status, body, err := complete(context.Background(), p.url, `{"prompt":"external","max_tokens":3}`, nil); err != nil || status != 200 {
			t.Fatalf("%s: %d %s %v", p.ip, status, body, err)
		}
	}
	if n := b.metric("vllm:request_success_total", map[string]string{"engine": "1"}); n != 1 {
		t.Fatalf("B served %v requests on rank 1, want 1", n)
	}
}

// TestExpertParallelJoinThatBreaksTheExpertsIsRefused: with 128 experts,
// an elastic expert-parallel deployment of 4 ranks cannot grow to 6.
func TestExpertParallelJoinThatBreaksTheExpertsIsRefused(t *testing.T) {
	const ipA, ipB, ipC = "127.0.0.215", "127.0.0.216", "127.0.0.217"
	node := func(ip string, extra ...string) []string {
		return nodeArgs(ip, append([]string{"--data-parallel-size", "auto", "--data-parallel-size-local", "2", "--host", ip, "--port", "0",
			"--enable-expert-parallel", "--sim-profile", "qwen3-30b-a3b-h200"}, extra...)...)
	}
	a := startProc(t, ipA, node(ipA)...)
	startProc(t, ipB, node(ipB, "--seeds", ipA+":7946")...)
	a.waitView("the deployment at 4 ranks", 10*time.Second, func(v clusterView) bool { return v.Size == 4 })
	c, err := launch(t, ipC, node(ipC, "--seeds", ipA+":7946")...)
	if err == nil {
		t.Fatal("a node made an expert-parallel deployment of 128 experts 6 ranks")
	}
	c.waitLog(`would make the deployment 6 ranks, which does not divide the model's 128 experts`, time.Second)
}
