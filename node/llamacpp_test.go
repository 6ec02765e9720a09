//go:build llamacpp

package node_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/dpnode/dpnode/engine/llamacpp"
	"github.com/dpnode/dpnode/engine/llamacpp/llamacpptest"
	"github.com/dpnode/dpnode/engine/llamacpp/sampling"
	"github.com/dpnode/dpnode/engines/llamaengine"
	"github.com/dpnode/dpnode/node"
)

// llamaNode is an in-process node serving the test model with the
// llama.cpp engine.
type llamaNode struct {
	run  *node.Running
	base string
	http *http.Client
}

func startLlamaNode(t *testing.T, mutate ...func(*node.Options)) *llamaNode {
	t.Helper()
	llamacpptest.Worker(t)
	o := node.DefaultOptions()
	o.Host, o.Port = "127.0.0.1", 0
	o.Bind, o.RPCPort = "127.0.0.1:0", 0
	o.Engine = "llamacpp"
	o.Model = llamacpptest.Model(t)
	llamaengine.Of(o.Engines).Threads = 1
	o.MaxNumSeqs = 64
	llamaengine.Of(o.Engines).KVCacheMemory = "32MiB"
	o.GPUs = 2
	o.DrainTimeout = 10 * time.Second
	o.Logger = slog.New(slog.DiscardHandler)
	for _, f := range mutate {
		f(&o)
	}
	run, err := node.Start(o)
	if err != nil {
		t.Fatal(err)
	}
	n := &llamaNode{run: run, base: "http://" + run.Addr(), http: &http.Client{Transport: &http.Transport{}}}
	liveNodes.Add(1)
	t.Cleanup(func() {
		n.http.CloseIdleConnections()
		if err := run.Shutdown(); err != nil {
			t.Error(err)
		}
		if liveNodes.Add(-1) == 0 {
			if pids := workersOf(os.Getpid(), ""); len(pids) > 0 {
				t.Errorf("workers still running after every node stopped: %v", pids)
			}
		}
	})
	return n
}

// sdkErr is err as the OpenAI SDK reports it, with the server's answer,
// which the SDK's message leaves out.
func sdkErr(err error) string {
	var apiErr *openai.Error
	if errors.As(err, &apiErr) {
		return fmt.Sprintf("%v: %s", err, apiErr.RawJSON())
	}
	return fmt.Sprint(err)
}

// liveNodes counts the nodes of this process, whose workers may run.
var liveNodes atomic.Int32

type completion struct {
	Choices []struct {
		Text         string   `json:"text"`
		TokenIDs     []uint32 `json:"token_ids"`
		FinishReason string   `json:"finish_reason"`
		Logprobs     *struct {
			TokenLogprobs []*float64 `json:"token_logprobs"`
		} `json:"logprobs"`
	} `json:"choices"`
	Usage struct {
		PromptTokens        int `json:"prompt_tokens"`
		CompletionTokens    int `json:"completion_tokens"`
		PromptTokensDetails struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	} `json:"usage"`
}

// greedy asks for prompt's greedy continuation, maxTokens long past end
// tokens, and returns its token ids and cached prompt tokens.
func (n *llamaNode) greedy(t *testing.T, prompt []uint32, maxTokens int) ([]uint32, int) {
	t.Helper()
	return n.sample(t, prompt, maxTokens, nil)
}

