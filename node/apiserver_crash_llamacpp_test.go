//go:build chaos && llamacpp

package node_test

import (
	"net/http"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/dpnode/dpnode/engine/llamacpp/llamacpptest"
	"github.com/dpnode/dpnode/node"
)

// TestLlamaCppAPIServerCrashRestartsNoWorker crashes the API server of a
// llama.cpp node while both ranks stream: the node actor supervises the
// engines, so no model worker restarts (a restart reloads the model:
// seconds here, minutes for a real one), and every stream finishes with
// llama.cpp's own tokens, none failed.
func TestLlamaCppAPIServerCrashRestartsNoWorker(t *testing.T) {
	n := startLlamaNode(t, func(o *node.Options) { o.AdminAPIKeys = []string{testAdminKey} })
	ps := prompts(8)
	const maxTokens = 64
	want := llamacpptest.Greedy(t, llamacpptest.Model(t), "f32", maxTokens, ps)
	workers := func() []int {
		return slices.Concat(workersOf(os.Getpid(), "rank-0"), workersOf(os.Getpid(), "rank-1"))
	}
	before := workers()
	if len(before) != 2 {
		t.Fatalf("the node's model workers: %v", before)
	}
	results := make([]streamed, len(ps))
	started := make(chan struct{}, len(ps))
	var wg sync.WaitGroup
	for i := range ps {
		wg.Go(func() {
			// Half on each rank, so that both hold streams when the API
			// server crashes.
			results[i] = n.streamIDs(ps[i], maxTokens, nil, 1, started, []string{"0", "1"}[i%2])
		})
	}
	for range ps {
		select {
		case <-started:
		case <-time.After(2 * time.Minute):
			t.Fatal("the streams got no tokens")
		}
	}
	resp, err := adminPost(n.base + "/debug/fault?target=api-server")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("POST /debug/fault: %d", resp.StatusCode)
	}
	wg.Wait()
	for i, r := range results {
		if r.err != nil || !slices.Equal(r.ids, want[i]) {
			t.Errorf("stream %d across the API server's crash: %v\n dpnode %v\nllama.cpp %v", i, r.err, r.ids, want[i])
		}
	}
	if after := workers(); !slices.Equal(after, before) {
		t.Errorf("the model workers were %v before the crash and %v after", before, after)
	}
	if restarts := n.metric(t, "dpnode_engine_restarts_total"); restarts != 0 {
		t.Errorf("%v engine restarts, want none", restarts)
	}
}
