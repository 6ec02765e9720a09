package httpapi_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"go.uber.org/goleak"

	"github.com/dpnode/dpnode/engine/sim"
	"github.com/dpnode/dpnode/engines/simengine"
	"github.com/dpnode/dpnode/node"
)

const (
	apiKey = "test-key"
	model  = "meta-llama/Llama-3.1-8B-Instruct"
)

func TestMain(m *testing.M) {
	// protoactor's dead-letter throttle lives on for its one-second period
	// after the system stops.
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/asynkron/protoactor-go/actor.NewThrottle.func1.1"),
		goleak.IgnoreAnyFunction("github.com/asynkron/protoactor-go/actor.NewDeadLetter.NewThrottle.func4.1"))
}

type testServer struct {
	run    *node.Running
	base   string
	http   *http.Client
	client openai.Client
}

// startServer runs a whole node in process on a loopback port: two ranks
// of the simulated 8B profile at timeScale.
func startServer(t testing.TB, timeScale float64, mutate ...func(*node.Options)) *testServer {
	t.Helper()
	o := node.DefaultOptions()
	o.Host, o.Port = "127.0.0.1", 0
	o.Bind, o.RPCPort = "127.0.0.1:0", 0
	simengine.Of(o.Engines).TimeScale = timeScale
	o.APIKeys = []string{apiKey}
	o.DrainTimeout = 10 * time.Second
	o.Logger = slog.New(slog.DiscardHandler)
	for _, f := range mutate {
		f(&o)
	}
	run, err := node.Start(o)
	if err != nil {
		t.Fatal(err)
	}
	ts := &testServer{run: run, base: "http://" + run.Addr(), http: &http.Client{Transport: &http.Transport{}}}
	ts.client = openai.NewClient(option.WithBaseURL(ts.base+"/v1"), option.WithAPIKey(apiKey), option.WithHTTPClient(ts.http), option.WithMaxRetries(0))
	t.Cleanup(func() {
		ts.http.CloseIdleConnections()
		if err := run.Shutdown(); err != nil {
			t.Error(err)
		}
	})
	return ts
}

// post sends a raw JSON body and returns the status and body.
func (ts *testServer) post(t *testing.T, path, body string, header map[string]string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, ts.base+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+apiKey)
	req.Header.Set("Content-Type", "application/json")
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := ts.http.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, b
}

func (ts *testServer) getJSON(t *testing.T, path string, v any) int {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, ts.base+path, nil)
	req.Header.Set("Authorization", "Bearer "+apiKey)
	resp, err := ts.http.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	return resp.StatusCode
}

// metric returns the sum of a metric's series whose labels include all of
// want, read from /metrics.
func (ts *testServer) metric(t *testing.T, name string, want map[string]string) float64 {
	t.Helper()
	resp, err := ts.http.Get(ts.base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	total := 0.0
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		ok := true
		for k, v := range want {
			ok = ok && strings.Contains(line, fmt.Sprintf("%s=%q", k, v))
		}
		var val float64
		if ok {
			fmt.Sscan(line[strings.LastIndexByte(line, ' ')+1:], &val)
			total += val
		}
	}
	return total
}

// eventually polls cond until it holds or the deadline passes: for
// effects that happen in other goroutines after a call returns.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	within(t, 10*time.Second, what, cond)
}

