package openai

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/dpnode/dpnode/engine"
)

// completionBody is a token-id completion in the OpenAI dialect, with
// vLLM's extensions (which dpnode takes too).
type completionBody struct {
	Model             string             `json:"model"`
	Prompt            []uint32           `json:"prompt"`
	MaxTokens         int                `json:"max_tokens"`
	Stream            bool               `json:"stream"`
	StreamOptions     *streamOptions     `json:"stream_options,omitempty"`
	ReturnTokenIDs    bool               `json:"return_token_ids"`
	Temperature       float32            `json:"temperature"`
	TopP              float32            `json:"top_p"`
	TopK              int                `json:"top_k,omitempty"`
	MinP              float32            `json:"min_p,omitempty"`
	PresencePenalty   float32            `json:"presence_penalty,omitempty"`
	FrequencyPenalty  float32            `json:"frequency_penalty,omitempty"`
	RepetitionPenalty float32            `json:"repetition_penalty,omitempty"`
	Seed              *int64             `json:"seed,omitempty"`
	IgnoreEOS         bool               `json:"ignore_eos,omitempty"`
	MinTokens         int                `json:"min_tokens,omitempty"`
	StopTokenIDs      []uint32           `json:"stop_token_ids,omitempty"`
	LogitBias         map[string]float32 `json:"logit_bias,omitempty"`
	CacheSalt         string             `json:"cache_salt,omitempty"`
	// Logprobs asks for the drawn tokens' log-probabilities and this many
	// more; named by token id (vLLM's return_tokens_as_token_ids), so
	// that the node knows each one.
	Logprobs               *int `json:"logprobs,omitempty"`
	ReturnTokensAsTokenIDs bool `json:"return_tokens_as_token_ids,omitempty"`
	// StructuredOutputs constrains the output to the API server's GBNF
	// grammar (vLLM's structured_outputs, whose xgrammar reads GBNF).
	StructuredOutputs *structuredOutputs `json:"structured_outputs,omitempty"`
}

type structuredOutputs struct {
	Grammar string `json:"grammar"`
}

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

// llamaBody is a token-id completion in llama-server's own dialect.
type llamaBody struct {
	Prompt           []uint32     `json:"prompt"`
	NPredict         int          `json:"n_predict"`
	Stream           bool         `json:"stream"`
	ReturnTokens     bool         `json:"return_tokens"`
	CachePrompt      bool         `json:"cache_prompt"`
	Temperature      float32      `json:"temperature"`
	TopP             float32      `json:"top_p"`
	TopK             int          `json:"top_k"`
	MinP             float32      `json:"min_p"`
	PresencePenalty  float32      `json:"presence_penalty"`
	FrequencyPenalty float32      `json:"frequency_penalty"`
	RepeatPenalty    float32      `json:"repeat_penalty"`
	Seed             *int64       `json:"seed,omitempty"`
	IgnoreEOS        bool         `json:"ignore_eos,omitempty"`
	LogitBias        [][2]float64 `json:"logit_bias,omitempty"`
	// NProbs asks for the drawn tokens' log-probabilities (under the raw
	// logits: llama-server's post_sampling_probs is false by default) and
	// this many more.
	NProbs int `json:"n_probs,omitempty"`
	// Grammar constrains the output to the API server's GBNF grammar.
	Grammar string `json:"grammar,omitempty"`
	// TimingsPerToken has every event carry the timings, the prompt's
	// cache hit (cache_n) among them. Without it the hit comes only in
	// the stream's last event, which follows the last token: a request
	// the node ends on its own (max_tokens, a stop token) has finished
	// by then, and its usage would say nothing was cached.
	TimingsPerToken bool `json:"timings_per_token"`
}

