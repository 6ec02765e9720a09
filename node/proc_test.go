package node_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/dpnode/dpnode/engine"
	"github.com/dpnode/dpnode/engine/sim"
)

// dpnodeBin is the dpnode binary the multi-node tests run, built once,
// with dpnodeBuildTags (the chaos suite sets its tag).
var (
	dpnodeBin       string
	dpnodeBuildTags []string
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "dpnode-bin")
	if err != nil {
		panic(err)
	}
	dpnodeBin = filepath.Join(dir, "dpnode")
	build := append(append([]string{"build"}, dpnodeBuildTags...), "-o", dpnodeBin, "../cmd/dpnode")
	if out, err := exec.Command("go", build...).CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "building dpnode: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	if code == 0 {
		// The in-process tests start actor systems; protoactor's
		// dead-letter throttle outlives them by its one-second period.
		if err := goleak.Find(goleak.IgnoreAnyFunction("github.com/asynkron/protoactor-go/actor.NewThrottle.func1.1"),
			goleak.IgnoreAnyFunction("github.com/asynkron/protoactor-go/actor.NewDeadLetter.NewThrottle.func4.1")); err != nil {
			fmt.Fprintln(os.Stderr, err)
			code = 1
		}
	}
	os.Exit(code)
}

// proc is one dpnode process.
type proc struct {
	t    testing.TB
	cmd  *exec.Cmd
	ip   string
	name string
	url  string // empty for a headless node
	logs *logBuffer
	done chan struct{}
	err  error
}

// logBuffer keeps a process's log lines and lets a test wait for one.
type logBuffer struct {
	mu    sync.Mutex
	lines []string
	added chan struct{}
}

func (b *logBuffer) add(line string) {
	b.mu.Lock()
	b.lines = append(b.lines, line)
	b.mu.Unlock()
	select {
	case b.added <- struct{}{}:
	default:
	}
}

// find returns the first line matching re at or after from, and its index.
func (b *logBuffer) find(re *regexp.Regexp, from int) (string, int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for i := from; i < len(b.lines); i++ {
		if re.MatchString(b.lines[i]) {
			return b.lines[i], i
		}
	}
	return "", -1
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return strings.Join(b.lines, "\n")
}

// testAdminKey is the admin key of every test node.
const testAdminKey = "test-admin-key"

// adminPost calls a node's admin route with the tests' admin key.
func adminPost(url string) (*http.Response, error) {
	req, err := http.NewRequest(http.MethodPost, url, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+testAdminKey)
	return http.DefaultClient.Do(req)
}

// nodeArgs are what every test node runs with: one machine, so the local
// gossip profile; simulated steps at a twentieth of real time, unless
// extra sets --sim-time-scale or another --engine.
func nodeArgs(ip string, extra ...string) []string {
	args := []string{"join", "--bind", ip + ":7946", "--data-parallel-rpc-port", "29550",
		"--gossip-profile", "local", "--drain-timeout", "5s"}
	if !slices.Contains(extra, "--sim-time-scale") && !slices.Contains(extra, "--engine") {
		args = append(args, "--sim-time-scale", "0.05")
	}
	return append(args, extra...)
}

// startProc runs dpnode with args on ip and waits until it serves, or
// returns the error it exited with when wantFail.
func startProc(t testing.TB, ip string, args ...string) *proc {
	t.Helper()
	p, err := launch(t, ip, args...)
	if err != nil {
		t.Fatalf("dpnode on %s did not start: %v\n%s", ip, err, p.logs)
	}
	return p
}

func launch(t testing.TB, ip string, args ...string) (*proc, error) {
	t.Helper()
	p := spawn(t, ip, dpnodeBin, args...)
	return p, p.serving()
}

// spawn starts a node's process, argv[0] being dpnode or what execs it.
func spawn(t testing.TB, ip, name string, args ...string) *proc {
	t.Helper()
	p := &proc{t: t, ip: ip, logs: &logBuffer{added: make(chan struct{}, 1)}, done: make(chan struct{})}
	p.cmd = exec.Command(name, args...)
	// Every test node opens its admin routes to the tests' key.
	p.cmd.Env = append(os.Environ(), "DPNODE_ADMIN_API_KEY="+testAdminKey)
	stderr, err := p.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			p.logs.add(sc.Text())
		}
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.kill()
		if t.Failed() {
			t.Logf("log of dpnode on %s:\n%s", ip, p.logs)
		}
	})
	return p
}

// serving waits until the node serves, and reads its URL and name from
// its log.
func (p *proc) serving() error {
	serving := regexp.MustCompile(`msg="dpnode serving" url=("[^"]*"|\S+) metrics_url=(\S+) node=(\S+)`)
	deadline := time.After(30 * time.Second)
	for {
		if line, _ := p.logs.find(serving, 0); line != "" {
			m := serving.FindStringSubmatch(line)
			switch {
			case strings.HasPrefix(m[1], "http"):
				p.url = m[1]
			case strings.HasPrefix(m[2], "http"):
				// A headless node's /metrics, /health and /v1/cluster.
				p.url = m[2]
			}
			p.name = m[3]
			return nil
		}
		select {
		case <-p.done:
			return fmt.Errorf("exited: %v", p.err)
		case <-p.logs.added:
		case <-deadline:
			return fmt.Errorf("no serving line within 30s")
		}
	}
}

// waitLog waits for a log line matching pattern and returns it.
func (p *proc) waitLog(pattern string, timeout time.Duration) string {
	p.t.Helper()
	re := regexp.MustCompile(pattern)
	deadline := time.After(timeout)
	for {
		if line, _ := p.logs.find(re, 0); line != "" {
			return line
		}
		select {
		case <-p.logs.added:
		case <-deadline:
			p.t.Fatalf("dpnode on %s logged no line matching %q within %v", p.ip, pattern, timeout)
		}
	}
}

