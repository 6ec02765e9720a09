//go:build llamacpp

package node_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"math"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/dpnode/dpnode/engine/llamacpp/llamacpptest"
)

// TestLlamaCppLogprobs: through the OpenAI SDK, a greedy chat's tokens
// carry log-probabilities, each the largest of its alternatives, which
// come most likely first; a completion's are the same numbers in the
// legacy shape, streamed as whole; a drawn token is among the likely.
func TestLlamaCppLogprobs(t *testing.T) {
	n := startLlamaNode(t)
	client := openai.NewClient(option.WithBaseURL(n.base+"/v1"), option.WithAPIKey("none"), option.WithHTTPClient(n.http), option.WithMaxRetries(0))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	model := llamacpptest.Model(t)
	chat, err := client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
		Model:       openai.ChatModel(model),
		Messages:    []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Hello")},
		MaxTokens:   openai.Int(12),
		Temperature: openai.Float(0),
		Logprobs:    openai.Bool(true),
		TopLogprobs: openai.Int(3),
	}, option.WithJSONSet("ignore_eos", true), option.WithJSONSet("return_token_ids", true))
	if err != nil {
		t.Fatal(err)
	}
	content := chat.Choices[0].Logprobs.Content
	if len(content) != 12 {
		t.Fatalf("%d tokens with log-probabilities, want 12", len(content))
	}
	var text strings.Builder
	for i, c := range content {
		if len(c.TopLogprobs) != 3 || c.Logprob > 0 || c.Logprob < -30 {
			t.Fatalf("token %d: %+v", i, c)
		}
		mass := math.Exp(c.TopLogprobs[0].Logprob)
		for j := 1; j < 3; j++ {
			if c.TopLogprobs[j].Logprob > c.TopLogprobs[j-1].Logprob {
				t.Fatalf("token %d: alternatives out of order: %+v", i, c.TopLogprobs)
			}
			mass += math.Exp(c.TopLogprobs[j].Logprob)
		}
		// A distribution: three tokens' probabilities sum to at most 1.
		if mass > 1+1e-5 {
			t.Fatalf("token %d: the three most likely have probability %v", i, mass)
		}
		// Greedy: the drawn token is the most likely.
		if c.TopLogprobs[0].Token != c.Token || math.Abs(c.TopLogprobs[0].Logprob-c.Logprob) > 1e-6 {
			t.Fatalf("token %d: drew %q (%v), the most likely is %q (%v)", i, c.Token, c.Logprob, c.TopLogprobs[0].Token, c.TopLogprobs[0].Logprob)
		}
		text.WriteString(c.Token)
	}
	if text.String() != chat.Choices[0].Message.Content {
		t.Fatalf("the tokens' texts %q, the message %q", text.String(), chat.Choices[0].Message.Content)
	}

	// The same prompt's tokens as a completion, whole and streamed.
	var ids struct {
		PromptTokenIDs []uint32 `json:"prompt_token_ids"`
	}
	if err := json.Unmarshal([]byte(chat.RawJSON()), &ids); err != nil || len(ids.PromptTokenIDs) == 0 {
		t.Fatalf("prompt token ids: %v", err)
	}
	complete := func(stream bool) completionLogprobsOf {
		t.Helper()
		body, _ := json.Marshal(map[string]any{"prompt": ids.PromptTokenIDs, "max_tokens": 12, "temperature": 0, "ignore_eos": true,
			"logprobs": 2, "stream": stream})
		resp, err := n.http.Post(n.base+"/v1/completions", "application/json", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var all completionLogprobsOf
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			line := sc.Text()
			if stream {
				var ok bool
				if line, ok = strings.CutPrefix(line, "data: "); !ok || line == "[DONE]" {
					continue
				}
			}
			var c struct {
				Choices []struct {
					Logprobs *completionLogprobsOf `json:"logprobs"`
				} `json:"choices"`
			}
			if err := json.Unmarshal([]byte(line), &c); err != nil {
				t.Fatalf("%v: %s", err, line)
			}
			for _, ch := range c.Choices {
				if ch.Logprobs != nil {
					all.Tokens = append(all.Tokens, ch.Logprobs.Tokens...)
					all.TokenLogprobs = append(all.TokenLogprobs, ch.Logprobs.TokenLogprobs...)
					all.TopLogprobs = append(all.TopLogprobs, ch.Logprobs.TopLogprobs...)
					all.TextOffset = append(all.TextOffset, ch.Logprobs.TextOffset...)
				}
			}
		}
		return all
	}
	whole, streamed := complete(false), complete(true)
	if !reflect.DeepEqual(whole, streamed) {
		t.Fatalf("whole %+v\nstreamed %+v", whole, streamed)
	}
	offset := 0
	for i, c := range content {
		if whole.Tokens[i] != c.Token || math.Abs(float64(whole.TokenLogprobs[i])-c.Logprob) > 1e-6 || whole.TextOffset[i] != offset {
			t.Fatalf("completion token %d: %q %v at %d; chat %q %v", i, whole.Tokens[i], whole.TokenLogprobs[i], whole.TextOffset[i], c.Token, c.Logprob)
		}
		// The two most likely, and the drawn one, which is one of them.
		if top := whole.TopLogprobs[i]; len(top) != 2 || top[c.Token] != whole.TokenLogprobs[i] {
			t.Fatalf("completion token %d: alternatives %v", i, top)
		}
		offset += len(c.Token)
	}

	// Drawn at temperature 1: each token is one the model gives a real
	// chance, and its log-probability is at most the most likely one's.
	drawn, err := client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
		Model:       openai.ChatModel(model),
		Messages:    []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Hello")},
		MaxTokens:   openai.Int(12),
		Temperature: openai.Float(1),
		Seed:        openai.Int(5),
		Logprobs:    openai.Bool(true),
		TopLogprobs: openai.Int(1),
	}, option.WithJSONSet("ignore_eos", true))
	if err != nil {
		t.Fatal(err)
	}
	for i, c := range drawn.Choices[0].Logprobs.Content {
		if c.Logprob > c.TopLogprobs[0].Logprob+1e-6 || math.IsInf(c.Logprob, 0) {
			t.Fatalf("drawn token %d: %v, the most likely %v", i, c.Logprob, c.TopLogprobs[0].Logprob)
		}
	}
}