// within waits for cond, for at most limit.
func within(t *testing.T, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %s", limit, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestOpenAIClient(t *testing.T) {
	ts := startServer(t, 0.01)
	ctx := context.Background()

	t.Run("models", func(t *testing.T) {
		page, err := ts.client.Models.List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(page.Data) != 1 || page.Data[0].ID != model {
			t.Fatalf("models %+v, want only %s", page.Data, model)
		}
	})

	t.Run("completion", func(t *testing.T) {
		c, err := ts.client.Completions.New(ctx, openai.CompletionNewParams{
			Model:     model,
			Prompt:    openai.CompletionNewParamsPromptUnion{OfString: openai.String("The cluster has four ranks and")},
			MaxTokens: openai.Int(12),
		})
		if err != nil {
			t.Fatal(err)
		}
		if len(c.Choices) != 1 || c.Choices[0].Text == "" || c.Usage.CompletionTokens != 12 || c.Usage.PromptTokens == 0 {
			t.Fatalf("completion %+v", c)
		}
		if c.Choices[0].FinishReason != "length" {
			t.Fatalf("finish reason %q, want length", c.Choices[0].FinishReason)
		}
	})

	params := openai.ChatCompletionNewParams{
		Model:     model,
		Messages:  []openai.ChatCompletionMessageParamUnion{openai.SystemMessage("You are terse."), openai.UserMessage("Explain data parallelism.")},
		MaxTokens: openai.Int(16),
	}
	var chatText string
	t.Run("chat", func(t *testing.T) {
		c, err := ts.client.Chat.Completions.New(ctx, params)
		if err != nil {
			t.Fatal(err)
		}
		if len(c.Choices) != 1 || c.Choices[0].Message.Content == "" || c.Usage.CompletionTokens == 0 {
			t.Fatalf("chat %+v", c)
		}
		chatText = c.Choices[0].Message.Content
	})

	t.Run("chat streaming with usage", func(t *testing.T) {
		p := params
		p.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
		stream := ts.client.Chat.Completions.NewStreaming(ctx, p)
		var acc openai.ChatCompletionAccumulator
		chunks := 0
		for stream.Next() {
			acc.AddChunk(stream.Current())
			chunks++
		}
		if err := stream.Err(); err != nil {
			t.Fatal(err)
		}
		if chunks < 3 || len(acc.Choices) != 1 {
			t.Fatalf("%d chunks, %d choices", chunks, len(acc.Choices))
		}
		if got := acc.Choices[0].Message.Content; got != chatText {
			t.Fatalf("streamed %q, non-streamed %q: the same request must give the same text", got, chatText)
		}
		if acc.Usage.CompletionTokens == 0 || acc.Usage.TotalTokens != acc.Usage.PromptTokens+acc.Usage.CompletionTokens {
			t.Fatalf("usage %+v", acc.Usage)
		}
	})

	t.Run("completion streaming", func(t *testing.T) {
		stream := ts.client.Completions.NewStreaming(ctx, openai.CompletionNewParams{
			Model:     model,
			Prompt:    openai.CompletionNewParamsPromptUnion{OfString: openai.String("Once upon a time")},
			MaxTokens: openai.Int(8),
		})
		var text strings.Builder
		finish := ""
		for stream.Next() {
			for _, c := range stream.Current().Choices {
				text.WriteString(c.Text)
				if c.FinishReason != "" {
					finish = string(c.FinishReason)
				}
			}
		}
		if err := stream.Err(); err != nil {
			t.Fatal(err)
		}
		if text.Len() == 0 || finish != "length" {
			t.Fatalf("streamed %q, finish %q", text.String(), finish)
		}
	})

	t.Run("unknown model", func(t *testing.T) {
		_, err := ts.client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
			Model:    "no-such-model",
			Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")},
		})
		var apiErr *openai.Error
		if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusNotFound || apiErr.Code != "model_not_found" {
			t.Fatalf("error %v, want a 404 model_not_found", err)
		}
	})
}

