//go:build llamacpp

package node_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// streamed is one stream's token ids, and their log-probabilities when
// asked (with echo, the prompt's first), or why it failed.
type streamed struct {
	ids []uint32
	lps []*float64
	err error
}

// streamAcrossAKill streams n requests at once (request i's prompt, its
// max_tokens and more fields), kills rank 0's model worker, and returns
// what every stream got. The even-numbered requests are pinned to rank 0
// and the worker dies once each of them has after tokens: they share its
// batches, so none has finished, whatever the balancer did with the
// others and however slowly rank 1 started on a busy machine. Pinned,
// they migrate onto rank 0's next worker; the others go where the
// balancer sends them.
func (n *llamaNode) streamAcrossAKill(t *testing.T, count int, req func(i int) ([]uint32, int, map[string]any), after int) []streamed {
	t.Helper()
	results := make([]streamed, count)
	started := make(chan struct{}, count)
	var wg sync.WaitGroup
	for i := range results {
		wg.Go(func() {
			prompt, maxTokens, fields := req(i)
			if i%2 == 0 {
				results[i] = n.streamIDs(prompt, maxTokens, fields, after, started, "0")
			} else {
				results[i] = n.streamIDs(prompt, maxTokens, fields, after, nil, "")
			}
		})
	}
	for range (count + 1) / 2 {
		select {
		case <-started:
		case <-time.After(2 * time.Minute):
			t.Fatal("the streams pinned to rank 0 got no tokens")
		}
	}
	pids := workersOf(os.Getpid(), "rank-0")
	if len(pids) != 1 {
		t.Fatalf("rank 0's workers: %v", pids)
	}
	if err := syscall.Kill(pids[0], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	return results
}

// streamIDs streams prompt's greedy continuation (or as fields say) and
// returns its token ids and log-probabilities; started, when not nil,
// gets a value once after tokens came. A rank other than "" pins the
// request to it.
func (n *llamaNode) streamIDs(prompt []uint32, maxTokens int, fields map[string]any, after int, started chan<- struct{}, rank string) streamed {
	body := map[string]any{"prompt": prompt, "max_tokens": maxTokens, "temperature": 0, "ignore_eos": true,
		"return_token_ids": true, "stream": true}
	maps.Copy(body, fields)
	b, _ := json.Marshal(body)
	req, _ := http.NewRequest(http.MethodPost, n.base+"/v1/completions", bytes.NewReader(b))
	req.Header.Set("Content-Type", "application/json")
	if rank != "" {
		req.Header.Set("X-data-parallel-rank", rank)
	}
	resp, err := n.http.Do(req)
	if err != nil {
		return streamed{err: err}
	}
	defer resp.Body.Close()
	var ids []uint32
	var lps []*float64
	first := true
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok || line == "[DONE]" {
			continue
		}
		var c completion
		if err := json.Unmarshal([]byte(line), &c); err != nil || len(c.Choices) == 0 {
			return streamed{ids, lps, fmt.Errorf("event %s", line)}
		}
		ids = append(ids, c.Choices[0].TokenIDs...)
		if c.Choices[0].Logprobs != nil {
			lps = append(lps, c.Choices[0].Logprobs.TokenLogprobs...)
		}
		if first && len(ids) >= after && started != nil {
			first = false
			started <- struct{}{}
		}
	}
	return streamed{ids, lps, sc.Err()}
}