// completionLogprobsOf is the legacy shape of log-probabilities.
type completionLogprobsOf struct {
	Tokens        []string             `json:"tokens"`
	TokenLogprobs []float64            `json:"token_logprobs"`
	TopLogprobs   []map[string]float64 `json:"top_logprobs"`
	TextOffset    []int                `json:"text_offset"`
}

// TestLlamaCppPromptLogprobs is what evaluation harnesses ask (lm-eval's
// loglikelihood): a token-id prompt, echo, logprobs 1, one token. A greedy
// continuation's log-probabilities are the log-softmax of llama.cpp's own
// logits (the reference program's); as prompt, computed in chunks past the
// prefix cache, its tokens have the same, on both ranks and when the prompt
// was cached.
func TestLlamaCppPromptLogprobs(t *testing.T) {
	n := startLlamaNode(t)
	prompt := prompts(4)[3] // 116 tokens: two chunks and more
	// The greedy continuation, with each drawn token's log-probability.
	var gen struct {
		Choices []struct {
			TokenIDs []uint32             `json:"token_ids"`
			Logprobs completionLogprobsOf `json:"logprobs"`
		} `json:"choices"`
	}
	n.postJSON(t, "/v1/completions", map[string]any{"prompt": prompt, "max_tokens": 12, "temperature": 0, "ignore_eos": true,
		"logprobs": 0, "return_token_ids": true}, &gen)
	cont := gen.Choices[0].TokenIDs
	if len(cont) != 12 || len(gen.Choices[0].Logprobs.TokenLogprobs) != 12 {
		t.Fatalf("continuation %v, logprobs %+v", cont, gen.Choices[0].Logprobs)
	}
	// They are llama.cpp's own: its greedy tokens, and the log-softmax of
	// its logits, from the reference program.
	refIDs, refLps := llamacpptest.GreedyLogprobs(t, llamacpptest.Model(t), "f32", 12, [][]uint32{prompt})
	if !slices.Equal(cont, refIDs[0]) {
		t.Fatalf("continuation %v, llama.cpp's %v", cont, refIDs[0])
	}
	for j, want := range refLps[0] {
		if got := gen.Choices[0].Logprobs.TokenLogprobs[j]; math.Abs(got-want) > 1e-4 {
			t.Fatalf("token %d: log-probability %v, llama.cpp's logits give %v", j, got, want)
		}
	}
	whole := append(slices.Clone(prompt), cont...)
	type echoed struct {
		Choices []struct {
			Logprobs struct {
				Tokens        []string             `json:"tokens"`
				TokenLogprobs []*float64           `json:"token_logprobs"`
				TopLogprobs   []map[string]float64 `json:"top_logprobs"`
			} `json:"logprobs"`
		} `json:"choices"`
	}
	// Twice on each rank, the second time with its prompt cached there,
	// then four at once on one rank, in steps of one chunk between them.
	check := func(rank string, e echoed) {
		t.Helper()
		lp := e.Choices[0].Logprobs
		if len(lp.TokenLogprobs) != len(whole)+1 || lp.TokenLogprobs[0] != nil || lp.TopLogprobs[0] != nil {
			t.Fatalf("rank %s: %d log-probabilities for %d prompt tokens and 1 more, the first %v", rank, len(lp.TokenLogprobs), len(whole), lp.TokenLogprobs[0])
		}
		for j, x := range lp.TokenLogprobs[1:] {
			if x == nil || *x > 0 || len(lp.TopLogprobs[j+1]) == 0 || len(lp.TopLogprobs[j+1]) > 2 {
				t.Fatalf("rank %s, prompt token %d: %v, alternatives %v", rank, j+1, x, lp.TopLogprobs[j+1])
			}
		}
		// The continuation's tokens, as prompt, have the log-probabilities
		// they were drawn with.
		for j := range cont {
			got, want := *lp.TokenLogprobs[len(prompt)+j], gen.Choices[0].Logprobs.TokenLogprobs[j]
			if math.Abs(got-want) > 1e-4 {
				t.Fatalf("rank %s, continuation token %d: %v as prompt, %v drawn", rank, j, got, want)
			}
		}
	}
	ask := func(rank string) (e echoed, err error) {
		err = n.tryPostJSON("/v1/completions", map[string]any{"prompt": whole, "max_tokens": 1, "temperature": 0, "echo": true,
			"logprobs": 1}, &e, "X-data-parallel-rank", rank)
		return e, err
	}
	for _, rank := range []string{"0", "1", "0", "1"} {
		e, err := ask(rank)
		if err != nil {
			t.Fatal(err)
		}
		check(rank, e)
	}
	got := make([]echoed, 4)
	errs := make([]error, 4)
	var wg sync.WaitGroup
	for i := range got {
		wg.Go(func() { got[i], errs[i] = ask("0") })
	}
	wg.Wait()
	for i, e := range got {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		check("0, four at once", e)
	}

	// vLLM's prompt_logprobs: the same log-probabilities, with each prompt
	// token's rank (the greedy continuation's tokens are first where they
	// were drawn) and the 3 most likely tokens', by id.
	type entry struct {
		Logprob      float64 `json:"logprob"`
		Rank         int     `json:"rank"`
		DecodedToken string  `json:"decoded_token"`
	}
	var vllm struct {
		Choices []struct {
			PromptLogprobs []map[string]entry `json:"prompt_logprobs"`
		} `json:"choices"`
	}
	n.postJSON(t, "/v1/completions", map[string]any{"prompt": whole, "max_tokens": 1, "temperature": 0, "prompt_logprobs": 3}, &vllm)
	echo := got[0].Choices[0].Logprobs.TokenLogprobs
	pl := vllm.Choices[0].PromptLogprobs
	if len(pl) != len(whole) || pl[0] != nil {
		t.Fatalf("%d prompt_logprobs for %d prompt tokens, the first %v", len(pl), len(whole), pl[0])
	}
	for j := 1; j < len(whole); j++ {
		own, ok := pl[j][strconv.FormatUint(uint64(whole[j]), 10)]
		if !ok || math.Abs(own.Logprob-*echo[j]) > 1e-5 || own.Rank < 1 || len(pl[j]) < 3 || len(pl[j]) > 4 {
			t.Fatalf("prompt token %d (%d): %+v, echoed %v", j, whole[j], pl[j], *echo[j])
		}
		for id, e := range pl[j] {
			if id != strconv.FormatUint(uint64(whole[j]), 10) && (e.Rank < 1 || e.Rank > 3 || e.Logprob < own.Logprob && e.Rank < own.Rank) {
				t.Fatalf("prompt token %d: alternative %s %+v beside %+v", j, id, e, own)
			}
		}
		if j >= len(prompt) && own.Rank != 1 {
			t.Fatalf("continuation token %d, drawn greedily, has rank %d", j-len(prompt), own.Rank)
		}
	}
	var chat struct {
		Usage struct {
			PromptTokens int `json:"prompt_tokens"`
		} `json:"usage"`
		PromptLogprobs []map[string]entry `json:"prompt_logprobs"`
	}
	n.postJSON(t, "/v1/chat/completions", map[string]any{"messages": []map[string]string{{"role": "user", "content": "Hello"}}, "max_tokens": 1, "prompt_logprobs": 0}, &chat)
	if len(chat.PromptLogprobs) != chat.Usage.PromptTokens || chat.PromptLogprobs[0] != nil || len(chat.PromptLogprobs[1]) != 1 {
		t.Fatalf("chat: %d prompt_logprobs for %d prompt tokens: %v", len(chat.PromptLogprobs), chat.Usage.PromptTokens, chat.PromptLogprobs)
	}
}