func TestBadInputGetsOpenAIErrors(t *testing.T) {
	ts := startServer(t, 0.01, func(o *node.Options) { o.MaxModelLen = 4096 })
	good := `{"model":"` + model + `","messages":[{"role":"user","content":"hi"}],"max_tokens":3}`
	cases := []struct {
		name, path, body string
		header           map[string]string
		status           int
	}{
		{"malformed JSON", "/v1/chat/completions", `{"messages": [`, nil, 400},
		{"missing messages", "/v1/chat/completions", `{"model":"` + model + `"}`, nil, 400},
		{"negative max_tokens", "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"max_tokens":-1}`, nil, 400},
		{"wrong type", "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"max_tokens":"ten"}`, nil, 400},
		{"unknown role", "/v1/chat/completions", `{"messages":[{"role":"wizard","content":"hi"}]}`, nil, 400},
		{"stream options without stream", "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"stream_options":{"include_usage":true}}`, nil, 400},
		{"context too long", "/v1/completions", `{"prompt":"hello","max_tokens":5000}`, nil, 400},
		{"missing prompt", "/v1/completions", `{"model":"` + model + `"}`, nil, 400},
		{"empty prompt", "/v1/completions", `{"prompt":""}`, nil, 400},
		{"bad temperature", "/v1/completions", `{"prompt":"x","temperature":3}`, nil, 400},
		{"rank out of range", "/v1/completions", `{"prompt":"x","max_tokens":1}`, map[string]string{"X-data-parallel-rank": "7"}, 400},
		{"rank not a number", "/v1/completions", `{"prompt":"x","max_tokens":1}`, map[string]string{"X-data-parallel-rank": "one"}, 400},
		{"unknown model", "/v1/chat/completions", `{"model":"gpt-nothing","messages":[{"role":"user","content":"hi"}]}`, nil, 404},
		{"oversized body", "/v1/completions", `{"prompt":"` + strings.Repeat("a", 17<<20) + `"}`, nil, 413},
		{"wrong API key", "/v1/chat/completions", good, map[string]string{"Authorization": "Bearer wrong"}, 401},
		{"missing API key", "/v1/chat/completions", good, map[string]string{"Authorization": ""}, 401},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			status, body := ts.post(t, tc.path, tc.body, tc.header)
			var e struct {
				Error struct {
					Message string `json:"message"`
					Type    string `json:"type"`
				} `json:"error"`
			}
			if status != tc.status || json.Unmarshal(body, &e) != nil || e.Error.Message == "" || e.Error.Type == "" {
				t.Fatalf("status %d, body %.200s; want %d with an OpenAI error object", status, body, tc.status)
			}
			// The server keeps serving.
			if status, body := ts.post(t, "/v1/chat/completions", good, nil); status != 200 {
				t.Fatalf("after the bad request, a good one got %d: %s", status, body)
			}
		})
	}
}

func TestStopStringsTruncateStreamedAndNot(t *testing.T) {
	ts := startServer(t, 0)
	ctx := context.Background()
	base := openai.CompletionNewParams{
		Model:     model,
		Prompt:    openai.CompletionNewParamsPromptUnion{OfString: openai.String("Tell me a story about GPUs")},
		MaxTokens: openai.Int(40),
	}
	full, err := ts.client.Completions.New(ctx, base)
	if err != nil {
		t.Fatal(err)
	}
	text := full.Choices[0].Text
	words := strings.Fields(text)
	if len(words) < 10 {
		t.Fatalf("too short to pick a stop string: %q", text)
	}
	stop := " " + words[6] + " " + words[7]
	want := text[:strings.Index(text, stop)]

	p := base
	p.Stop = openai.CompletionNewParamsStopUnion{OfStringArray: []string{"never appears", stop}}
	got, err := ts.client.Completions.New(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	if got.Choices[0].Text != want || got.Choices[0].FinishReason != "stop" {
		t.Fatalf("with stop %q: %q (%s); want %q (stop)", stop, got.Choices[0].Text, got.Choices[0].FinishReason, want)
	}
	stream := ts.client.Completions.NewStreaming(ctx, p)
	var streamed strings.Builder
	for stream.Next() {
		for _, c := range stream.Current().Choices {
			streamed.WriteString(c.Text)
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if streamed.String() != want {
		t.Fatalf("streamed with stop %q: %q; want %q", stop, streamed.String(), want)
	}
}

func TestSeveralPromptsAndChoices(t *testing.T) {
	ts := startServer(t, 0)
	status, body := ts.post(t, "/v1/completions", `{"prompt":["first prompt","second prompt"],"n":2,"max_tokens":4,"echo":true}`, nil)
	if status != 200 {
		t.Fatalf("%d: %s", status, body)
	}
	var resp struct {
		Choices []struct {
			Index int    `json:"index"`
			Text  string `json:"text"`
		} `json:"choices"`
		Usage struct {
			CompletionTokens int `json:"completion_tokens"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(body, &resp); err != nil {
		t.Fatal(err)
	}
	if len(resp.Choices) != 4 || resp.Usage.CompletionTokens != 16 {
		t.Fatalf("%d choices, %d completion tokens; want 4 and 16", len(resp.Choices), resp.Usage.CompletionTokens)
	}
	for i, c := range resp.Choices {
		prefix := []string{"first prompt", "second prompt"}[i/2]
		if c.Index != i || !strings.HasPrefix(c.Text, prefix) || len(c.Text) == len(prefix) {
			t.Fatalf("choice %d: %q; want the echoed prompt %q and more", i, c.Text, prefix)
		}
	}
	if resp.Choices[0].Text == resp.Choices[1].Text {
		t.Fatal("two samples of one prompt are identical")
	}
}

func TestPinnedRankAndBalance(t *testing.T) {
	// Steps of a few modelled milliseconds: at a hundredth of that, a
	// step is all CPU, and on a starved machine the rank whose engine
	// gets less of it rightly gets fewer requests, whatever the policy.
	ts := startServer(t, 0.2)
	for range 5 {
		if status, body := ts.post(t, "/v1/completions", `{"prompt":"pinned","max_tokens":2}`, map[string]string{"X-data-parallel-rank": "1"}); status != 200 {
			t.Fatalf("%d: %s", status, body)
		}
	}
	if got := ts.metric(t, "vllm:request_success_total", map[string]string{"engine": "1"}); got != 5 {
		t.Fatalf("rank 1 served %v pinned requests, want 5", got)
	}

	// vLLM's balance check: a burst of 200 requests, each rank serving
	// more than total/3.
	const n = 200
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Go(func() {
			_, err := ts.client.Completions.New(context.Background(), openai.CompletionNewParams{
				Model:     model,
				Prompt:    openai.CompletionNewParamsPromptUnion{OfString: openai.String(fmt.Sprintf("burst request %d", i))},
				MaxTokens: openai.Int(5),
			})
			if err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for rank, pinned := range []float64{0, 5} {
		got := ts.metric(t, "vllm:request_success_total", map[string]string{"engine": fmt.Sprint(rank)}) - pinned
		if got <= n/3 {
			t.Errorf("rank %d served %v of %d; want more than %d", rank, got, n, n/3)
		}
	}
}

func TestDisconnectAbortsInTheEngine(t *testing.T) {
	// Real-time steps: the request is still generating when the client
	// goes.
	ts := startServer(t, 1)
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, ts.base+"/v1/completions",
		strings.NewReader(`{"prompt":"a long story","max_tokens":20000,"ignore_eos":true,"stream":true}`))
	req.Header.Set("Authorization", "Bearer "+apiKey)
	resp, err := ts.http.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "data: ") {
		t.Fatalf("first line %q, %v", line, err)
	}
	if running := ts.metric(t, "vllm:num_requests_running", nil); running != 1 {
		t.Fatalf("%v requests running before the disconnect, want 1", running)
	}
	cancel()
	resp.Body.Close()
	eventually(t, "the engine aborts the request", func() bool {
		return ts.metric(t, "vllm:request_success_total", map[string]string{"finished_reason": "abort"}) == 1 &&
			ts.metric(t, "vllm:num_requests_running", nil) == 0 &&
			ts.metric(t, "vllm:kv_cache_usage_perc", nil) == 0
	})
}

func TestInfoEndpoints(t *testing.T) {
	ts := startServer(t, 0)
	var health struct {
		Status string `json:"status"`
		Ranks  int    `json:"ranks"`
	}
	if code := ts.getJSON(t, "/health", &health); code != 200 || health.Status != "ok" || health.Ranks != 2 {
		t.Fatalf("/health %d %+v", code, health)
	}
	var view struct {
		Self             string `json:"self"`
		DataParallelSize int    `json:"data_parallel_size"`
		Nodes            []struct {
			Name string `json:"name"`
		} `json:"nodes"`
		Ranks []struct {
			Rank  int    `json:"rank"`
			Ready bool   `json:"ready"`
			Node  string `json:"node"`
		} `json:"ranks"`
		Coordinator struct {
			Node        string `json:"node"`
			Epoch       uint64 `json:"epoch"`
			RunningHere bool   `json:"running_here"`
		} `json:"coordinator"`
	}
	code := ts.getJSON(t, "/v1/cluster", &view)
	if code != 200 || view.DataParallelSize != 2 || len(view.Ranks) != 2 || !view.Ranks[1].Ready || view.Ranks[1].Node != view.Self ||
		len(view.Nodes) != 1 || view.Coordinator.Node != view.Self || view.Coordinator.Epoch == 0 || !view.Coordinator.RunningHere {
		t.Fatalf("/v1/cluster %d %+v", code, view)
	}
	resp, err := ts.http.Get(ts.base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, name := range []string{"vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
		"vllm:request_success_total", "vllm:prompt_tokens_total", "vllm:generation_tokens_total",
		"vllm:time_to_first_token_seconds", "dpnode_engine_ready", "go_goroutines"} {
		if !bytes.Contains(body, []byte("# TYPE "+name)) {
			t.Errorf("/metrics lacks %s", name)
		}
	}
	if !bytes.Contains(body, []byte(`vllm:num_requests_running{engine="1",model_name="`+model+`"}`)) {
		t.Error("/metrics lacks the engine and model_name labels")
	}
}

// TestStopFinishesCountAsSuccess: a request ended by a stop string is a
// success with finish_reason stop in the metrics, not an abort, and a
// stop token's text is not in the output.
func TestStopFinishesCountAsSuccess(t *testing.T) {
	ts := startServer(t, 0)
	status, body := ts.post(t, "/v1/completions", `{"prompt":"count the words","max_tokens":30,"ignore_eos":true}`, nil)
	if status != 200 {
		t.Fatalf("%d %s", status, body)
	}
	var full struct {
		Choices []struct {
			Text string `json:"text"`
		} `json:"choices"`
	}
	json.Unmarshal(body, &full)
	words := strings.Fields(full.Choices[0].Text)
	stop := " " + words[3]
	status, body = ts.post(t, "/v1/completions", fmt.Sprintf(`{"prompt":"count the words","max_tokens":30,"ignore_eos":true,"stop":[%q]}`, stop), nil)
	// vLLM's stop_reason names the stop string.
	if want, _ := json.Marshal(stop); status != 200 || !strings.Contains(string(body), `"finish_reason":"stop","stop_reason":`+string(want)) {
		t.Fatalf("%d %s", status, body)
	}
	eventually(t, "the stop-string finish is counted as stop", func() bool {
		return ts.metric(t, "vllm:request_success_total", map[string]string{"finished_reason": "stop"}) == 1 &&
			ts.metric(t, "vllm:request_success_total", map[string]string{"finished_reason": "abort"}) == 0 &&
			ts.metric(t, "vllm:prompt_tokens_total", nil) == 2*3
	})

	// The same text ended by a stop token id: the token's text is left out.
	tok := sim.NewTokenizer(0)
	stopID := tok.Tokens(stop)[0]
	status, body = ts.post(t, "/v1/completions", fmt.Sprintf(`{"prompt":"count the words","max_tokens":30,"ignore_eos":true,"stop_token_ids":[%d]}`, stopID), nil)
	var got struct {
		Choices []struct {
			Text         string `json:"text"`
			FinishReason string `json:"finish_reason"`
			StopReason   any    `json:"stop_reason"`
		} `json:"choices"`
		Usage struct {
			CompletionTokens int `json:"completion_tokens"`
		} `json:"usage"`
	}
	json.Unmarshal(body, &got)
	want := full.Choices[0].Text[:strings.Index(full.Choices[0].Text, stop)]
	if status != 200 || got.Choices[0].Text != want || got.Choices[0].FinishReason != "stop" || got.Usage.CompletionTokens != len(tok.Tokens(want))+1 ||
		got.Choices[0].StopReason != float64(stopID) {
		t.Fatalf("stop token %d (%q): %d %+v; want text %q and the stop token counted", stopID, stop, status, got, want)
	}
}

func TestHugeNIsABadRequest(t *testing.T) {
	ts := startServer(t, 0)
	for _, body := range []string{`{"prompt":["a","b"],"n":6917529027641081856}`, `{"prompt":["a","b","c","d"],"n":4611686018427387904}`, `{"prompt":"a","n":129}`} {
		if status, resp := ts.post(t, "/v1/completions", body, nil); status != 400 {
			t.Fatalf("%s: %d %s; want 400", body, status, resp)
		}
	}
}

func TestUsageReportsPrefixCacheHits(t *testing.T) {
	ts := startServer(t, 0)
	prompt := strings.Repeat("a shared system prompt of some length ", 20)
	var cached []int
	for range 2 {
		status, body := ts.post(t, "/v1/completions", fmt.Sprintf(`{"prompt":%q,"max_tokens":1}`, prompt), map[string]string{"X-data-parallel-rank": "0"})
		var resp struct {
			Usage struct {
				PromptTokensDetails struct {
					CachedTokens int `json:"cached_tokens"`
				} `json:"prompt_tokens_details"`
			} `json:"usage"`
		}
		if status != 200 || json.Unmarshal(body, &resp) != nil {
			t.Fatalf("%d %s", status, body)
		}
		cached = append(cached, resp.Usage.PromptTokensDetails.CachedTokens)
	}
	if cached[0] != 0 || cached[1] < 100 {
		t.Fatalf("cached tokens %v; want none the first time and the shared prompt's blocks the second", cached)
	}
}

// TestTokenizeDetokenizeAndModel: vLLM's /tokenize counts a prompt's
// tokens as a completion's usage does, and a chat's as a chat's does;
// /detokenize gives the text back; GET /v1/models/{id} is the model's card
// (through the SDK, whose path escapes the slash in the name) or a 404;
// /ping answers as /health.
func TestTokenizeDetokenizeAndModel(t *testing.T) {
	ts := startServer(t, 0)
	ctx := context.Background()
	type tokenized struct {
		Count       int      `json:"count"`
		MaxModelLen int      `json:"max_model_len"`
		Tokens      []uint32 `json:"tokens"`
	}
	tokenize := func(body string) tokenized {
		t.Helper()
		status, resp := ts.post(t, "/tokenize", body, nil)
		var tk tokenized
		if status != 200 || json.Unmarshal(resp, &tk) != nil || tk.Count != len(tk.Tokens) || tk.MaxModelLen == 0 {
			t.Fatalf("/tokenize %s: %d %s", body, status, resp)
		}
		return tk
	}
	prompt := tokenize(`{"prompt":"The cluster has four ranks"}`)
	c, err := ts.client.Completions.New(ctx, openai.CompletionNewParams{Model: model,
		Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("The cluster has four ranks")}, MaxTokens: openai.Int(1)})
	if err != nil || int(c.Usage.PromptTokens) != prompt.Count {
		t.Fatalf("completion usage %+v, %v; /tokenize counted %d", c.Usage, err, prompt.Count)
	}
	chat := tokenize(`{"messages":[{"role":"user","content":"Hello"}]}`)
	cc, err := ts.client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: model,
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Hello")}, MaxTokens: openai.Int(1)})
	if err != nil || int(cc.Usage.PromptTokens) != chat.Count {
		t.Fatalf("chat usage %+v, %v; /tokenize counted %d", cc.Usage, err, chat.Count)
	}
	body, _ := json.Marshal(map[string]any{"tokens": prompt.Tokens})
	status, resp := ts.post(t, "/detokenize", string(body), nil)
	var text struct {
		Prompt string `json:"prompt"`
	}
	// The simulated vocabulary hashes the words it does not hold, which
	// decode to nothing; a real one gives the text back (cluster's tests).
	if want := sim.NewTokenizer(0).Decode(prompt.Tokens); status != 200 || json.Unmarshal(resp, &text) != nil || text.Prompt != want || want == "" {
		t.Fatalf("/detokenize: %d %s", status, resp)
	}
	for _, tc := range []struct{ path, body, param string }{
		{"/tokenize", `{}`, "prompt"},
		{"/tokenize", `{"prompt":"x","messages":[{"role":"user","content":"x"}]}`, "messages"},
		{"/tokenize", `{"prompt":"x","return_token_strs":true}`, "return_token_strs"},
		{"/detokenize", `{"tokens":[4000000000]}`, "tokens"},
		{"/detokenize", `{}`, "tokens"},
	} {
		if status, resp := ts.post(t, tc.path, tc.body, nil); status != 400 || !bytes.Contains(resp, []byte(`"param":"`+tc.param+`"`)) {
			t.Errorf("%s %s: %d %s; want 400 naming %s", tc.path, tc.body, status, resp, tc.param)
		}
	}
	m, err := ts.client.Models.Get(ctx, model)
	if err != nil || m.ID != model {
		t.Fatalf("GET /v1/models/%s: %+v, %v", model, m, err)
	}
	var apiErr *openai.Error
	if _, err := ts.client.Models.Get(ctx, "gpt-4o"); !errors.As(err, &apiErr) || apiErr.StatusCode != 404 {
		t.Fatalf("another model: %v", err)
	}
	for _, method := range []string{http.MethodGet, http.MethodPost} {
		req, _ := http.NewRequest(method, ts.base+"/ping", nil)
		resp, err := ts.http.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("%s /ping: %d", method, resp.StatusCode)
		}
	}
}

// TestCompletionDefaultsTo16Tokens: a completion without max_tokens
// generates 16 tokens, as OpenAI's and vLLM's do; a chat is not bounded so.
func TestCompletionDefaultsTo16Tokens(t *testing.T) {
	ts := startServer(t, 0)
	status, body := ts.post(t, "/v1/completions", `{"prompt":"a long story","ignore_eos":true}`, nil)
	var c struct {
		Choices []struct {
			FinishReason string `json:"finish_reason"`
		} `json:"choices"`
		Usage struct {
			CompletionTokens int `json:"completion_tokens"`
		} `json:"usage"`
	}
	if status != 200 || json.Unmarshal(body, &c) != nil || c.Usage.CompletionTokens != 16 || c.Choices[0].FinishReason != "length" {
		t.Fatalf("%d %s; want 16 tokens, finish_reason length", status, body)
	}
	status, body = ts.post(t, "/v1/chat/completions", `{"messages":[{"role":"user","content":"a long story"}],"ignore_eos":true}`, nil)
	if status != 200 || json.Unmarshal(body, &c) != nil || c.Usage.CompletionTokens <= 16 {
		t.Fatalf("chat: %d %s; want more than 16 tokens", status, body)
	}
}
