//go:build chaos

package node_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/http"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/packages/ssestream"
)

var (
	chaosDuration = flag.Duration("chaos.duration", 45*time.Second, "how long the chaos suite runs its load")
	chaosEvery    = flag.Duration("chaos.every", 3*time.Second, "pause between two faults")
	chaosSeed     = flag.Uint64("chaos.seed", 0, "seed of the faults and the load (0: from the clock)")
	chaosEngine   = flag.String("chaos.engine", "sim", "the engine of the nodes: sim, or llamacpp (built with -tags llamacpp)")
)

// chaosEngine is what the suite needs of an engine: the nodes' flags, the
// texts an undisturbed run gives, and faults of its own.
type chaosEngineKind struct {
	// args are the engine's flags of the node on ip.
	args func(t *testing.T, ip string) []string
	// expected returns the undisturbed run's text of each request (the
	// greedy continuation of its prompt, ignoring end tokens).
	expected func(t *testing.T, reqs []chaosRequest) []string
	faults   func(r *chaosRun) []func() fault
	// checkAtMost bounds the streams held to the undisturbed run's text,
	// those that ran during a fault first; 0 checks all.
	checkAtMost int
	// inexactMoves is set for an engine whose moved requests continue
	// from their output so far, but not token for token: only the
	// streams that ran clear of faults are held to the undisturbed text.
	inexactMoves bool
	// check runs after the load, for what the engine leaves behind.
	check func(r *chaosRun)
}

type chaosRequest struct {
	prompt    string
	maxTokens int
}

// chaosEngines are the engines the suite runs on; files built with other
// tags add theirs.
var chaosEngines = map[string]chaosEngineKind{
	"sim": {
		args: func(*testing.T, string) []string { return []string{"--sim-time-scale", "0.2"} },
		expected: func(_ *testing.T, reqs []chaosRequest) []string {
			out := make([]string, len(reqs))
			for i, q := range reqs {
				out[i] = simText(q.prompt, q.maxTokens)
			}
			return out
		},
		faults: func(*chaosRun) []func() fault { return nil },
		check:  func(*chaosRun) {},
	},
}

func init() {
	// The processes of this suite must have the fault hook.
	dpnodeBuildTags = []string{"-tags", "chaos"}
}

// outcome is how one request ended for its client.
type outcome int

const (
	completed outcome = iota
	clearError
	disconnected
	lost
	hung
)

var outcomeNames = []string{"completed", "failed with a clear error", "disconnected by the client", "lost", "hung"}

type record struct {
	start, end time.Time
	outcome    outcome
	detail     string
	// req and text are a stream's, checked against an undisturbed run.
	req  chaosRequest
	text string
}

// fault is one injected fault and when it was active.
type fault struct {
	kind, name string
	start, end time.Time
	skipped    string
}

type chaosRun struct {
	t       *testing.T
	rng     *rand.Rand
	engine  chaosEngineKind
	a       *proc
	hosts   []*proc // the headless nodes, restartable
	args    [][]string
	common  []string
	client  openai.Client
	mu      sync.Mutex
	records []record
	faults  []fault
}