// kill ends the process now and waits for it.
func (p *proc) kill() {
	_ = p.cmd.Process.Signal(syscall.SIGCONT)
	_ = p.cmd.Process.Kill()
	<-p.done
}

func (p *proc) signal(s syscall.Signal) {
	p.t.Helper()
	if err := p.cmd.Process.Signal(s); err != nil {
		p.t.Fatal(err)
	}
}

// rankView is a rank in /v1/cluster.
type rankView struct {
	Rank        int    `json:"rank"`
	Node        string `json:"node"`
	Ready       bool   `json:"ready"`
	Balanced    bool   `json:"balanced"`
	Local       bool   `json:"local"`
	WaveRunning bool   `json:"wave_running"`
	InFlight    int    `json:"in_flight"`
	Running     int    `json:"running"`
	Waiting     int    `json:"waiting"`
}

// clusterView is the part of /v1/cluster the tests read.
type clusterView struct {
	Self string `json:"self"`
	Size int    `json:"data_parallel_size"`
	// Roster is the size's cluster state: which node holds which ranks.
	Roster struct {
		Holds []struct {
			Node      string `json:"node"`
			FirstRank int    `json:"first_rank"`
			Ranks     int    `json:"ranks"`
		} `json:"holds"`
	} `json:"size"`
	Nodes []struct {
		Name string `json:"name"`
	} `json:"nodes"`
	Ranks       []rankView `json:"ranks"`
	InFlight    int        `json:"in_flight_requests"`
	Coordinator struct {
		Node          string `json:"node"`
		Epoch         uint64 `json:"epoch"`
		RunningHere   bool   `json:"running_here"`
		SnapshotSeq   uint64 `json:"snapshot_seq"`
		RanksReported int    `json:"ranks_reported"`
		Wave          uint64 `json:"wave"`
		WaveRunning   bool   `json:"wave_running"`
		Group         []int  `json:"group"`
	} `json:"coordinator"`
}

func (p *proc) view() (clusterView, error) {
	var v clusterView
	resp, err := http.Get(p.url + "/v1/cluster")
	if err != nil {
		return v, err
	}
	defer resp.Body.Close()
	return v, json.NewDecoder(resp.Body).Decode(&v)
}

// waitView polls /v1/cluster until cond holds.
func (p *proc) waitView(what string, timeout time.Duration, cond func(clusterView) bool) clusterView {
	p.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		v, err := p.view()
		if err == nil && cond(v) {
			return v
		}
		if time.Now().After(deadline) {
			p.t.Fatalf("%s: not within %v (last view %+v, error %v)", what, timeout, v, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// metric sums a metric's series whose labels include want.
func (p *proc) metric(name string, want map[string]string) float64 {
	p.t.Helper()
	total, _ := p.series(name, want)
	return total
}

// hasSeries reports whether the node exports a series of name with the
// labels in want.
func (p *proc) hasSeries(name string, want map[string]string) bool {
	p.t.Helper()
	_, n := p.series(name, want)
	return n > 0
}

// series sums the node's series of name with the labels in want, and
// counts them.
func (p *proc) series(name string, want map[string]string) (total float64, n int) {
	p.t.Helper()
	resp, err := http.Get(p.url + "/metrics")
	if err != nil {
		p.t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(body), "\n") {
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		ok := true
		for k, v := range want {
			ok = ok && strings.Contains(line, fmt.Sprintf("%s=%q", k, v))
		}
		if ok {
			var val float64
			fmt.Sscan(line[strings.LastIndexByte(line, ' ')+1:], &val)
			total += val
			n++
		}
	}
	return total, n
}

// closedLoop runs clients that each send completions to url, one after
// another, until stop is closed; body gives client w's i-th request. The
// returned function waits for them and says how many requests were sent,
// how many failed (an error or a status other than 200), and the first
// failure.
func closedLoop(url string, clients int, stop <-chan struct{}, body func(w, i int) string) func() (sent, failed int, first error) {
	var mu sync.Mutex
	var wg sync.WaitGroup
	var sent, failed int
	var first error
	for w := range clients {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				status, resp, err := complete(context.Background(), url, body(w, i), nil)
				if err == nil && status != 200 {
					err = fmt.Errorf("status %d: %s", status, resp)
				}
				mu.Lock()
				sent++
				if err != nil {
					failed++
					if first == nil {
						first = err
					}
				}
				mu.Unlock()
			}
		})
	}
	return func() (int, int, error) {
		wg.Wait()
		return sent, failed, first
	}
}

// complete sends one completion and returns its status and body.
func complete(ctx context.Context, url, body string, header map[string]string) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/completions", bytes.NewBufferString(body))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

// burst sends n completions to url at once and returns how many failed,
// with the first failure.
func burst(url string, n int, maxTokens int) (failed int, first error) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			status, body, err := complete(ctx, url, fmt.Sprintf(`{"prompt":"burst %d","max_tokens":%d}`, i, maxTokens), nil)
			if err == nil && status != 200 {
				err = fmt.Errorf("status %d: %s", status, body)
			}
			if err != nil {
				mu.Lock()
				failed++
				if first == nil {
					first = err
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return failed, first
}

// simText is the simulated engine's text for a prompt, greedy and to
// maxTokens: what a request must get whatever moved it on the way.
func simText(prompt string, maxTokens int) string {
	tok := sim.NewTokenizer(0)
	h := engine.PromptHash(tok.Tokens(prompt), nil)
	ids := make([]uint32, maxTokens)
	for j := range ids {
		ids[j] = tok.Sample(h, j, &engine.SamplingParams{IgnoreEOS: true})
	}
	return tok.Decode(ids)
}