// sample is greedy with more of the request's fields, which may change the
// temperature.
func (n *llamaNode) sample(t *testing.T, prompt []uint32, maxTokens int, fields map[string]any) ([]uint32, int) {
	t.Helper()
	req := map[string]any{"prompt": prompt, "max_tokens": maxTokens, "temperature": 0, "ignore_eos": true, "return_token_ids": true}
	maps.Copy(req, fields)
	body, _ := json.Marshal(req)
	resp, err := n.http.Post(n.base+"/v1/completions", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Error(err)
		return nil, 0
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var c completion
	if resp.StatusCode != http.StatusOK || json.Unmarshal(b, &c) != nil || len(c.Choices) != 1 {
		t.Errorf("completion: %d %s", resp.StatusCode, b)
		return nil, 0
	}
	return c.Choices[0].TokenIDs, c.Usage.PromptTokensDetails.CachedTokens
}

func (n *llamaNode) metric(t *testing.T, name string) float64 {
	t.Helper()
	resp, err := n.http.Get(n.base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sum := 0.0
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, name+"{") || strings.HasPrefix(line, name+" ") {
			f := strings.Fields(line)
			v, _ := strconv.ParseFloat(f[len(f)-1], 64)
			sum += v
		}
	}
	return sum
}

// prompts are token-id prompts of Llama 3's vocabulary, of lengths from
// 5 to 300, that share nothing but the BOS token.
func prompts(n int) [][]uint32 {
	var out [][]uint32
	for i := range n {
		p := []uint32{128000}
		for j := range 4 + (i*37)%296 {
			p = append(p, uint32(300+(i*7919+j*104729)%100000))
		}
		out = append(out, p)
	}
	return out
}

// workersOf lists the model workers whose parent is ppid and whose role
// starts with role.
func workersOf(ppid int, role string) []int {
	entries, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		f := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
		if len(f) < 2 || f[1] != strconv.Itoa(ppid) || f[0] == "Z" {
			continue
		}
		env, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "environ"))
		if bytes.Contains(env, []byte(llamacpp.WorkerRoleEnv+"="+role)) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// TestLlamaCppServesOpenAIClients is the OpenAI Go SDK against a node