// TestChaos runs load against a three-node cluster in internal mode (an
// API node and two headless nodes) while faults are injected one after
// another, then checks that no request was lost or hung, that every
// completed stream is token-exact (the migrated ones too), and that
// goroutines and KV blocks return to their baseline. make chaos runs it
// for 10 minutes; CI runs a short form.
func TestChaos(t *testing.T) {
	seed := *chaosSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("chaos seed %d (repeat with -chaos.seed=%d), engine %s", seed, seed, *chaosEngine)
	kind, ok := chaosEngines[*chaosEngine]
	if !ok {
		t.Fatalf("-chaos.engine %q: this test binary has %v", *chaosEngine, slices.Sorted(maps.Keys(chaosEngines)))
	}
	r := &chaosRun{t: t, rng: rand.New(rand.NewPCG(seed, seed)), engine: kind}
	// An elastic deployment: the nodes' ranks are given out as they join
	// (in this order: 0-1, 2-3, 4-5), and a scale event adds a fourth.
	r.common = []string{"--data-parallel-size", "auto", "--data-parallel-size-local", "2", "--engine-max-restarts", "50"}
	r.a = startProc(t, "127.0.0.181", nodeArgs("127.0.0.181", append(append([]string{"--host", "127.0.0.181", "--port", "0", "--data-parallel-lb", "internal"},
		r.common...), kind.args(t, "127.0.0.181")...)...)...)
	for _, ip := range []string{"127.0.0.182", "127.0.0.183"} {
		args := r.headless(ip)
		r.args = append(r.args, args)
		r.hosts = append(r.hosts, startProc(t, ip, args...))
	}
	r.waitWhole()
	r.client = openai.NewClient(option.WithBaseURL(r.a.url+"/v1"), option.WithAPIKey("none"), option.WithMaxRetries(0))

	// Warm up, then take the baseline.
	if failed, err := burst(r.a.url, 30, 8); failed > 0 {
		t.Fatalf("warm-up: %d failed: %v", failed, err)
	}
	r.waitIdle()
	baseline := r.goroutines()
	migratedBefore := r.moved()

	deadline := time.Now().Add(*chaosDuration)
	var load sync.WaitGroup
	for w := range 8 {
		load.Go(func() { r.worker(w, deadline) })
	}
	r.injectFaults(deadline)
	load.Wait()
	r.waitWhole()
	r.waitIdle()
	checked := time.Now()
	n := r.checkTexts()
	t.Logf("held %d streams to the undisturbed runs' texts in %v", n, time.Since(checked).Round(time.Millisecond))
	r.report(baseline, migratedBefore)
	r.engine.check(r)
}

// checkTexts holds completed streams to the undisturbed run's text: all of
// them, or where the engine's reference is costly, those that ran during a
// fault and then others at random, up to the engine's bound.
func (r *chaosRun) checkTexts() int {
	var during, calm []int
	for i, rec := range r.records {
		if rec.outcome != completed {
			continue
		}
		if slices.ContainsFunc(r.faults, func(f fault) bool { return rec.start.Before(f.end.Add(2*time.Second)) && rec.end.After(f.start) }) {
			during = append(during, i)
		} else {
			calm = append(calm, i)
		}
	}
	r.rng.Shuffle(len(calm), func(i, j int) { calm[i], calm[j] = calm[j], calm[i] })
	check := append(during, calm...)
	if r.engine.inexactMoves {
		check = calm
	}
	if n := r.engine.checkAtMost; n > 0 && len(check) > n {
		check = check[:n]
	}
	reqs := make([]chaosRequest, len(check))
	for k, i := range check {
		reqs[k] = r.records[i].req
	}
	want := r.engine.expected(r.t, reqs)
	for k, i := range check {
		if rec := &r.records[i]; rec.text != want[k] {
			rec.outcome, rec.detail = lost, fmt.Sprintf("text differs from the undisturbed run: %q vs %q", rec.text, want[k])
		}
	}
	return len(check)
}

// waitWhole waits until the API node balances over all six ranks again.
func (r *chaosRun) waitWhole() {
	r.a.waitView("the API node balances over all six ranks", 60*time.Second, func(v clusterView) bool {
		n := 0
		for _, rk := range v.Ranks {
			if rk.Balanced && rk.Ready {
				n++
			}
		}
		return n == 6 && len(v.Nodes) == 3 && v.Size == 6
	})
}

// waitIdle waits until no rank holds a request.
func (r *chaosRun) waitIdle() {
	for _, p := range append([]*proc{r.a}, r.hosts...) {
		p.waitView("idle", 60*time.Second, func(v clusterView) bool {
			for _, rk := range v.Ranks {
				if rk.Local && (rk.Running+rk.Waiting > 0) {
					return false
				}
			}
			return v.InFlight == 0
		})
	}
}

