//go:build llamacpp

package node_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

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
	// Long enough that the killed server's streams still run when the
	// last of the eight has its first tokens, on a busy machine too (at
	// 48 a CI run found them all finished there).
	const maxTokens = 160
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

// TestOpenAIEngineWithoutTokenizerKeepsCharactersWhole runs a node of the
// openai engine with no --tokenizer, which decodes output by its server's
// /detokenize, in front of a dpnode server of the llama.cpp engine. The
// requests bias the model to two tokens that are each one byte of a
// two-byte character (a lead byte, a continuation byte), with a
// repetition penalty so that it alternates: its output holds characters
// made of two tokens, each U+FFFD alone. Each streamed text must equal
// the server's own, whose decoding has every byte.
func TestOpenAIEngineWithoutTokenizerKeepsCharactersWhole(t *testing.T) {
	model := llamacpptest.Model(t)
	worker := llamacpptest.Worker(t)
	t.Setenv(llamacpp.WorkerEnv, worker)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	tok, err := llamacpp.NewTokenizer(ctx, llamacpp.WorkerConfig{Binary: worker}, llamacpptest.Vocab(t, "llama-bpe"), llamacpp.TokenizerConfig{Workers: 1})
	if err != nil {
		t.Fatal(err)
	}
	lead, cont := -1, -1
	for id := range tok.VocabSize() {
		if b := tok.Decode([]uint32{uint32(id)}); len(b) == 1 {
			switch {
			case lead < 0 && b[0] >= 0xC2 && b[0] <= 0xDF:
				lead = id
			case cont < 0 && b[0] >= 0x80 && b[0] <= 0xBF:
				cont = id
			}
		}
	}
	char := tok.Decode([]uint32{uint32(lead), uint32(cont)})
	tok.Close()
	if lead < 0 || cont < 0 || !utf8.ValidString(char) {
		t.Fatalf("no one-byte tokens of a two-byte character: %d %d %q", lead, cont, char)
	}

	srv := startProc(t, "127.0.0.206", nodeArgs("127.0.0.206", "--host", "127.0.0.206", "--port", "0", "--gpus", "1", "--engine", "llamacpp", "--model", model,
		"--threads", "1", "--kv-cache-memory-bytes", "16MiB", "--max-num-seqs", "8")...)
	front := startProc(t, "127.0.0.207", nodeArgs("127.0.0.207", "--host", "127.0.0.207", "--port", "0", "--engine", "openai", "--model", model,
		"--engine-url", srv.url)...)
	front.waitView("its rank ready", time.Minute, func(v clusterView) bool { return len(v.Ranks) == 1 && v.Ranks[0].Ready })

	direct := &llamaNode{base: srv.url, http: &http.Client{}}
	whole := 0
	for i, p := range prompts(4) {
		req := map[string]any{"prompt": p, "max_tokens": 16, "temperature": 0, "ignore_eos": true,
			"logit_bias": map[string]float64{fmt.Sprint(lead): 100, fmt.Sprint(cont): 100}, "repetition_penalty": 2}
		var want completion
		direct.postJSON(t, "/v1/completions", req, &want)
		if len(want.Choices) != 1 {
			t.Fatalf("prompt %d: the server answered %+v", i, want)
		}
		whole += strings.Count(want.Choices[0].Text, char)
		req["stream"] = true
		b, _ := json.Marshal(req)
		got, finish, err := streamText(ctx, front.url, string(b), nil)
		if err != nil || finish != "length" {
			t.Fatalf("prompt %d through the front: %q %s %v", i, got, finish, err)
		}
		if got != want.Choices[0].Text {
			t.Errorf("prompt %d: streamed %q\nthe server's %q", i, got, want.Choices[0].Text)
		}
	}
	if whole == 0 {
		t.Fatalf("no output held %q: the test checked nothing", char)
	}
}

