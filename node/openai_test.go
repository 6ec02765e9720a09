package node_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"
)

// simModel is what a simulated dpnode serves by default.
const simModel = "meta-llama/Llama-3.1-8B-Instruct"

// startSimServers starts a dpnode with one simulated rank on each ip, each
// a cluster of its own: the OpenAI-compatible servers an openai node
// stands in front of.
func startSimServers(t *testing.T, ips ...string) []*proc {
	t.Helper()
	var servers []*proc
	for _, ip := range ips {
		servers = append(servers, startProc(t, ip, nodeArgs(ip, "--host", ip, "--port", "0", "--gpus", "1")...))
	}
	return servers
}

// startOpenAINode starts a node of the openai engine on ip in front of
// servers, one rank each.
func startOpenAINode(t *testing.T, ip string, servers []*proc, extra ...string) *proc {
	t.Helper()
	args := []string{"--host", ip, "--port", "0", "--engine", "openai", "--model", simModel, "--engine-health-interval", "200ms"}
	for _, s := range servers {
		args = append(args, "--engine-url", s.url)
	}
	return startProc(t, ip, nodeArgs(ip, append(args, extra...)...)...)
}

// completionIDs is a completion's text and token ids.
type completionIDs struct {
	Choices []struct {
		Text         string   `json:"text"`
		TokenIDs     []uint32 `json:"token_ids"`
		FinishReason string   `json:"finish_reason"`
	} `json:"choices"`
}

func completeIDs(t *testing.T, url, body string) completionIDs {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	status, b, err := complete(ctx, url, body, nil)
	if err != nil || status != http.StatusOK {
		t.Fatalf("%s: %d %v %s", url, status, err, b)
	}
	var c completionIDs
	if err := json.Unmarshal(b, &c); err != nil || len(c.Choices) != 1 {
		t.Fatalf("%s: %v %s", url, err, b)
	}
	return c
}

// streamText reads a streamed completion's text and finish; first, when
// not nil, is called after the first chunk.
func streamText(ctx context.Context, url, body string, first func()) (string, string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/completions", strings.NewReader(body))
	if err != nil {
		return "", "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", "", err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "", "", fmt.Errorf("status %d", resp.StatusCode)
	}
	var text strings.Builder
	finish := ""
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok || data == "[DONE]" {
			continue
		}
		var ch struct {
			Choices []struct {
				Text         string  `json:"text"`
				FinishReason *string `json:"finish_reason"`
			} `json:"choices"`
			Error *struct {
				Message string `json:"message"`
			} `json:"error"`
		}
		if err := json.Unmarshal([]byte(data), &ch); err != nil {
			return "", "", err
		}
		if ch.Error != nil {
			return text.String(), "", fmt.Errorf("stream error: %s", ch.Error.Message)
		}
		for _, c := range ch.Choices {
			text.WriteString(c.Text)
			if c.FinishReason != nil {
				finish = *c.FinishReason
			}
		}
		if first != nil {
			first()
			first = nil
		}
	}
	return text.String(), finish, sc.Err()
}