func (r *chaosRun) goroutines() map[string]float64 {
	out := map[string]float64{}
	for _, p := range append([]*proc{r.a}, r.hosts...) {
		out[p.ip] = p.metric("go_goroutines", nil)
	}
	return out
}

func (r *chaosRun) moved() [2]float64 {
	return [2]float64{r.a.metric("dpnode_requests_migrated_total", nil), r.a.metric("dpnode_requests_redispatched_total", nil)}
}

// worker sends streamed completions until the deadline. Some it abandons
// part-way, as a client that goes away.
func (r *chaosRun) worker(w int, deadline time.Time) {
	rng := rand.New(rand.NewPCG(uint64(w), r.rng.Uint64()))
	for i := 0; time.Now().Before(deadline); i++ {
		prompt := fmt.Sprintf("chaos worker %d request %d", w, i)
		maxTokens := 16 + rng.IntN(48)
		abandonAfter := -1
		if rng.IntN(100) < 8 {
			abandonAfter = rng.IntN(maxTokens)
		}
		rec := r.stream(prompt, maxTokens, abandonAfter)
		r.mu.Lock()
		r.records = append(r.records, rec)
		r.mu.Unlock()
	}
}

// stream sends one request through the OpenAI client and classifies how
// it ended. The client does not retry: a retry would hide a lost request.
func (r *chaosRun) stream(prompt string, maxTokens, abandonAfter int) record {
	rec := record{start: time.Now()}
	ended := func(o outcome, detail string) record {
		rec.end, rec.outcome, rec.detail = time.Now(), o, detail
		return rec
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// Greedy, so that a real model's undisturbed text is known too.
	s := r.client.Completions.NewStreaming(ctx, openai.CompletionNewParams{
		Prompt:      openai.CompletionNewParamsPromptUnion{OfString: openai.String(prompt)},
		MaxTokens:   openai.Int(int64(maxTokens)),
		Temperature: openai.Float(0),
	}, option.WithJSONSet("ignore_eos", true))
	defer s.Close()
	var text strings.Builder
	chunks := 0
	for s.Next() {
		for _, c := range s.Current().Choices {
			text.WriteString(c.Text)
		}
		if chunks++; chunks == abandonAfter {
			return ended(disconnected, "")
		}
	}
	var apiErr *openai.Error
	var streamErr *ssestream.StreamError
	switch err := s.Err(); {
	case errors.Is(err, context.DeadlineExceeded):
		return ended(hung, fmt.Sprintf("no end after 60s, %d chunks", chunks))
	case errors.As(err, &apiErr) && apiErr.Message != "":
		return ended(clearError, fmt.Sprintf("%d %s", apiErr.StatusCode, apiErr.Message))
	case errors.As(err, &streamErr):
		return ended(clearError, streamErr.Message)
	case err != nil:
		return ended(lost, err.Error())
	}
	// The stream ended: checkTexts holds it to the undisturbed run's text
	// (a stream cut short without an error ends here too).
	rec.req, rec.text = chaosRequest{prompt: prompt, maxTokens: maxTokens}, text.String()
	return ended(completed, "")
}

// injectFaults injects one fault after another until the deadline; each
// fault heals before the next.
func (r *chaosRun) injectFaults(deadline time.Time) {
	// Every run crashes the API server once: that no request fails for
	// it is a promise the report checks.
	own := append([]func() fault{r.panicAPIServer}, r.engine.faults(r)...)
	// And adds a node and takes it out again once.
	own = append([]func() fault{r.scaleNode}, own...)
	kinds := append([]func() fault{
		r.panicEngine, r.panicAPIServer, r.panicCoordinator, r.killNode, r.stopNode, r.partition, r.scaleNode,
	}, own...)
	for n := 0; time.Now().Add(*chaosEvery).Before(deadline); n++ {
		time.Sleep(*chaosEvery)
		inject := kinds[r.rng.IntN(len(kinds))]
		if n < len(own) {
			// Every run has each of these faults once.
			inject = own[n]
		}
		f := inject()
		if f.end.IsZero() {
			f.end = time.Now()
		}
		r.t.Logf("fault at %s: %s (%v)%s", f.start.Format("15:04:05.000"), f.name, f.end.Sub(f.start).Round(100*time.Millisecond), map[bool]string{true: " skipped: " + f.skipped, false: ""}[f.skipped != ""])
		r.faults = append(r.faults, f)
	}
}

func (r *chaosRun) debugFault(p *proc, query string) error {
	resp, err := adminPost(p.url + "/debug/fault?" + query)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		return fmt.Errorf("status %d", resp.StatusCode)
	}
	return nil
}