// body is the request for r's prompt, and its output so far (a request
// moved from another rank continues from it), in the server's dialect.
func (s *server) body(r *request) (path string, body any) {
	sp := &r.sampling
	prompt := append(append(make([]uint32, 0, len(r.prompt)+len(r.output)), r.prompt...), r.output...)
	maxTokens := sp.MaxTokens - len(r.output)
	topP := sp.TopP
	if topP == 0 {
		topP = 1
	}
	if s.dialect == dialectLlamaServer {
		topK := sp.TopK
		if sp.Temperature == 0 {
			// Greedy: the same token, without llama.cpp's samplers
			// passing over the whole vocabulary (about 1 ms a token on
			// a 128,256-token vocabulary, a sequence at a time).
			topK = 1
		}
		b := &llamaBody{Prompt: prompt, NPredict: maxTokens, Stream: true, ReturnTokens: true, CachePrompt: true, TimingsPerToken: true,
			Temperature: sp.Temperature, TopP: topP, TopK: topK, MinP: sp.MinP,
			PresencePenalty: sp.PresencePenalty, FrequencyPenalty: sp.FrequencyPenalty, RepeatPenalty: sp.RepetitionPenalty,
			Seed: sp.Seed, IgnoreEOS: sp.IgnoreEOS, Grammar: sp.Grammar}
		if b.RepeatPenalty == 0 {
			b.RepeatPenalty = 1
		}
		for id, v := range sp.LogitBias {
			b.LogitBias = append(b.LogitBias, [2]float64{float64(id), float64(v)})
		}
		if sp.Logprobs {
			// At least one: with none, no log-probability comes at all.
			b.NProbs = max(sp.TopLogprobs, 1)
		}
		return "/completion", b
	}
	b := &completionBody{Model: s.model, Prompt: prompt, MaxTokens: maxTokens, Stream: true, ReturnTokenIDs: true,
		StreamOptions: &streamOptions{IncludeUsage: true},
		Temperature:   sp.Temperature, TopP: topP, TopK: sp.TopK, MinP: sp.MinP,
		PresencePenalty: sp.PresencePenalty, FrequencyPenalty: sp.FrequencyPenalty, RepetitionPenalty: sp.RepetitionPenalty,
		Seed: sp.Seed, IgnoreEOS: sp.IgnoreEOS, MinTokens: max(sp.MinTokens-len(r.output), 0), StopTokenIDs: sp.StopTokenIDs,
		CacheSalt: r.cacheSalt}
	if sp.Logprobs {
		top := sp.TopLogprobs
		b.Logprobs, b.ReturnTokensAsTokenIDs = &top, true
	}
	if sp.Grammar != "" {
		b.StructuredOutputs = &structuredOutputs{Grammar: sp.Grammar}
	}
	if len(sp.LogitBias) > 0 {
		b.LogitBias = make(map[string]float32, len(sp.LogitBias))
		for id, v := range sp.LogitBias {
			b.LogitBias[strconv.FormatUint(uint64(id), 10)] = v
		}
	}
	return "/v1/completions", b
}

// chunk is what one event of a stream says, in either dialect.
type chunk struct {
	tokens []uint32
	// logprobs are the tokens', when the request asked.
	logprobs []*engine.TokenLogprobs
	finish   engine.FinishReason
	// cached is the prompt tokens the server found in its cache, when it
	// says; -1 when not.
	cached int
}

// openAIChunk is a streamed completion chunk with vLLM's token ids.
type openAIChunk struct {
	Choices []struct {
		TokenIDs     []uint32 `json:"token_ids"`
		FinishReason *string  `json:"finish_reason"`
		Logprobs     *struct {
			TokenLogprobs []*float64           `json:"token_logprobs"`
			TopLogprobs   []map[string]float64 `json:"top_logprobs"`
		} `json:"logprobs"`
	} `json:"choices"`
	Usage *struct {
		Details *struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	} `json:"usage"`
	Error *struct {
		Message string `json:"message"`
	} `json:"error"`
}

// llamaChunk is a streamed llama-server /completion event.
type llamaChunk struct {
	Tokens []uint32 `json:"tokens"`
	Probs  []struct {
		llamaProb
		Top []llamaProb `json:"top_logprobs"`
	} `json:"completion_probabilities"`
	Stop     bool   `json:"stop"`
	StopType string `json:"stop_type"`
	Cached   *int   `json:"tokens_cached"`
	Timings  *struct {
		CacheN *int `json:"cache_n"`
	} `json:"timings"`
	Error *struct {
		Message string `json:"message"`
	} `json:"error"`
}

type llamaProb struct {
	ID      uint32  `json:"id"`
	Logprob float64 `json:"logprob"`
}

// errStreamEnded is a stream that ended before its request finished: the
// server went away mid-answer.
var errStreamEnded = errors.New("the stream ended before the request finished")