// TestLlamaCppEchoLogprobsAcrossAKill: streamed echo and logprobs come
// through a migration whole: the prompt's log-probabilities once, then
// each token's, llama.cpp's own on both sides of the kill.
func TestLlamaCppEchoLogprobsAcrossAKill(t *testing.T) {
	n := startLlamaNode(t)
	// As many streams, as long, as TestLlamaCppOutputDoesNotDependOnHowItIsServed
	// kills under: both ranks hold some when the worker dies after each
	// has a token.
	ps := prompts(8)
	const maxTokens = 64
	want, wantLps := llamacpptest.GreedyLogprobs(t, llamacpptest.Model(t), "f32", maxTokens, ps)
	results := n.streamAcrossAKill(t, len(ps), func(i int) ([]uint32, int, map[string]any) {
		return ps[i], maxTokens, map[string]any{"echo": true, "logprobs": 1}
	}, 1)
	for i, r := range results {
		if r.err != nil || !slices.Equal(r.ids, want[i]) {
			t.Fatalf("stream %d: %v\n dpnode %v\nllama.cpp %v", i, r.err, r.ids, want[i])
		}
		prompt := len(ps[i])
		if len(r.lps) != prompt+maxTokens || r.lps[0] != nil {
			t.Fatalf("stream %d: %d log-probabilities for %d prompt tokens and %d more", i, len(r.lps), prompt, maxTokens)
		}
		for j, x := range r.lps[1:prompt] {
			if x == nil || *x > 0 {
				t.Fatalf("stream %d, prompt token %d: %v", i, j+1, x)
			}
		}
		for j, x := range r.lps[prompt:] {
			if x == nil || math.Abs(*x-wantLps[i][j]) > 1e-4 {
				t.Fatalf("stream %d, token %d: %v, llama.cpp's logits give %v", i, j, x, wantLps[i][j])
			}
		}
	}
	if moved := n.metric(t, "dpnode_requests_migrated_total"); moved == 0 {
		t.Fatal("no stream was migrated off the killed worker's rank")
	}
}