func (r *chaosRun) panicEngine() fault {
	nodes := append([]*proc{r.a}, r.hosts...)
	i := r.rng.IntN(len(nodes))
	rank := 2*i + r.rng.IntN(2)
	f := fault{kind: "engine panic", name: fmt.Sprintf("panic the engine of rank %d", rank), start: time.Now()}
	if err := r.debugFault(nodes[i], fmt.Sprintf("target=engine&rank=%d", rank)); err != nil {
		f.skipped = err.Error()
	}
	return f
}

func (r *chaosRun) panicAPIServer() fault {
	f := fault{kind: "API server crash", name: "crash the API server actor", start: time.Now()}
	if err := r.debugFault(r.a, "target=api-server"); err != nil {
		f.skipped = err.Error()
	}
	return f
}

func (r *chaosRun) panicCoordinator() fault {
	f := fault{kind: "coordinator crash", name: "crash the coordinator actor", start: time.Now()}
	v, err := r.a.view()
	if err != nil {
		f.skipped = err.Error()
		return f
	}
	for _, p := range append([]*proc{r.a}, r.hosts...) {
		if p.name == v.Coordinator.Node {
			if err := r.debugFault(p, "target=coordinator"); err != nil {
				f.skipped = err.Error()
			}
			return f
		}
	}
	f.skipped = "no coordinator"
	return f
}

// killNode kills a headless node (SIGKILL) and starts it again.
func (r *chaosRun) killNode() fault {
	i := r.rng.IntN(len(r.hosts))
	p := r.hosts[i]
	f := fault{kind: "kill -9 a node", name: "kill -9 " + p.ip + " and restart it", start: time.Now()}
	p.signal(syscall.SIGKILL)
	<-p.done
	time.Sleep(time.Duration(1+r.rng.IntN(3)) * time.Second)
	r.hosts[i] = startProc(r.t, p.ip, r.args[i]...)
	r.waitWhole()
	f.end = time.Now()
	return f
}

// headless are the arguments of a headless node on ip.
func (r *chaosRun) headless(ip string, extra ...string) []string {
	args := append(append([]string{"--headless", "--host", ip, "--metrics-port", "0", "--seeds", r.a.ip + ":7946"}, r.common...), r.engine.args(r.t, ip)...)
	return nodeArgs(ip, append(args, extra...)...)
}