// that serves the test model: completions, chat, and chat streamed with
// usage.
func TestLlamaCppServesOpenAIClients(t *testing.T) {
	n := startLlamaNode(t)
	client := openai.NewClient(option.WithBaseURL(n.base+"/v1"), option.WithAPIKey("none"), option.WithHTTPClient(n.http), option.WithMaxRetries(0))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	models, err := client.Models.List(ctx)
	if err != nil || len(models.Data) != 1 || models.Data[0].ID != llamacpptest.Model(t) {
		t.Fatalf("models: %+v %v", models, err)
	}
	comp, err := client.Completions.New(ctx, openai.CompletionNewParams{
		Model:       openai.CompletionNewParamsModel(models.Data[0].ID),
		Prompt:      openai.CompletionNewParamsPromptUnion{OfString: openai.String("Hello world, this is a test")},
		MaxTokens:   openai.Int(12),
		Temperature: openai.Float(0),
	}, option.WithJSONSet("ignore_eos", true))
	if err != nil || comp.Choices[0].Text == "" || comp.Choices[0].FinishReason != "length" || comp.Usage.CompletionTokens != 12 || comp.Usage.PromptTokens != 8 {
		t.Fatalf("completion: %+v %v", comp, err)
	}
	// A text prompt is the token-id prompt its tokenizer gives, with BOS.
	ids, _ := n.greedy(t, []uint32{128000, 9906, 1917, 11, 420, 374, 264, 1296}, 12)
	if want := llamacpptest.Greedy(t, llamacpptest.Model(t), "f32", 12, [][]uint32{{128000, 9906, 1917, 11, 420, 374, 264, 1296}})[0]; !slices.Equal(ids, want) {
		t.Fatalf("token ids %v, llama.cpp %v", ids, want)
	}

	chat, err := client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
		Model:     openai.ChatModel(models.Data[0].ID),
		Messages:  []openai.ChatCompletionMessageParamUnion{openai.SystemMessage("Be brief."), openai.UserMessage("Hello")},
		MaxTokens: openai.Int(10),
	}, option.WithJSONSet("ignore_eos", true))
	if err != nil || chat.Choices[0].Message.Content == "" || chat.Usage.CompletionTokens != 10 {
		t.Fatalf("chat: %+v %v", chat, err)
	}
	// The Llama 3.1 template writes a system header with dates.
	if chat.Usage.PromptTokens < 30 {
		t.Fatalf("the chat prompt has %d tokens; the model's template was not rendered", chat.Usage.PromptTokens)
	}

	// vLLM's /tokenize counts as the model's tokenizer does: the same
	// ids, BOS first unless asked not to, and a chat as the chat's usage.
	tokenize := func(body string) []uint32 {
		t.Helper()
		resp, err := n.http.Post(n.base+"/tokenize", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var tk struct {
			Count  int      `json:"count"`
			Tokens []uint32 `json:"tokens"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&tk); err != nil || resp.StatusCode != 200 || tk.Count != len(tk.Tokens) {
			t.Fatalf("/tokenize %s: %d %+v %v", body, resp.StatusCode, tk, err)
		}
		return tk.Tokens
	}
	if got := tokenize(`{"prompt":"Hello world, this is a test"}`); !slices.Equal(got, []uint32{128000, 9906, 1917, 11, 420, 374, 264, 1296}) {
		t.Fatalf("/tokenize: %v", got)
	}
	if got := tokenize(`{"prompt":"Hello world, this is a test","add_special_tokens":false}`); !slices.Equal(got, []uint32{9906, 1917, 11, 420, 374, 264, 1296}) {
		t.Fatalf("/tokenize without special tokens: %v", got)
	}
	if got := tokenize(`{"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Hello"}]}`); len(got) != int(chat.Usage.PromptTokens) {
		t.Fatalf("/tokenize counts %d tokens of the chat, its usage %d", len(got), chat.Usage.PromptTokens)
	}
	resp, err := n.http.Post(n.base+"/detokenize", "application/json", strings.NewReader(`{"tokens":[128000,9906,1917,11,420,374,264,1296]}`))
	if err != nil {
		t.Fatal(err)
	}
	var detok struct {
		Prompt string `json:"prompt"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&detok); err != nil || detok.Prompt != "Hello world, this is a test" {
		t.Fatalf("/detokenize: %q %v", detok.Prompt, err)
	}
	resp.Body.Close()
	// A field the engine does not apply is refused by name.
	_, err = client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
		Model:            openai.ChatModel(models.Data[0].ID),
		Messages:         []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Hello")},
		Verbosity:        openai.ChatCompletionNewParamsVerbosityLow,
		FrequencyPenalty: openai.Float(0),
	})
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 400 || apiErr.Param != "verbosity" {
		t.Fatalf("verbosity: %v", err)
	}

	stream := client.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{
		Model:         openai.ChatModel(models.Data[0].ID),
		Messages:      []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Tell me a story")},
		MaxTokens:     openai.Int(20),
		StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)},
	}, option.WithJSONSet("ignore_eos", true))
	var text strings.Builder
	var usage openai.CompletionUsage
	finish := ""
	for stream.Next() {
		c := stream.Current()
		for _, ch := range c.Choices {
			text.WriteString(ch.Delta.Content)
			if ch.FinishReason != "" {
				finish = ch.FinishReason
			}
		}
		if c.Usage.TotalTokens > 0 {
			usage = c.Usage
		}
	}
	if err := stream.Err(); err != nil || text.Len() == 0 || finish != "length" || usage.CompletionTokens != 20 {
		t.Fatalf("streamed chat: %q finish %q usage %+v err %v", text.String(), finish, usage, err)
	}
}

// TestLlamaCppGreedyIsLlamaCpps compares dpnode's greedy continuations of
// token-id prompts, served concurrently on two ranks, with llama.cpp's own
// single-sequence ones.
func TestLlamaCppGreedyIsLlamaCpps(t *testing.T) {
	n := startLlamaNode(t)
	ps := prompts(32)
	want := llamacpptest.Greedy(t, llamacpptest.Model(t), "f32", 24, ps)
	got := make([][]uint32, len(ps))
	var wg sync.WaitGroup
	for i, p := range ps {
		wg.Go(func() { got[i], _ = n.greedy(t, p, 24) })
	}
	wg.Wait()
	for i := range ps {
		if !slices.Equal(got[i], want[i]) {
			t.Errorf("prompt %d (%d tokens), in a batch of %d:\n dpnode %v\nllama.cpp %v", i, len(ps[i]), len(ps), got[i], want[i])
		}
	}
}