// decode reads one "data:" payload; done is set at the stream's end.
func (s *server) decode(data []byte) (c chunk, done bool, err error) {
	c.cached = -1
	if s.dialect == dialectLlamaServer {
		var m llamaChunk
		if err := json.Unmarshal(data, &m); err != nil {
			return c, false, fmt.Errorf("a stream event of %s: %w", s.base, err)
		}
		if m.Error != nil {
			return c, false, &requestError{msg: m.Error.Message}
		}
		c.tokens = m.Tokens
		if len(m.Probs) > 0 {
			if len(m.Probs) != len(m.Tokens) {
				return c, false, &requestError{msg: fmt.Sprintf("%s gave log-probabilities of %d tokens with %d tokens", s.base, len(m.Probs), len(m.Tokens))}
			}
			for _, p := range m.Probs {
				lp := &engine.TokenLogprobs{Logprob: float32(p.Logprob)}
				for _, t := range p.Top {
					lp.TopTokenIds, lp.TopLogprobs = append(lp.TopTokenIds, t.ID), append(lp.TopLogprobs, float32(t.Logprob))
				}
				c.logprobs = append(c.logprobs, lp)
			}
		}
		if m.Stop {
			done = true
			switch m.StopType {
			case "eos", "word":
				c.finish = engine.FinishedStop
			default:
				c.finish = engine.FinishedLength
			}
		}
		if m.Timings != nil && m.Timings.CacheN != nil {
			c.cached = *m.Timings.CacheN
		}
		return c, done, nil
	}
	if bytes.Equal(data, []byte("[DONE]")) {
		return c, true, nil
	}
	var m openAIChunk
	if err := json.Unmarshal(data, &m); err != nil {
		return c, false, fmt.Errorf("a stream event of %s: %w", s.base, err)
	}
	if m.Error != nil {
		return c, false, &requestError{msg: m.Error.Message}
	}
	if m.Usage != nil && m.Usage.Details != nil {
		c.cached = m.Usage.Details.CachedTokens
	}
	for _, ch := range m.Choices {
		c.tokens = append(c.tokens, ch.TokenIDs...)
		if ch.Logprobs != nil && len(ch.TokenIDs) > 0 {
			lps, err := openAILogprobs(ch.TokenIDs, ch.Logprobs.TokenLogprobs, ch.Logprobs.TopLogprobs)
			if err != nil {
				return c, false, &requestError{msg: fmt.Sprintf("%s: %v", s.base, err)}
			}
			c.logprobs = append(c.logprobs, lps...)
		}
		if ch.FinishReason != nil {
			switch *ch.FinishReason {
			case "stop":
				c.finish = engine.FinishedStop
			case "length":
				c.finish = engine.FinishedLength
			default:
				c.finish = engine.FinishedAbort
			}
		}
	}
	return c, false, nil
}

// openAILogprobs reads a completion chunk's log-probabilities, whose top
// alternatives are named "token_id:N" (return_tokens_as_token_ids): each
// token's own, and the alternatives most likely first. The alternatives
// hold the drawn token too when it is not among them, as vLLM's do; it
// sorts last, past the number asked.
func openAILogprobs(ids []uint32, own []*float64, tops []map[string]float64) ([]*engine.TokenLogprobs, error) {
	if len(own) != len(ids) || (len(tops) != 0 && len(tops) != len(ids)) {
		return nil, fmt.Errorf("log-probabilities of %d tokens came with %d tokens", len(own), len(ids))
	}
	out := make([]*engine.TokenLogprobs, len(ids))
	for i := range ids {
		lp := &engine.TokenLogprobs{Logprob: float32(math.Inf(-1))}
		if own[i] != nil {
			lp.Logprob = float32(*own[i])
		}
		if len(tops) > 0 {
			type alt struct {
				id uint32
				lp float64
			}
			alts := make([]alt, 0, len(tops[i]))
			for name, x := range tops[i] {
				n, ok := strings.CutPrefix(name, "token_id:")
				id, err := strconv.ParseUint(n, 10, 32)
				if !ok || err != nil {
					return nil, fmt.Errorf("a log-probability names its token %q, not token_id:N: the server ignored return_tokens_as_token_ids", name)
				}
				alts = append(alts, alt{uint32(id), x})
			}
			slices.SortFunc(alts, func(a, b alt) int {
				if c := cmp.Compare(b.lp, a.lp); c != 0 {
					return c
				}
				return cmp.Compare(a.id, b.id)
			})
			for _, a := range alts {
				lp.TopTokenIds, lp.TopLogprobs = append(lp.TopTokenIds, a.id), append(lp.TopLogprobs, float32(a.lp))
			}
		}
		out[i] = lp
	}
	return out, nil
}

// requestError is a server's refusal of one request (a 4xx, or a 5xx
// while its health says it serves): the request fails, the rank goes on.
// refused marks a 4xx: the request's own fault.
type requestError struct {
	msg     string
	refused bool
}

func (e *requestError) Error() string { return e.msg }