// scaleNode grows the deployment by a fourth node of two ranks and, once
// they serve, shrinks it back: the node leaves by POST /admin/leave or by
// SIGTERM with --leave-on-terminate, draining first.
func (r *chaosRun) scaleNode() fault {
	const ip = "127.0.0.184"
	f := fault{kind: "scale up and down", name: "add a node of 2 ranks, then take it out", start: time.Now()}
	p := startProc(r.t, ip, r.headless(ip, "--leave-on-terminate")...)
	r.a.waitView("the deployment grown to eight ranks", 60*time.Second, func(v clusterView) bool {
		n := 0
		for _, rk := range v.Ranks {
			if rk.Balanced && rk.Ready {
				n++
			}
		}
		return n == 8 && v.Size == 8
	})
	time.Sleep(time.Duration(1+r.rng.IntN(3)) * time.Second)
	if r.rng.IntN(2) == 0 {
		f.name += " (POST /admin/leave)"
		resp, err := adminPost(p.url + "/admin/leave")
		if err != nil {
			r.t.Fatalf("POST /admin/leave: %v", err)
		}
		resp.Body.Close()
	} else {
		f.name += " (SIGTERM)"
		p.signal(syscall.SIGTERM)
	}
	select {
	case <-p.done:
	case <-time.After(60 * time.Second):
		r.t.Fatalf("the node taken out did not exit within 60s")
	}
	if p.err != nil {
		r.t.Fatalf("the node taken out exited with %v, want 0", p.err)
	}
	r.waitWhole()
	f.end = time.Now()
	return f
}

// stopNode hangs a headless node (SIGSTOP) for 2 to 7 s: short of gossip
// declaring it dead, or past it.
func (r *chaosRun) stopNode() fault {
	p := r.hosts[r.rng.IntN(len(r.hosts))]
	d := time.Duration(2+r.rng.IntN(6)) * time.Second
	f := fault{kind: "SIGSTOP a node", name: fmt.Sprintf("SIGSTOP %s for %v", p.ip, d), start: time.Now()}
	p.signal(syscall.SIGSTOP)
	time.Sleep(d)
	p.signal(syscall.SIGCONT)
	r.waitWhole()
	f.end = time.Now()
	return f
}

// partition drops every packet between the API node and a headless node
// for 10 s (nftables): gossip still reaches the node through the third, so
// only the actor connection notices, by its keepalive.
func (r *chaosRun) partition() fault {
	p := r.hosts[r.rng.IntN(len(r.hosts))]
	f := fault{kind: "dropped network path", name: "drop the path between " + r.a.ip + " and " + p.ip + " for 10s", start: time.Now()}
	rules := fmt.Sprintf("table inet dpchaos {\n chain out {\n  type filter hook output priority 0;\n  ip saddr %[1]s ip daddr %[2]s drop\n  ip saddr %[2]s ip daddr %[1]s drop\n }\n}\n", r.a.ip, p.ip)
	cmd := exec.Command("nft", "-f", "-")
	cmd.Stdin = strings.NewReader(rules)
	if out, err := cmd.CombinedOutput(); err != nil {
		f.skipped = fmt.Sprintf("nftables unavailable: %v %s", err, out)
		return f
	}
	time.Sleep(10 * time.Second)
	if out, err := exec.Command("nft", "delete", "table", "inet", "dpchaos").CombinedOutput(); err != nil {
		r.t.Fatalf("healing the partition: %v %s", err, out)
	}
	r.waitWhole()
	f.end = time.Now()
	return f
}