// TestLlamaCppOutputDoesNotDependOnHowItIsServed serves one prompt alone,
// among 31 others, in chunks, from the prefix cache, in a KV cache that
// holds one sequence at a time, and after its worker is killed
// mid-stream: it is the same every time, and llama.cpp's own.
func TestLlamaCppOutputDoesNotDependOnHowItIsServed(t *testing.T) {
	ps := prompts(32)
	target := ps[5]
	want := llamacpptest.Greedy(t, llamacpptest.Model(t), "f32", 64, ps)

	t.Run("alone, then from the prefix cache", func(t *testing.T) {
		n := startLlamaNode(t)
		got, cached := n.greedy(t, target, 64)
		if !slices.Equal(got, want[5]) || cached != 0 {
			t.Fatalf("alone: %v (cached %d)\nwant %v", got, cached, want[5])
		}
		got, cached = n.greedy(t, target, 64)
		if !slices.Equal(got, want[5]) || cached == 0 {
			t.Fatalf("after a prefix hit of %d tokens: %v\nwant %v", cached, got, want[5])
		}
	})
	t.Run("in chunks of 16 tokens", func(t *testing.T) {
		n := startLlamaNode(t, func(o *node.Options) { o.MaxNumBatchedTokens, o.MaxNumSeqs = 16, 16 })
		if got, _ := n.greedy(t, target, 64); !slices.Equal(got, want[5]) {
			t.Fatalf("chunked: %v\nwant %v", got, want[5])
		}
	})
	t.Run("one sequence at a time", func(t *testing.T) {
		// Room for one stream of 512 tokens: the 32 requests take turns
		// on it, each reusing the cells the one before gave back.
		n := startLlamaNode(t, func(o *node.Options) {
			llamaengine.Of(o.Engines).KVCacheMemory, o.MaxModelLen, o.GPUs = "400KiB", 512, 1
		})
		got := make([][]uint32, len(ps))
		var wg sync.WaitGroup
		for i, p := range ps {
			wg.Go(func() { got[i], _ = n.greedy(t, p, 64) })
		}
		wg.Wait()
		for i := range ps {
			if !slices.Equal(got[i], want[i]) {
				t.Errorf("prompt %d, taking turns:\n dpnode %v\nllama.cpp %v", i, got[i], want[i])
			}
		}
	})
	t.Run("its worker killed mid-stream", func(t *testing.T) {
		n := startLlamaNode(t)
		results := n.streamAcrossAKill(t, 8, func(i int) ([]uint32, int, map[string]any) { return ps[i], 64, nil }, 1)
		for i, r := range results {
			if r.err != nil || !slices.Equal(r.ids, want[i]) {
				t.Errorf("stream %d across a killed worker: %v\n dpnode %v\nllama.cpp %v", i, r.err, r.ids, want[i])
			}
		}
		if moved := n.metric(t, "dpnode_requests_migrated_total"); moved == 0 {
			t.Fatal("no stream was migrated off the killed worker's rank")
		}
		if restarts := n.metric(t, "dpnode_engine_restarts_total"); restarts != 1 {
			t.Fatalf("%v engine restarts, want 1", restarts)
		}
	})
}