// TestOpenAIEngineInFrontOfServers runs a node of the openai engine in
// front of two dpnode servers: completions and chats come back as the
// servers give them, streamed or whole, over both ranks; a cancelled
// stream ends on its server; a server that answers errors fails the
// request alone; and a server that hangs is left, its requests moved.
func TestOpenAIEngineInFrontOfServers(t *testing.T) {
	servers := startSimServers(t, "127.0.0.234", "127.0.0.235")
	// The node admits longer requests than the servers take: one that
	// a server refuses is the test of refusals.
	front := startOpenAINode(t, "127.0.0.233", servers, "--max-model-len", "65536")
	front.waitView("both ranks ready", 30*time.Second, func(v clusterView) bool {
		return len(v.Ranks) == 2 && v.Ranks[0].Ready && v.Ranks[1].Ready
	})

	t.Run("serving", func(t *testing.T) {
		for _, body := range []string{
			`{"prompt":"Hello there","max_tokens":12,"return_token_ids":true}`,
			`{"prompt":[9906,1070,374],"max_tokens":5,"return_token_ids":true,"temperature":0}`,
		} {
			want := completeIDs(t, servers[0].url, body)
			got := completeIDs(t, front.url, body)
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Errorf("%s:\nthrough the node %+v\nfrom the server %+v", body, got, want)
			}
		}
		// A chat is rendered by the servers' template and tokenized by
		// their /tokenize: the same prompt, so the same answer.
		chat := `{"model":"` + simModel + `","messages":[{"role":"user","content":"hi"}],"max_tokens":6}`
		var replies []string
		for _, url := range []string{servers[1].url, front.url} {
			req, _ := http.NewRequest(http.MethodPost, url+"/v1/chat/completions", strings.NewReader(chat))
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			var c struct {
				Choices []struct {
					Message struct{ Content string } `json:"message"`
				} `json:"choices"`
				Usage struct{ PromptTokens int } `json:"usage"`
			}
			err = json.NewDecoder(resp.Body).Decode(&c)
			resp.Body.Close()
			if err != nil || len(c.Choices) != 1 {
				t.Fatalf("%s: %v", url, err)
			}
			replies = append(replies, fmt.Sprintf("%d tokens in: %q", c.Usage.PromptTokens, c.Choices[0].Message.Content))
		}
		if replies[0] != replies[1] {
			t.Errorf("chat from the server %s, through the node %s", replies[0], replies[1])
		}
	})

	t.Run("streaming", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		body := `{"prompt":"stream me","max_tokens":20,"stream":true}`
		text, finish, err := streamText(ctx, front.url, body, nil)
		whole := completeIDs(t, servers[0].url, strings.Replace(body, `"stream":true`, `"stream":false`, 1))
		if err != nil || text != whole.Choices[0].Text || finish != whole.Choices[0].FinishReason {
			t.Fatalf("streamed %q (%s, %v); want %q (%s)", text, finish, err, whole.Choices[0].Text, whole.Choices[0].FinishReason)
		}
	})

	t.Run("both ranks serve", func(t *testing.T) {
		if failed, first := burst(front.url, 16, 30); failed > 0 {
			t.Fatalf("%d of 16 failed: %v", failed, first)
		}
		for i, s := range servers {
			if n := s.metric("vllm:request_success_total", nil); n == 0 {
				t.Errorf("server %d served nothing of the burst", i)
			}
		}
	})

	t.Run("cancellation", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		// Long enough to be running on its server when cancelled.
		_, _, err := streamText(ctx, front.url, `{"prompt":"cancel me","max_tokens":3000,"ignore_eos":true,"stream":true}`, cancel)
		if err == nil {
			t.Fatal("the stream ended whole; it was to be cancelled")
		}
		deadline := time.Now().Add(15 * time.Second)
		for servers[0].metric("vllm:num_requests_running", nil)+servers[1].metric("vllm:num_requests_running", nil) > 0 {
			if time.Now().After(deadline) {
				t.Fatal("the cancelled request still runs on its server")
			}
			time.Sleep(50 * time.Millisecond)
		}
	})

	t.Run("a server's refusal fails the request alone", func(t *testing.T) {
		// The servers bound a request at 32,768 tokens; the node is told
		// more, so a longer one reaches a server, which refuses it.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		status, b, err := complete(ctx, front.url, `{"prompt":"x","max_tokens":40000}`, nil)
		if err != nil || status != http.StatusBadRequest || !strings.Contains(string(b), "refused") {
			t.Fatalf("%d %v %s; want the server's refusal, a 400", status, err, b)
		}
		front.waitView("both ranks still ready", 10*time.Second, func(v clusterView) bool {
			return v.Ranks[0].Ready && v.Ranks[1].Ready
		})
	})

	t.Run("a server of another model is refused", func(t *testing.T) {
		ip := "127.0.0.236"
		p, err := launch(t, ip, nodeArgs(ip, "--host", ip, "--port", "0", "--engine", "openai", "--model", "other/model",
			"--engine-url", servers[0].url)...)
		if err == nil || !strings.Contains(p.logs.String(), "serves "+simModel+", not other/model") {
			t.Fatalf("started (%v), or without naming both models:\n%s", err, p.logs)
		}
	})

	t.Run("what the engine lacks is refused", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		for body, want := range map[string]string{
			`{"prompt":"x","max_tokens":3,"prompt_logprobs":2}`:      "not supported by --engine openai",
			`{"prompt":"x","max_tokens":3,"echo":true,"logprobs":1}`: "which --engine openai does not",
		} {
			status, b, err := complete(ctx, front.url, body, nil)
			if err != nil || status != http.StatusBadRequest || !strings.Contains(string(b), want) {
				t.Errorf("%s: %d %v %s; want a 400 naming the engine", body, status, err, b)
			}
		}
		// Structured output is forwarded; these servers are simulated,
		// and refuse it themselves.
		body := `{"prompt":"x","max_tokens":3,"structured_outputs":{"regex":"a+"}}`
		if status, b, err := complete(ctx, front.url, body, nil); err != nil || status != http.StatusBadRequest || !strings.Contains(string(b), "refused the request: structured_outputs is not supported by the simulated engine") {
			t.Errorf("%s: %d %v %s; want the server's refusal, a 400", body, status, err, b)
		}
	})

	t.Run("a hung server's requests move", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		type result struct {
			text, finish string
			err          error
		}
		results := make(chan result, 8)
		started := make(chan struct{}, 8)
		for i := range 8 {
			go func() {
				text, finish, err := streamText(ctx, front.url, fmt.Sprintf(`{"prompt":"hang %d","max_tokens":200,"ignore_eos":true,"stream":true}`, i),
					func() { started <- struct{}{} })
				results <- result{text, finish, err}
			}()
		}
		for range 8 {
			<-started
		}
		servers[1].signal(syscall.SIGSTOP)
		defer servers[1].signal(syscall.SIGCONT)
		for range 8 {
			r := <-results
			if r.err != nil || r.finish != "length" {
				t.Errorf("a stream ended %q with %v; want it whole", r.finish, r.err)
			}
		}
		front.waitLog(`127.0.0.235.*(stopped answering /health|gave no output)`, 5*time.Second)
	})
}

