//go:build chaos && llamacpp

package node_test

import (
	"encoding/json"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/dpnode/dpnode/engine/llamacpp/llamacpptest"
)

// The llama.cpp engine in the chaos suite: the random-weight test model on
// every rank, and two faults of its own, kill -9 of a rank's model worker
// (an engine crash: the rank restarts, its streams move) and of the API
// node's tokenizer worker.
func init() {
	chaosEngines["llamacpp"] = chaosEngineKind{
		args: func(t *testing.T, _ string) []string {
			return []string{"--engine", "llamacpp", "--model", llamacpptest.Model(t), "--threads", "1",
				"--kv-cache-memory-bytes", "16MiB", "--max-num-seqs", "32"}
		},
		expected:    llamaExpected,
		checkAtMost: 300,
		faults: func(r *chaosRun) []func() fault {
			return []func() fault{r.killWorker, r.killTokenizer, r.killWorker}
		},
		check: func(r *chaosRun) {
			if orphans := workersOf(1, ""); len(orphans) > 0 {
				r.t.Errorf("model workers outlived their node: %v", orphans)
			}
		},
	}
}

// llamaExpected is llama.cpp's own greedy continuation of each prompt, as
// the node's tokenizer reads it, decoded to text as a response carries it
// (JSON makes an incomplete character at the end U+FFFD).
func llamaExpected(t *testing.T, reqs []chaosRequest) []string {
	tok := llamacpptest.Tokenizer(t, llamacpptest.Model(t))
	var err error
	longest := 1
	prompts := make([][]uint32, len(reqs))
	for i, q := range reqs {
		if prompts[i], err = tok.Encode(q.prompt, true); err != nil {
			t.Fatal(err)
		}
		longest = max(longest, q.maxTokens)
	}
	ids := llamacpptest.Greedy(t, llamacpptest.Model(t), "f32", longest, prompts)
	out := make([]string, len(reqs))
	for i, q := range reqs {
		b, _ := json.Marshal(tok.Decode(ids[i][:q.maxTokens]))
		_ = json.Unmarshal(b, &out[i])
	}
	return out
}

// killWorker kills one rank's model worker on any node.
func (r *chaosRun) killWorker() fault {
	nodes := append([]*proc{r.a}, r.hosts...)
	p := nodes[r.rng.IntN(len(nodes))]
	f := fault{kind: "kill -9 a model worker", start: time.Now()}
	pids := workersOf(p.cmd.Process.Pid, "rank-")
	if len(pids) == 0 {
		f.name, f.skipped = "kill -9 a model worker on "+p.ip, "no worker running (its rank restarting)"
		return f
	}
	pid := pids[r.rng.IntN(len(pids))]
	f.name = fmt.Sprintf("kill -9 model worker %d on %s", pid, p.ip)
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		f.skipped = err.Error()
		return f
	}
	r.waitWhole()
	f.end = time.Now()
	return f
}

// killTokenizer kills the API node's tokenizer worker: the requests being
// tokenized then go to a new one.
func (r *chaosRun) killTokenizer() fault {
	f := fault{kind: "kill -9 the tokenizer worker", name: "kill -9 the tokenizer worker of " + r.a.ip, start: time.Now()}
	pids := workersOf(r.a.cmd.Process.Pid, "tokenizer")
	if len(pids) != 1 {
		f.skipped = fmt.Sprintf("%d tokenizer workers", len(pids))
		return f
	}
	if err := syscall.Kill(pids[0], syscall.SIGKILL); err != nil {
		f.skipped = err.Error()
	}
	return f
}
