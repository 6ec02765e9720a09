//go:build llamacpp

package node_test

import (
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/dpnode/dpnode/engine/llamacpp"
	"github.com/dpnode/dpnode/engine/llamacpp/llamacpptest"
)

// TestOpenAIEngineMovesGreedyStreamsExactly runs a node of the openai
// engine, tokenizing with the model's vocabulary (--tokenizer), in front
// of two dpnode servers of the llama.cpp engine; kills one server (kill
// -9) while eight greedy streams run; and checks that each ends whole with
// llama.cpp's greedy tokens: a request moved off the dead server continues
// on the other from its prompt and its output so far.
func TestOpenAIEngineMovesGreedyStreamsExactly(t *testing.T) {
	model := llamacpptest.Model(t)
	t.Setenv(llamacpp.WorkerEnv, llamacpptest.Worker(t))
	var servers []*proc
	for _, ip := range []string{"127.0.0.238", "127.0.0.239"} {
		servers = append(servers, startProc(t, ip, nodeArgs(ip, "--host", ip, "--port", "0", "--gpus", "1", "--engine", "llamacpp", "--model", model,
			"--threads", "1", "--kv-cache-memory-bytes", "16MiB", "--max-num-seqs", "16")...))
	}
	front := startProc(t, "127.0.0.237", nodeArgs("127.0.0.237", "--host", "127.0.0.237", "--port", "0", "--engine", "openai", "--model", model,
		"--tokenizer", model, "--engine-url", servers[0].url, "--engine-url", servers[1].url, "--engine-health-interval", "200ms")...)
	front.waitView("both ranks ready", time.Minute, func(v clusterView) bool {
		return len(v.Ranks) == 2 && v.Ranks[0].Ready && v.Ranks[1].Ready
	})
	const maxTokens = 48
	ps := prompts(8)
	want := llamacpptest.Greedy(t, model, "f32", maxTokens, ps)
	n := &llamaNode{base: front.url, http: &http.Client{}}
	results := make([]streamed, len(ps))
	started := make(chan struct{}, len(ps))
	var wg sync.WaitGroup
	for i, p := range ps {
		wg.Go(func() { results[i] = n.streamIDs(p, maxTokens, nil, 8, started, "") })
	}
	for range ps {
		select {
		case <-started:
		case <-time.After(2 * time.Minute):
			t.Fatal("the streams got no tokens")
		}
	}
	running := servers[0].metric("vllm:num_requests_running", nil)
	servers[0].kill()
	wg.Wait()
	if running == 0 {
		t.Fatal("no stream ran on the killed server")
	}
	for i, r := range results {
		if r.err != nil || !slices.Equal(r.ids, want[i]) {
			t.Errorf("stream %d: %v, %v\nwant %v", i, r.err, r.ids, want[i])
		}
	}
	if moved := front.metric("dpnode_requests_migrated_total", nil); moved == 0 {
		t.Error("no request moved")
	}
}