// TestOpenAIEngineExternalMode runs the openai engine in external mode:
// two nodes of one deployment, each the API server of its one rank, in
// front of its own server. Each serves what its server gives, streamed
// or whole, through its own rank alone, and refuses the other's.
func TestOpenAIEngineExternalMode(t *testing.T) {
	servers := startSimServers(t, "127.0.0.208", "127.0.0.209")
	var fronts []*proc
	for rank, ip := range []string{"127.0.0.218", "127.0.0.219"} {
		extra := []string{"--data-parallel-size", "2", "--data-parallel-rank", fmt.Sprint(rank)}
		if rank > 0 {
			extra = append(extra, "--seeds", "127.0.0.218:7946")
		}
		fronts = append(fronts, startOpenAINode(t, ip, servers[rank:rank+1], extra...))
	}
	fronts[0].waitView("both ranks ready", 30*time.Second, func(v clusterView) bool {
		return len(v.Ranks) == 2 && v.Ranks[0].Ready && v.Ranks[1].Ready
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for rank, front := range fronts {
		body := fmt.Sprintf(`{"prompt":"external %d","max_tokens":12,"return_token_ids":true}`, rank)
		if want, got := completeIDs(t, servers[rank].url, body), completeIDs(t, front.url, body); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("rank %d: through the node %+v\nfrom its server %+v", rank, got, want)
		}
		stream := fmt.Sprintf(`{"prompt":"stream %d","max_tokens":20,"stream":true}`, rank)
		text, finish, err := streamText(ctx, front.url, stream, nil)
		whole := completeIDs(t, servers[rank].url, strings.Replace(stream, `"stream":true`, `"stream":false`, 1))
		if err != nil || text != whole.Choices[0].Text || finish != whole.Choices[0].FinishReason {
			t.Errorf("rank %d streamed %q (%s, %v); want %q (%s)", rank, text, finish, err, whole.Choices[0].Text, whole.Choices[0].FinishReason)
		}
		if failed, first := burst(front.url, 8, 30); failed > 0 {
			t.Fatalf("rank %d: %d of 8 failed: %v", rank, failed, first)
		}
		other := 1 - rank
		if status, b, err := complete(ctx, front.url, `{"prompt":"x","max_tokens":1}`, map[string]string{"X-data-parallel-rank": fmt.Sprint(other)}); err != nil || status != http.StatusBadRequest {
			t.Errorf("pinning rank %d on rank %d's node: %d %s %v; want 400", other, rank, status, b, err)
		}
	}
	// Each server ran its node's requests, and only those: its own
	// requests above (2 + 8 through the node, 2 asked directly).
	for rank, s := range servers {
		if n := s.metric("vllm:request_success_total", nil); n != 12 {
			t.Errorf("rank %d's server finished %v requests, want 12", rank, n)
		}
		if n := fronts[rank].metric("vllm:request_success_total", map[string]string{"engine": fmt.Sprint(rank)}); n != 10 {
			t.Errorf("rank %d's node counts %v requests on its rank, want 10", rank, n)
		}
	}
}

// TestOpenAINodeFailsOnAServerThatNeverServes: a server that never
// answers is waited for --engine-start-timeout, then the node exits with
// an error naming it.
func TestOpenAINodeFailsOnAServerThatNeverServes(t *testing.T) {
	const ip = "127.0.0.210"
	dead := "http://" + ip + ":9" // nothing listens on the discard port
	p, err := launch(t, ip, nodeArgs(ip, "--host", ip, "--port", "0", "--engine", "openai", "--model", simModel,
		"--engine-url", dead, "--engine-start-timeout", "2s")...)
	if err == nil {
		t.Fatal("the node served with no server to serve")
	}
	if !strings.Contains(p.logs.String(), "the server at "+dead+" did not serve within 2s") {
		t.Fatalf("the node's error does not name the server and the wait:\n%s", p.logs)
	}
}

// TestOpenAINodeWaitsForItsServerAndSaysSo: a server that does not answer
// yet is waited for, as a model that loads: the node answers on its port
// meanwhile, /health naming the rank still loading, and serves once the
// server does.
func TestOpenAINodeWaitsForItsServerAndSaysSo(t *testing.T) {
	const ip, serverIP = "127.0.0.204", "127.0.0.205"
	serverURL := "http://" + serverIP + ":18300"
	p := spawn(t, ip, dpnodeBin, nodeArgs(ip, "--host", ip, "--port", "8000", "--engine", "openai", "--model", simModel,
		"--engine-url", serverURL, "--engine-health-interval", "200ms")...)
	p.waitLog(`msg="waiting for the server"`, 30*time.Second)
	client := &http.Client{Timeout: 5 * time.Second}
	resp, err := client.Get("http://" + ip + ":8000/health")
	if err != nil {
		t.Fatalf("/health while the server is away: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(body), `"loading_ranks":[0]`) {
		t.Fatalf("/health while the server is away: %d %s; want 503 naming rank 0 as loading", resp.StatusCode, body)
	}
	startProc(t, serverIP, nodeArgs(serverIP, "--host", serverIP, "--port", "18300", "--gpus", "1")...)
	if err := p.serving(); err != nil {
		t.Fatalf("the node did not serve once its server did: %v", err)
	}
	completeIDs(t, p.url, `{"model": "`+simModel+`", "prompt": "hello", "max_tokens": 3}`)
}