// report prints the table and checks the promises.
func (r *chaosRun) report(baseline map[string]float64, movedBefore [2]float64) {
	t := r.t
	counts := make([]int, len(outcomeNames))
	var calm, faulty []time.Duration
	settle := 2 * time.Second
	for _, rec := range r.records {
		counts[rec.outcome]++
		if rec.outcome != completed {
			continue
		}
		during := slices.ContainsFunc(r.faults, func(f fault) bool {
			return f.skipped == "" && rec.start.Before(f.end.Add(settle)) && rec.end.After(f.start)
		})
		if during {
			faulty = append(faulty, rec.end.Sub(rec.start))
		} else {
			calm = append(calm, rec.end.Sub(rec.start))
		}
	}
	moved := r.moved()
	p99 := func(d []time.Duration) string {
		if len(d) == 0 {
			return "-"
		}
		slices.Sort(d)
		return d[int(0.99*float64(len(d)-1))].Round(time.Millisecond).String()
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\nchaos run: %v of load, %d faults\n", *chaosDuration, len(r.faults))
	fmt.Fprintf(&b, "| %-34s | %8s |\n|%s|%s|\n", "requests", "count", strings.Repeat("-", 36), strings.Repeat("-", 10))
	fmt.Fprintf(&b, "| %-34s | %8d |\n", "sent", len(r.records))
	for o, name := range outcomeNames {
		fmt.Fprintf(&b, "| %-34s | %8d |\n", name, counts[o])
	}
	fmt.Fprintf(&b, "| %-34s | %8.0f |\n", "migrated mid-stream (engine moves)", moved[0]-movedBefore[0])
	fmt.Fprintf(&b, "| %-34s | %8.0f |\n", "re-dispatched (engine moves)", moved[1]-movedBefore[1])
	fmt.Fprintf(&b, "| %-34s | %8s |\n", "p99 latency without faults", p99(calm))
	fmt.Fprintf(&b, "| %-34s | %8s |\n", "p99 latency with faults", p99(faulty))
	// Each fault with the requests that failed while it was in progress
	// (up to settle after it healed).
	byKind, failedBy := map[string]int{}, map[string]int{}
	for _, f := range r.faults {
		kind := f.kind
		if f.skipped != "" {
			kind += " (skipped: " + f.skipped + ")"
		}
		byKind[kind]++
		for _, rec := range r.records {
			if rec.outcome != completed && rec.outcome != disconnected && !rec.end.Before(f.start) && rec.end.Before(f.end.Add(settle)) {
				failedBy[kind]++
			}
		}
	}
	kinds := slices.Sorted(maps.Keys(byKind))
	fmt.Fprintf(&b, "\n| %-34s | %8s | %17s |\n|%s|%s|%s|\n", "fault", "injected", "requests failed", strings.Repeat("-", 36), strings.Repeat("-", 10), strings.Repeat("-", 19))
	for _, k := range kinds {
		fmt.Fprintf(&b, "| %-34s | %8d | %17d |\n", k, byKind[k], failedBy[k])
	}
	errs := map[string]int{}
	for _, rec := range r.records {
		if rec.outcome == clearError {
			errs[rec.detail]++
		}
	}
	msgs := slices.SortedFunc(maps.Keys(errs), func(x, y string) int { return errs[y] - errs[x] })
	if len(msgs) > 0 {
		fmt.Fprintf(&b, "\nclear errors, most frequent first:\n")
	}
	for _, m := range msgs[:min(len(msgs), 8)] {
		fmt.Fprintf(&b, "%6d  %s\n", errs[m], m)
	}
	t.Log(b.String())

	for _, rec := range r.records {
		if rec.outcome == lost || rec.outcome == hung {
			t.Errorf("%s (request started %s): %s", outcomeNames[rec.outcome], rec.start.Format("15:04:05.000"), rec.detail)
		}
	}
	if counts[completed] == 0 {
		t.Error("no request completed")
	}
	// A request's state outlives a crash of the API server actor.
	if n := failedBy["API server crash"]; n > 0 {
		t.Errorf("%d requests failed while the API server restarted after a crash, want 0", n)
	}
	// Back to baseline: engines hold no KV block, and goroutines are what
	// an idle node runs (a restarted node is a fresh process: its own
	// baseline is no larger).
	for _, p := range append([]*proc{r.a}, r.hosts...) {
		if kv := p.metric("vllm:kv_cache_usage_perc", nil); kv != 0 {
			t.Errorf("%s: KV usage %v after the load, want 0", p.ip, kv)
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		now := r.goroutines()
		var over []string
		for ip, g := range now {
			if g > baseline[ip]+25 {
				over = append(over, fmt.Sprintf("%s: %v goroutines, baseline %v", ip, g, baseline[ip]))
			}
		}
		if len(over) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("goroutines did not return to baseline: %v", over)
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
}