// TestLlamaCppDrawsAreVLLMsOnLlamaCppLogits: every token a request draws
// with temperature, top-k, top-p, min-p, the three penalties and a logit
// bias is the one the reference (sampling.Reference, vLLM's order stated
// densely) draws with the same per-token seed from llama.cpp's own logits
// for the prompt and the tokens before it, from the reference program.
func TestLlamaCppDrawsAreVLLMsOnLlamaCppLogits(t *testing.T) {
	n := startLlamaNode(t, func(o *node.Options) { o.GPUs = 1 })
	ps := prompts(4)
	const maxTokens = 16
	for i, c := range []struct {
		fields map[string]any
		p      sampling.Params
	}{
		{map[string]any{"temperature": 0.8, "top_k": 40}, sampling.Params{Temperature: 0.8, TopK: 40}},
		{map[string]any{"temperature": 1.0, "top_p": 0.9, "min_p": 0.02}, sampling.Params{Temperature: 1, TopP: 0.9, MinP: 0.02}},
		{map[string]any{"temperature": 0.7, "presence_penalty": 0.5, "frequency_penalty": 1.2, "repetition_penalty": 1.3},
			sampling.Params{Temperature: 0.7, Presence: 0.5, Frequency: 1.2, Repetition: 1.3}},
		{map[string]any{"temperature": 0, "repetition_penalty": 0.8, "frequency_penalty": -1, "logit_bias": map[string]float64{"1296": 3}},
			sampling.Params{Repetition: 0.8, Frequency: -1, LogitBias: []sampling.Bias{{Token: 1296, Value: 3}}}},
	} {
		seed := int64(100 + i)
		fields := maps.Clone(c.fields)
		fields["seed"] = seed
		prompt := ps[i]
		got, _ := n.sample(t, prompt, maxTokens, fields)
		if len(got) != maxTokens {
			t.Fatalf("case %d: %d tokens", i, len(got))
		}
		rows := llamacpptest.Logits(t, llamacpptest.Model(t), "f32", prompt, got)
		var prompt32, got32 []int32
		for _, id := range prompt {
			prompt32 = append(prompt32, int32(id))
		}
		for _, id := range got {
			got32 = append(got32, int32(id))
		}
		s := sampling.NewSampler(len(rows[0]))
		for j, row := range rows {
			ref := sampling.Reference(row, c.p, prompt32, got32[:j])
			want := s.Sample(ref, &sampling.Params{Temperature: c.p.Temperature, TopK: c.p.TopK, TopP: c.p.TopP,
				Seed: llamacpp.SampleSeed(uint64(seed), j)})
			if uint32(want) != got[j] {
				t.Fatalf("case %d (%v), token %d: drew %d, the reference %d from llama.cpp's logits (output %v)", i, c.fields, j, got[j], want, got)
			}
		}
	}
}

// TestLlamaCppPenaltiesFollowTheRequest: penalties, min_p and a logit
// bias take effect, and a request drawn with them is the same alone, in a
// batch, and when its worker is killed halfway and it moves to the other
// rank with the tokens it has so far, which its penalties go on counting.
func TestLlamaCppPenaltiesFollowTheRequest(t *testing.T) {
	n := startLlamaNode(t)
	ps := prompts(8)
	// Greedy, where the penalties alone can change the token, and drawn,
	// with min_p too. The greedy ones reward repeats, so each token depends
	// on the whole output so far, the part drawn on the killed rank too.
	penalized := map[string]any{"frequency_penalty": -1, "presence_penalty": -0.5, "repetition_penalty": 0.8}
	drawn := map[string]any{"temperature": 0.8, "seed": 11, "frequency_penalty": 1.5, "presence_penalty": 0.5,
		"repetition_penalty": 1.3, "min_p": 0.05}
	fields := func(i int) map[string]any { return [](map[string]any){penalized, drawn}[i%2] }
	// Alone: each request's reference.
	alone := make([][]uint32, 2*len(ps))
	changed := 0
	for i := range alone {
		p := ps[i/2]
		alone[i], _ = n.sample(t, p, 48, fields(i))
		if without, _ := n.sample(t, p, 48, nil); i%2 == 0 && !slices.Equal(without, alone[i]) {
			changed++
		}
	}
	if changed == 0 {
		t.Fatal("the penalties changed no greedy continuation")
	}
	// A bias of 100 makes its token the only one drawn, greedy or not.
	for _, temp := range []float64{0, 1} {
		if got, _ := n.sample(t, ps[0], 8, map[string]any{"temperature": temp, "logit_bias": map[string]float64{"1296": 100}}); !slices.Equal(got, slices.Repeat([]uint32{1296}, 8)) {
			t.Fatalf("temperature %v, biased to 1296: %v", temp, got)
		}
	}
	results := n.streamAcrossAKill(t, len(alone), func(i int) ([]uint32, int, map[string]any) { return ps[i/2], 48, fields(i) }, 24)
	for i, r := range results {
		if r.err != nil || !slices.Equal(r.ids, alone[i]) {
			t.Errorf("stream %d, in a batch across a killed worker: %v\n    %v\nalone %v", i, r.err, r.ids, alone[i])
		}
	}
	if moved := n.metric(t, "dpnode_requests_migrated_total"); moved == 0 {
		t.Fatal("no stream was migrated off the killed worker's rank")
	}
}