// stream runs one request against the server and posts what comes back;
// it returns when the request finishes, fails or is aborted (ctx).
func (c *core) stream(ctx context.Context, r *request) {
	defer c.wg.Done()
	path, body := c.srv.body(r)
	var resp *http.Response
	for try := 1; ; try++ {
		var err error
		resp, err = c.srv.request(ctx, http.MethodPost, path, body)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return
		}
		err = c.classify(ctx, err)
		var ee *engineError
		if errors.As(err, &ee) && ee.retry && try < maxTries {
			// The connection failed before any answer, and the server
			// still serves: it never ran the request.
			continue
		}
		c.post(ctx, event{req: r, err: err})
		return
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64<<10), 16<<20)
	// last is the finishing chunk, held until the stream ends: the
	// OpenAI dialect tells the cache hit in a usage chunk after it.
	var last *chunk
	// hit is set once the cache hit was read: a server that repeats it
	// in every event (llama-server's timings) counts it once.
	ended, hit := false, false
	for sc.Scan() {
		line := sc.Bytes()
		data, ok := bytes.CutPrefix(line, []byte("data:"))
		if !ok {
			continue
		}
		ch, done, err := c.srv.decode(bytes.TrimSpace(data))
		if err != nil {
			c.post(ctx, event{req: r, err: err})
			return
		}
		c.touch()
		if ch.cached >= 0 {
			if hit {
				ch.cached = -1
			}
			hit = true
		}
		switch {
		case last != nil:
			if ch.cached >= 0 {
				last.cached = ch.cached
			}
		case ch.finish != engine.NotFinished:
			last = &ch
		case len(ch.tokens) > 0 || ch.cached >= 0:
			if !c.post(ctx, event{req: r, chunk: ch}) {
				return
			}
		}
		if done {
			ended = true
			break
		}
	}
	if ctx.Err() != nil {
		return
	}
	if ended {
		// Before the finish is posted: finishing cancels ctx, which
		// would close the connection under the read.
		drain(resp.Body)
	}
	switch err := sc.Err(); {
	case last != nil:
		// Finished, whatever came after.
		c.post(ctx, event{req: r, chunk: *last})
	case err != nil:
		c.post(ctx, event{req: r, err: &engineError{err: fmt.Errorf("%s: %w", c.srv.base, err)}})
	default:
		c.post(ctx, event{req: r, err: &engineError{err: fmt.Errorf("%s: %w", c.srv.base, errStreamEnded)}})
	}
}

// drainLimit and drainTimeout bound what is read of a response after its
// stream's last event.
const (
	drainLimit   = 64 << 10
	drainTimeout = 100 * time.Millisecond
)

// drain reads a response to its end, so that its connection goes back to
// the pool. Go's client closes a connection whose response is closed
// before its end, and a server may send the end of a chunked response
// after the last event ([DONE]) in a packet of its own: then every
// request took a new connection, and the closes left the node's side of
// each in TIME_WAIT, a port for a minute (at a few hundred requests a
// second to one server, its ports run out). A server that sends on past
// its last event is cut off after drainTimeout.
func drain(body io.ReadCloser) {
	t := time.AfterFunc(drainTimeout, func() { _ = body.Close() })
	defer t.Stop()
	_, _ = io.Copy(io.Discard, io.LimitReader(body, drainLimit))
}

// engineError is a failure of the server itself: the rank restarts and
// its requests move.
type engineError struct {
	err error
	// retry is set for a connection that failed before any answer while
	// the server's health is fine: the request may be sent again.
	retry bool
}

// maxTries bounds the sends of a request whose connection fails before
// any answer from a server that still serves.
const maxTries = 3

func (e *engineError) Error() string { return e.err.Error() }
func (e *engineError) Unwrap() error { return e.err }

// classify tells a request's failure from the server's: a refusal (4xx),
// or a 5xx while /health still answers, fails the request alone; a
// connection that failed before any answer is sent again while /health
// answers (a keep-alive connection the server closed as it was taken);
// anything else (refused or reset connections with failing health, a 5xx
// from a server whose health fails too) is the server's.
func (c *core) classify(ctx context.Context, err error) error {
	var se *statusError
	if !errors.As(err, &se) {
		herr := c.srv.health(ctx, c.cfg.HealthTimeout)
		return &engineError{err: err, retry: herr == nil}
	}
	if se.status < 500 {
		return &requestError{msg: se.msg, refused: true}
	}
	if herr := c.srv.health(ctx, c.cfg.HealthTimeout); herr != nil {
		return &engineError{err: fmt.Errorf("%w; and its health: %v", err, herr)}
	}
	return &requestError{msg: se.msg}
}