// TestOpenAIEngineForwardsLogprobsAndGrammars asks a node of the openai
// engine, in front of a dpnode server of the llama.cpp engine, for
// log-probabilities in completions and chats, and for structured output:
// they are the server's own, as the server gives them asked directly.
func TestOpenAIEngineForwardsLogprobsAndGrammars(t *testing.T) {
	model := llamacpptest.Model(t)
	t.Setenv(llamacpp.WorkerEnv, llamacpptest.Worker(t))
	srv := startProc(t, "127.0.0.206", nodeArgs("127.0.0.206", "--host", "127.0.0.206", "--port", "0", "--gpus", "1", "--engine", "llamacpp", "--model", model,
		"--threads", "1", "--kv-cache-memory-bytes", "16MiB", "--max-num-seqs", "4")...)
	front := startProc(t, "127.0.0.207", nodeArgs("127.0.0.207", "--host", "127.0.0.207", "--port", "0", "--engine", "openai", "--model", model,
		"--tokenizer", model, "--engine-url", srv.url)...)
	front.waitView("its rank ready", time.Minute, func(v clusterView) bool { return len(v.Ranks) == 1 && v.Ranks[0].Ready })
	direct := &llamaNode{base: srv.url, http: &http.Client{}}
	through := &llamaNode{base: front.url, http: &http.Client{}}

	type logprobs struct {
		Choices []struct {
			Logprobs json.RawMessage `json:"logprobs"`
		} `json:"choices"`
	}
	for i, p := range prompts(2) {
		req := map[string]any{"prompt": p, "max_tokens": 6, "temperature": 0, "ignore_eos": true, "logprobs": 3, "return_tokens_as_token_ids": true}
		var want, got logprobs
		direct.postJSON(t, "/v1/completions", req, &want)
		through.postJSON(t, "/v1/completions", req, &got)
		if len(want.Choices) != 1 || len(got.Choices) != 1 || !strings.Contains(string(want.Choices[0].Logprobs), "token_id:") {
			t.Fatalf("prompt %d: the server gave %+v, the node %+v", i, want, got)
		}
		if string(got.Choices[0].Logprobs) != string(want.Choices[0].Logprobs) {
			t.Errorf("prompt %d: through the node %s\nthe server's %s", i, got.Choices[0].Logprobs, want.Choices[0].Logprobs)
		}
	}
	// A chat, its tokens named by text: the node renders and names them
	// with the same vocabulary as the server.
	chat := map[string]any{"messages": []map[string]string{{"role": "user", "content": "hello there"}}, "max_tokens": 5, "temperature": 0,
		"ignore_eos": true, "logprobs": true, "top_logprobs": 2}
	var want, got logprobs
	direct.postJSON(t, "/v1/chat/completions", chat, &want)
	through.postJSON(t, "/v1/chat/completions", chat, &got)
	if len(want.Choices) != 1 || len(got.Choices) != 1 || string(got.Choices[0].Logprobs) != string(want.Choices[0].Logprobs) {
		t.Errorf("chat: through the node %+v\nthe server's %+v", got, want)
	}

	// Structured output: a regex, and a chat's JSON schema.
	for _, c := range []struct {
		path string
		req  map[string]any
		re   string
	}{
		{"/v1/completions", map[string]any{"prompt": prompts(1)[0], "max_tokens": 8, "temperature": 0, "structured_outputs": map[string]any{"regex": "(yes|no)[0-9]{2}"}}, `^(yes|no)[0-9]{2}$`},
		{"/v1/chat/completions", map[string]any{"messages": []map[string]string{{"role": "user", "content": "a color?"}}, "max_tokens": 40, "temperature": 0,
			"response_format": map[string]any{"type": "json_schema", "json_schema": map[string]any{"name": "c", "schema": map[string]any{
				"type": "object", "properties": map[string]any{"color": map[string]any{"enum": []string{"red", "green"}}}, "required": []string{"color"}}}}},
			`^\{\s*"color"\s*:\s*"(red|green)"\s*\}$`},
	} {
		// A completion's text or a chat's content, whichever came.
		var want, got struct {
			Choices []struct {
				Text    string                   `json:"text"`
				Message struct{ Content string } `json:"message"`
			} `json:"choices"`
		}
		direct.postJSON(t, c.path, c.req, &want)
		through.postJSON(t, c.path, c.req, &got)
		if len(want.Choices) != 1 || len(got.Choices) != 1 {
			t.Fatalf("%s: the server gave %+v, the node %+v", c.path, want, got)
		}
		w, g := want.Choices[0].Text+want.Choices[0].Message.Content, got.Choices[0].Text+got.Choices[0].Message.Content
		if g != w || !regexp.MustCompile(c.re).MatchString(g) {
			t.Errorf("%s: through the node %q, the server's %q; want both to match %s", c.path, g, w, c.re)
		}
	}
}