// TestLlamaCppSharedPrefixIsComputedOnce sends a 2,000-token prompt, then
// another that shares it: the node's workers compute only the second's
// own tokens (dpnode_engine_computed_tokens_total), and the prefix cache
// counts the reuse.
func TestLlamaCppSharedPrefixIsComputedOnce(t *testing.T) {
	n := startLlamaNode(t, func(o *node.Options) { o.GPUs = 1 })
	prefix := prompts(1)[0][:1]
	for j := range 1999 {
		prefix = append(prefix, uint32(1000+(j*7)%5000))
	}
	if _, cached := n.greedy(t, append(slices.Clone(prefix), 11, 12, 13), 4); cached != 0 {
		t.Fatalf("the first request found %d cached tokens", cached)
	}
	computedBefore := n.metric(t, "dpnode_engine_computed_tokens_total")
	hitsBefore := n.metric(t, "vllm:prefix_cache_hits_total")
	got, cached := n.greedy(t, append(slices.Clone(prefix), 21, 22), 4)
	want := llamacpptest.Greedy(t, llamacpptest.Model(t), "f32", 4, [][]uint32{append(slices.Clone(prefix), 21, 22)})[0]
	if !slices.Equal(got, want) || cached != 2000 {
		t.Fatalf("second request: %v (cached %d), want %v and 2000 cached", got, cached, want)
	}
	// Stats reach /metrics with the engine's next report.
	deadline := time.Now().Add(5 * time.Second)
	for n.metric(t, "dpnode_engine_computed_tokens_total")-computedBefore < 5 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if computed := n.metric(t, "dpnode_engine_computed_tokens_total") - computedBefore; computed != 2+3 {
		t.Fatalf("the second request computed %v tokens, want 5 (2 of prompt, 3 decodes)", computed)
	}
	if hits := n.metric(t, "vllm:prefix_cache_hits_total") - hitsBefore; hits != 2000 {
		t.Fatalf("prefix cache hits rose by %v, want 2000", hits)
	}
}

// TestLlamaCppFlagsAndModelsItCannotServe: what the engine refuses, it
// refuses before serving, with a clear error.
func TestLlamaCppFlagsAndModelsItCannotServe(t *testing.T) {
	cases := []struct {
		name   string
		mutate func(*node.Options)
		want   string
	}{
		{"expert parallelism", func(o *node.Options) { o.ExpertParallel = true }, "llama.cpp has no expert-parallel API"},
		{"no model", func(o *node.Options) { o.Model = "" }, "needs --model"},
		{"missing model", func(o *node.Options) { o.Model = "/nonexistent/model.gguf" }, "/nonexistent/model.gguf"},
		{"context over the model's", func(o *node.Options) { o.MaxModelLen = 100000 }, "longer than the context"},
		{"KV cache too small", func(o *node.Options) { llamaengine.Of(o.Engines).KVCacheMemory = "64KiB" }, "less than one sequence"},
		{"bad size", func(o *node.Options) { llamaengine.Of(o.Engines).KVCacheMemory = "lots" }, "not a size in bytes"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			o := node.DefaultOptions()
			o.Host, o.Port, o.Bind, o.RPCPort = "127.0.0.1", 0, "127.0.0.1:0", 0
			o.Engine, o.Model, llamaengine.Of(o.Engines).Threads, o.GPUs = "llamacpp", llamacpptest.Model(t), 1, 1
			o.Logger = slog.New(slog.DiscardHandler)
			c.mutate(&o)
			run, err := node.Start(o)
			if err == nil {
				run.Shutdown()
				t.Fatalf("started; want an error containing %q", c.want)
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %q; want it to contain %q", err, c.want)
			}
		})
	}
}

// TestLlamaCppChatTemplates: a model without a chat template refuses
// chat with a 400 that says what to do, and --chat-template gives it one.
func TestLlamaCppChatTemplates(t *testing.T) {
	cfg := llamacpp.DefaultTestModel()
	cfg.Vocab = llamacpptest.Vocab(t, "llama-bpe")
	path := filepath.Join(t.TempDir(), "no-template.gguf")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := llamacpp.WriteTestModel(f, cfg); err != nil {
		t.Fatal(err)
	}
	f.Close()
	chat := func(n *llamaNode) (int, string) {
		resp, err := n.http.Post(n.base+"/v1/chat/completions", "application/json",
			strings.NewReader(`{"messages":[{"role":"user","content":"Hi"}],"max_tokens":2}`))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	n := startLlamaNode(t, func(o *node.Options) { o.Model, o.GPUs = path, 1 })
	if code, body := chat(n); code != http.StatusBadRequest || !strings.Contains(body, "--chat-template") {
		t.Fatalf("chat without a template: %d %s", code, body)
	}
	// One node with an actor transport at a time in a process: each start
	// sets gRPC's global logger (protoactor's remote.Start), which a live
	// node's gRPC goroutines read unsynchronized.
	if err := n.run.Shutdown(); err != nil {
		t.Fatal(err)
	}
	tmpl := filepath.Join(t.TempDir(), "chatml.jinja")
	if err := os.WriteFile(tmpl, []byte(llamacpptest.Template(t, "Qwen-Qwen2.5-7B-Instruct")), 0o644); err != nil {
		t.Fatal(err)
	}
	n = startLlamaNode(t, func(o *node.Options) { o.Model, o.GPUs, o.ChatTemplate = path, 1, tmpl })
	if code, body := chat(n); code != http.StatusOK {
		t.Fatalf("chat with --chat-template: %d %s", code, body)
	}
}

// TestLlamaCppInternalModeAcrossProcesses runs an API node with no ranks
// of its own (it loads the model's tokenizer only) and a headless node
// with two, as separate processes: requests cross the actor transport to
// the ranks, and their greedy text is llama.cpp's.
func TestLlamaCppInternalModeAcrossProcesses(t *testing.T) {
	model := llamacpptest.Model(t)
	t.Setenv(llamacpp.WorkerEnv, llamacpptest.Worker(t))
	engine := []string{"--engine", "llamacpp", "--model", model, "--threads", "1", "--kv-cache-memory-bytes", "16MiB", "--max-num-seqs", "16"}
	a := startProc(t, "127.0.0.91", nodeArgs("127.0.0.91", append([]string{"--host", "127.0.0.91", "--port", "0",
		"--data-parallel-lb", "internal", "--data-parallel-size", "2", "--data-parallel-size-local", "0"}, engine...)...)...)
	b := startProc(t, "127.0.0.92", nodeArgs("127.0.0.92", append([]string{"--headless", "--data-parallel-size", "2",
		"--data-parallel-size-local", "2", "--seeds", "127.0.0.91:7946"}, engine...)...)...)
	// Each rank said how its model's load went, before the node served.
	for rank := range 2 {
		for _, line := range []string{`msg="loading the model" rank=%d component=llama.cpp progress=100%%`,
			`msg="model loaded" rank=%d .*kv_cache_cells=\d+ kv_cache_bytes=\d+`, `msg="rank ready" rank=%d .*took=\S+ kv_cache_tokens=\d+`} {
			if found, _ := b.logs.find(regexp.MustCompile(fmt.Sprintf(line, rank)), 0); found == "" {
				t.Errorf("no line %q in the headless node's log", fmt.Sprintf(line, rank))
			}
		}
	}
	a.waitView("the API node balances over both remote ranks", 60*time.Second, func(v clusterView) bool {
		ready := 0
		for _, r := range v.Ranks {
			if r.Balanced && r.Ready && !r.Local {
				ready++
			}
		}
		return ready == 2
	})
	if n := len(workersOf(a.cmd.Process.Pid, "rank-")); n != 0 {
		t.Fatalf("the API node runs %d model workers; it has no ranks", n)
	}
	if n := len(workersOf(a.cmd.Process.Pid, "tokenizer")); n != 1 {
		t.Fatalf("the API node runs %d tokenizer workers, want 1", n)
	}
	n := &llamaNode{base: a.url, http: &http.Client{}}
	ps := prompts(8)
	want := llamacpptest.Greedy(t, model, "f32", 16, ps)
	var wg sync.WaitGroup
	for i, p := range ps {
		wg.Go(func() {
			if got, _ := n.greedy(t, p, 16); !slices.Equal(got, want[i]) {
				t.Errorf("prompt %d through the remote ranks: %v, want %v", i, got, want[i])
			}
		})
	}
	wg.Wait()
}

// postJSON posts body to path with headers (name, value pairs) and decodes
// a 200's answer into out.
func (n *llamaNode) postJSON(t *testing.T, path string, body map[string]any, out any, headers ...string) {
	t.Helper()
	if err := n.tryPostJSON(path, body, out, headers...); err != nil {
		t.Fatal(err)
	}
}

// post posts body to path and returns the status and the answer, whatever
// they are.
func (n *llamaNode) post(t *testing.T, path string, body map[string]any) (int, []byte) {
	t.Helper()
	b, _ := json.Marshal(body)
	resp, err := n.http.Post(n.base+path, "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, raw
}

// tryPostJSON is postJSON for a goroutine of its own: it returns what went
// wrong.
func (n *llamaNode) tryPostJSON(path string, body map[string]any, out any, headers ...string) error {
	b, _ := json.Marshal(body)
	req, _ := http.NewRequest(http.MethodPost, n.base+path, bytes.NewReader(b))
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := n.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || json.Unmarshal(raw, out) != nil {
		return fmt.Errorf("%s: %d %s", path, resp.StatusCode, raw)
	}
	return nil
}

// TestLlamaCppSpecialTokensKeptOnRequest: a special token (Llama 3's
// <|eot_id|>, forced by a logit bias past ignore_eos) is left out of the
// text by default and written as its text with skip_special_tokens false,
// the way /tokenize reads it back.
func TestLlamaCppSpecialTokensKeptOnRequest(t *testing.T) {
	n := startLlamaNode(t)
	text := func(skip bool) string {
		var c completion
		n.postJSON(t, "/v1/completions", map[string]any{"prompt": "Hello", "max_tokens": 3, "temperature": 0, "ignore_eos": true,
			"logit_bias": map[string]float64{"128009": 100}, "skip_special_tokens": skip}, &c)
		return c.Choices[0].Text
	}
	if got := text(true); got != "" {
		t.Fatalf("special tokens skipped: %q", got)
	}
	kept := text(false)
	if kept != "<|eot_id|><|eot_id|><|eot_id|>" {
		t.Fatalf("special tokens kept: %q", kept)
	}
	var tk struct {
		Tokens []uint32 `json:"tokens"`
	}
	n.postJSON(t, "/tokenize", map[string]any{"prompt": kept, "add_special_tokens": false}, &tk)
	if !slices.Equal(tk.Tokens, []uint32{128009, 128009, 128009}) {
		t.Fatalf("%q tokenizes as %v", kept, tk.Tokens)
	}
}
