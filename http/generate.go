package httpapi

import (
	"crypto/rand"
	"errors"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/dpnode/dpnode/actors"
	"github.com/dpnode/dpnode/engine"
	"github.com/dpnode/dpnode/http/toolcall"
)

type promptInput struct {
	text   string
	tokens []uint32
}

// genSpec is one validated call of either endpoint.
type genSpec struct {
	chat     bool
	id       string
	created  int64
	model    string
	prompts  []promptInput
	n        int
	sampling []engine.SamplingParams // per prompt: max_tokens defaults differ
	// maxTokens is the max_tokens (or max_completion_tokens) the client
	// gave, 0 when it gave none.
	maxTokens    int
	stops        []string
	includeStop  bool
	stream       bool
	includeUsage bool
	echo         bool
	tokenIDs     bool
	rank         int
	cacheSalt    string
	// logprobs: each token's log-probability and topLogprobs more;
	// promptLogprobs: the engine computes the prompt's too, for echo
	// (echoLogprobs, in OpenAI's shape) or for vLLM's prompt_logprobs
	// (promptTop more each, -1 when not asked).
	logprobs       bool
	topLogprobs    int
	promptLogprobs bool
	echoLogprobs   bool
	promptTop      int
	// chatPromptSent is set once a chat's prompt_logprobs went out.
	chatPromptSent bool
	// decode writes output tokens as text: without special tokens, or
	// with them (skip_special_tokens false, or a tool-call parser's).
	decode func(ids []uint32) string
	// tokensAsIDs names the tokens of log-probabilities "token_id:N"
	// (return_tokens_as_token_ids).
	tokensAsIDs bool
	// tools, when not nil, reads tool calls from a chat's output.
	tools *toolSpec
}

// askLogprobs asks every request of g for log-probabilities, with top more
// likely tokens each.
func (g *genSpec) askLogprobs(top int) {
	g.logprobs, g.topLogprobs = true, top
	for i := range g.sampling {
		g.sampling[i].Logprobs, g.sampling[i].TopLogprobs = true, max(g.sampling[i].TopLogprobs, top)
	}
}

// askPromptLogprobs asks every request of g for its prompt's
// log-probabilities, with top more likely tokens each, and with ranks each
// when they are reported (vLLM's prompt_logprobs).
func (g *genSpec) askPromptLogprobs(top int, ranks bool) {
	g.promptLogprobs = true
	for i := range g.sampling {
		g.sampling[i].PromptLogprobs, g.sampling[i].TopLogprobs = true, max(g.sampling[i].TopLogprobs, top)
		g.sampling[i].PromptRanks = g.sampling[i].PromptRanks || ranks
	}
}

func newID(prefix string) string { return prefix + "-" + strings.ToLower(rand.Text()) }

// f32 is an optional parameter's value, 0 when not given.
func f32(v *float64) float32 {
	if v == nil {
		return 0
	}
	return float32(*v)
}

// defaultCompletionTokens is max_tokens when a completion gives none.
const defaultCompletionTokens = 16

// spec validates the parameters both endpoints share.
func (s *Server) spec(r *http.Request, chat bool, p *commonParams, prompts []promptInput) (*genSpec, *apiError) {
	if e := s.checkModel(p.Model); e != nil {
		return nil, e
	}
	g := &genSpec{chat: chat, created: time.Now().Unix(), model: s.cfg.Backend.Model(), prompts: prompts,
		n: 1, stops: p.Stop, includeStop: p.IncludeStopStr, stream: p.Stream, tokenIDs: p.ReturnTokenIDs, tokensAsIDs: p.ReturnTokensAsTokenIDs, promptTop: -1}
	if chat {
		g.id = newID("chatcmpl")
	} else {
		g.id = newID("cmpl")
	}
	if p.N != nil {
		g.n = *p.N
	}
	switch {
	case g.n < 1:
		return nil, badRequest(fmt.Sprintf("n must be at least 1, got %d", g.n), "n")
	case g.n > maxChoices/len(prompts):
		return nil, badRequest(fmt.Sprintf("n times the number of prompts (%d) must be at most %d", len(prompts), maxChoices), "n")
	case p.Temperature != nil && (*p.Temperature < 0 || *p.Temperature > 2):
		return nil, badRequest(fmt.Sprintf("temperature must be between 0 and 2, got %v", *p.Temperature), "temperature")
	case p.TopP != nil && (*p.TopP <= 0 || *p.TopP > 1):
		return nil, badRequest(fmt.Sprintf("top_p must be in (0, 1], got %v", *p.TopP), "top_p")
	case p.TopK != nil && *p.TopK < -1:
		return nil, badRequest(fmt.Sprintf("top_k must be -1 (or 0) to keep every token, or at least 1; got %d", *p.TopK), "top_k")
	case p.MinTokens < 0:
		return nil, badRequest(fmt.Sprintf("min_tokens must be at least 0, got %d", p.MinTokens), "min_tokens")
	case p.StreamOptions != nil && !p.Stream:
		return nil, badRequest("stream_options can only be set when stream is true", "stream_options")
	}
	// Both endpoints ran checkLists before tokenizing.
	if e := s.checkTokenIDs(p.StopTokenIDs, "stop_token_ids"); e != nil {
		return nil, e
	}
	biased := make([]uint32, 0, len(p.LogitBias))
	for k := range p.LogitBias {
		// checkLists has read every key as a token id.
		id, _ := strconv.ParseUint(k, 10, 32)
		biased = append(biased, uint32(id))
	}
	if e := s.checkTokenIDs(biased, "logit_bias"); e != nil {
		return nil, e
	}
	g.decode = s.cfg.Tokenizer.Decode
	if p.SkipSpecialTokens != nil && !*p.SkipSpecialTokens {
		st, ok := s.cfg.Tokenizer.(engine.SpecialTokenizer)
		if !ok {
			return nil, badRequest("skip_special_tokens false is not supported: this model's tokenizer cannot write its special tokens", "skip_special_tokens")
		}
		g.decode = st.DecodeSpecial
	}
	g.includeUsage = p.StreamOptions != nil && p.StreamOptions.IncludeUsage
	if p.CacheSalt != nil {
		g.cacheSalt = *p.CacheSalt
	}
	gbnf, e := s.structuredGrammar(&p.structuredParams)
	if e != nil {
		return nil, e
	}
	rank, e := s.pinnedRank(r)
	if e != nil {
		return nil, e
	}
	g.rank = rank

	if g.sampling, e = s.samplings(p, prompts, chat, gbnf); e != nil {
		return nil, e
	}
	if p.MaxCompletionTokens != nil {
		g.maxTokens = *p.MaxCompletionTokens
	} else if p.MaxTokens != nil {
		g.maxTokens = *p.MaxTokens
	}
	if p.PromptLogprobs != nil {
		g.promptTop = *p.PromptLogprobs
		g.askPromptLogprobs(g.promptTop, true)
	}
	return g, nil
}

// samplings are the sampling parameters of each prompt: the request's,
// within what its context leaves for output.
func (s *Server) samplings(p *commonParams, prompts []promptInput, chat bool, gbnf string) ([]engine.SamplingParams, *apiError) {
	var out []engine.SamplingParams
	maxTokens, param := p.MaxTokens, "max_tokens"
	if p.MaxCompletionTokens != nil {
		maxTokens, param = p.MaxCompletionTokens, "max_completion_tokens"
	}
	if maxTokens != nil && *maxTokens < 1 {
		return nil, badRequest(fmt.Sprintf("%s must be at least 1, got %d", param, *maxTokens), param)
	}
	for _, pr := range prompts {
		if len(pr.tokens) == 0 {
			return nil, badRequest("the prompt is empty", "prompt")
		}
		room := s.cfg.MaxModelLen - len(pr.tokens)
		if room < 1 || (maxTokens != nil && *maxTokens > room) {
			asked := 0
			if maxTokens != nil {
				asked = *maxTokens
			}
			return nil, badRequest(fmt.Sprintf("This model's maximum context length is %d tokens. However, you requested %d tokens (%d in the messages, %d in the completion). Please reduce the length of the messages or completion.",
				s.cfg.MaxModelLen, len(pr.tokens)+asked, len(pr.tokens), asked), param)
		}
		sp := engine.SamplingParams{MaxTokens: room, MinTokens: p.MinTokens, Seed: p.Seed, IgnoreEOS: p.IgnoreEOS, StopTokenIDs: p.StopTokenIDs, Grammar: gbnf}
		switch {
		case maxTokens != nil:
			sp.MaxTokens = *maxTokens
		case !chat:
			// OpenAI's and vLLM's default for a completion; a chat runs to
			// the end of the context.
			sp.MaxTokens = min(defaultCompletionTokens, room)
		}
		if sp.MinTokens > sp.MaxTokens {
			return nil, badRequest(fmt.Sprintf("min_tokens (%d) must not exceed %s (%d)", sp.MinTokens, param, sp.MaxTokens), "min_tokens")
		}
		// OpenAI's and vLLM's default temperature is 1: sampling, not
		// greedy decoding, unless the client asks for 0.
		sp.Temperature = 1
		if p.Temperature != nil {
			sp.Temperature = float32(*p.Temperature)
		}
		if p.TopP != nil {
			sp.TopP = float32(*p.TopP)
		}
		if p.TopK != nil && *p.TopK > 0 {
			sp.TopK = *p.TopK
		}
		sp.PresencePenalty, sp.FrequencyPenalty = f32(p.PresencePenalty), f32(p.FrequencyPenalty)
		sp.RepetitionPenalty, sp.MinP = f32(p.RepetitionPenalty), f32(p.MinP)
		if len(p.LogitBias) > 0 {
			// checkLists has read every key as a token id.
			sp.LogitBias = make(map[uint32]float32, len(p.LogitBias))
			for k, v := range p.LogitBias {
				id, _ := strconv.ParseUint(k, 10, 32)
				sp.LogitBias[uint32(id)] = float32(v)
			}
		}
		out = append(out, sp)
	}
	return out, nil
}

func finishName(f engine.FinishReason) string {
	switch f {
	case engine.FinishedLength:
		return "length"
	case engine.FinishedAbort:
		return "abort"
	default:
		return "stop"
	}
}

// eventError turns an error that ended a request into the error the client
// gets.
func eventError(err error) *apiError {
	switch {
	case errors.Is(err, actors.ErrNoRank), errors.Is(err, actors.ErrAPIServerGone):
		return &apiError{Status: http.StatusServiceUnavailable, Message: err.Error(), Type: "server_error", RetryAfter: 1}
	case errors.Is(err, actors.ErrRankFailed), errors.Is(err, actors.ErrRankLost):
		// The pinned rank is out of service; it may come back (a node
		// that hosts it rejoins, an operator restarts it), or the client
		// may pin another.
		return &apiError{Status: http.StatusServiceUnavailable, Message: err.Error(), Type: "server_error", Code: strp("rank_unavailable"), RetryAfter: 5}
	case errors.Is(err, actors.ErrRankNotServed):
		return badRequest(err.Error(), "X-data-parallel-rank")
	case errors.As(err, new(*actors.RefusedError)):
		return badRequest(err.Error(), "")
	default:
		return &apiError{Status: http.StatusInternalServerError, Message: err.Error(), Type: "server_error"}
	}
}

// generate submits a call's requests and answers from their stream.
func (s *Server) generate(w http.ResponseWriter, r *http.Request, g *genSpec) {
	choices := make([]*choice, len(g.prompts)*g.n)
	if !s.admit(len(choices)) {
		s.overloaded(w)
		return
	}
	defer s.release(len(choices))
	// Whatever ends this call, no request of it may keep an engine busy.
	defer func() {
		for _, c := range choices {
			if c != nil && !c.done {
				s.cfg.Backend.Abort(c.subID)
				s.cfg.Backend.Finished(actors.Outcome{Rank: c.rank, Reason: engine.FinishedAbort})
			}
		}
	}()
	stream := actors.NewStream()
	arrival := time.Now()
	if err := s.submit(g, choices, stream, arrival); err != nil {
		writeError(w, err)
		return
	}

	var out *sseWriter
	if g.stream {
		out = newSSEWriter(w, s.cfg.WriteTimeout)
		defer out.liftDeadline()
	}
	remaining := len(choices)
	// left counts each prompt's requests still running: the last to end
	// reports the call's n, as vLLM does once per prompt.
	left := make([]int, len(g.prompts))
	for i := range left {
		left[i] = g.n
	}
	var evs []actors.Event
	for remaining > 0 {
		var err error
		evs, err = stream.Next(r.Context(), evs)
		if err != nil {
			return // the client went away; the deferred aborts clean up
		}
		touched := evs[:0:0]
		for _, ev := range evs {
			c := choices[ev.Index]
			if c.done {
				continue
			}
			if ev.Err != nil || ev.Finish == engine.FinishedError {
				c.done = true
				failCall(w, out, eventError(ev.Err))
				return
			}
			if reason := s.take(g, c, ev); reason != engine.NotFinished {
				c.finish, c.done = finishName(reason), true
				remaining--
				s.finished(g, c, reason, choices, left, arrival)
			}
			touched = append(touched, ev)
		}
		if out != nil {
			s.streamChunks(out, g, choices, touched)
			if out.err != nil {
				// The client took nothing for the write timeout, or went
				// away: the deferred aborts free its engines' work.
				if errors.Is(out.err, os.ErrDeadlineExceeded) {
					s.cfg.Logger.Warn("dropped a client that read nothing of its stream for the write timeout",
						"id", g.id, "remote", r.RemoteAddr, "timeout", s.cfg.WriteTimeout)
				}
				return
			}
		}
	}
	u := g.usage(choices)
	if out != nil {
		if g.includeUsage {
			s.streamUsage(out, g, u)
		}
		out.done()
		return
	}
	s.respond(w, g, choices, u)
}

// finished records the end of choice c, which finished for reason: in the
// metrics, and in the request log when it is on.
func (s *Server) finished(g *genSpec, c *choice, reason engine.FinishReason, choices []*choice, left []int, arrival time.Time) {
	now := time.Now()
	o := actors.Outcome{Rank: c.rank, Reason: reason, PromptTokens: len(g.prompts[c.prompt].tokens), Latency: now.Sub(arrival),
		GenerationTokens: c.tokens, Queued: c.queued, MaxTokens: g.maxTokens}
	if !c.firstAt.IsZero() {
		o.FirstToken = c.firstAt.Sub(arrival)
	}
	if left[c.prompt]--; left[c.prompt] == 0 {
		o.N = g.n
		for _, o2 := range choices[c.prompt*g.n : (c.prompt+1)*g.n] {
			o.MaxGenerationTokens = max(o.MaxGenerationTokens, o2.tokens)
		}
	}
	s.cfg.Backend.Finished(o)
	if s.cfg.LogRequests {
		s.cfg.Logger.Info("request finished", "id", c.subID, "rank", c.rank, "prompt_tokens", o.PromptTokens, "cached_tokens", c.cached,
			"output_tokens", c.tokens, "ttft", o.FirstToken.Round(time.Microsecond), "e2e", o.Latency.Round(time.Microsecond),
			"finish_reason", c.finish, "moves", c.moves)
	}
}

// failCall answers a call one of whose requests failed: with the error's
// status before a stream started, as the stream's last event after.
func failCall(w http.ResponseWriter, out *sseWriter, e *apiError) {
	if out == nil || !out.started {
		writeError(w, e)
		return
	}
	out.data(errorBody{Error: e})
	out.done()
}

// submit sends one request per choice; the parallel samples of a prompt
// differ as if seeded apart.
func (s *Server) submit(g *genSpec, choices []*choice, stream *actors.Stream, arrival time.Time) *apiError {
	for i := range choices {
		pi := i / g.n
		sp := g.sampling[pi]
		if k := i % g.n; k > 0 {
			seed := int64(k)
			if sp.Seed != nil {
				seed += *sp.Seed
			}
			sp.Seed = &seed
		}
		c := &choice{subID: fmt.Sprintf("%s-%d", g.id, i), prompt: pi, rank: -1}
		if g.tools != nil {
			p, err := toolcall.New(g.tools.format, g.tools.opts)
			if err != nil {
				return &apiError{Status: http.StatusInternalServerError, Type: "server_error", Message: err.Error()}
			}
			c.calls = p
		}
		choices[i] = c
		s.cfg.Backend.Submit(&actors.Submission{
			ID: c.subID, Prompt: g.prompts[pi].tokens, Sampling: sp,
			Rank: g.rank, Stream: stream, Index: i, Arrival: arrival, CacheSalt: g.cacheSalt,
			// With no stream to write and no stop string to find, the
			// tokens are wanted at the end only: one event, not one per step.
			Whole: !g.stream && len(g.stops) == 0,
		})
	}
	return nil
}

// take adds an event's tokens to its choice and says how the choice
// finished: as the engine says, or stopped by a stop string (its request
// is aborted then), or NotFinished.
func (s *Server) take(g *genSpec, c *choice, ev actors.Event) engine.FinishReason {
	c.tokens += len(ev.Tokens)
	if g.tokenIDs || g.logprobs {
		c.ids = append(c.ids, ev.Tokens...)
	}
	if g.logprobs {
		c.lps = append(c.lps, ev.Logprobs...)
	}
	if g.promptLogprobs && c.promptLps == nil {
		c.promptLps = ev.PromptLogprobs
	}
	if len(ev.Tokens) > 0 {
		c.rank = ev.Rank
		c.queued = ev.Queued
		if c.firstAt.IsZero() {
			c.firstAt = time.Now()
		}
	}
	if !ev.FirstAt.IsZero() {
		// The API server saw the first token come: the better time, and
		// the only one for a call that reads its whole output at once.
		c.firstAt = ev.FirstAt
	}
	c.moves = ev.Moves
	if c.cached == 0 {
		c.cached = ev.NumCachedTokens
	}
	text := ev.Tokens
	if n := len(text); ev.Finish == engine.FinishedStop && n > 0 {
		// The engine stops on an end-of-sequence or a stop token: it ends
		// the text without being part of it, as in vLLM (it still counts
		// as a completion token).
		if slices.Contains(g.sampling[c.prompt].StopTokenIDs, text[n-1]) {
			c.stopReason = text[n-1]
		}
		if !g.includeStop {
			text = text[:n-1]
		}
	}
	final := ev.Finish != engine.NotFinished
	if delta := c.decodeText(g.decode, text, final); delta != "" && c.addText(delta, g.stops, g.includeStop) {
		s.cfg.Backend.Abort(c.subID)
		return engine.FinishedStop
	}
	return ev.Finish
}

func (g *genSpec) usage(choices []*choice) usage {
	var u usage
	for _, p := range g.prompts {
		u.PromptTokens += len(p.tokens)
	}
	cached := 0
	for i, c := range choices {
		u.CompletionTokens += c.tokens
		if i%g.n == 0 {
			cached += c.cached
		}
	}
	u.PromptTokensDetails = &promptTokensDetails{CachedTokens: cached}
	u.TotalTokens = u.PromptTokens + u.CompletionTokens
	return u
}

func (s *Server) respond(w http.ResponseWriter, g *genSpec, choices []*choice, u usage) {
	// A response of 128 choices of thousands of tokens is megabytes: a
	// client that does not read it must not keep its handler.
	defer s.writeDeadline(w)()
	if g.chat {
		resp := chatResponse{ID: g.id, Object: "chat.completion", Created: g.created, Model: g.model, Usage: u}
		if g.tokenIDs {
			resp.PromptTokenIDs = g.prompts[0].tokens
		}
		resp.PromptLogprobs = g.vllmPromptLogprobs(choices[0])
		for i, c := range choices {
			content := string(c.text)
			ch := chatChoice{Index: i, Message: chatMessageOut{Role: "assistant", Content: &content}, FinishReason: c.finish, StopReason: c.stopReason}
			if c.calls != nil {
				c.calls.Update(content, true)
				var calls []toolcall.Call
				content, calls = c.calls.Result()
				ch.Message.Content = &content
				if len(calls) > 0 {
					if content == "" {
						ch.Message.Content = nil
					}
					for _, call := range calls {
						ch.Message.ToolCalls = append(ch.Message.ToolCalls, toolCallOut{ID: toolcall.NewCallID(g.tools.format), Type: "function",
							Function: functionCall{Name: call.Name, Arguments: call.Arguments}})
					}
					ch.FinishReason = callsFinish(c.finish)
				}
			}
			if g.tokenIDs {
				ch.TokenIDs = c.ids
			}
			if g.logprobs {
				ch.Logprobs = s.chatLogprobs(g, c)
			}
			resp.Choices = append(resp.Choices, ch)
		}
		writeJSON(w, http.StatusOK, resp)
		return
	}
	resp := completionResponse{ID: g.id, Object: "text_completion", Created: g.created, Model: g.model, Usage: &u}
	for i, c := range choices {
		text := string(c.text)
		if g.echo {
			text = g.prompts[c.prompt].text + text
		}
		ch := completionChoice{Index: i, Text: text, FinishReason: strp(c.finish), StopReason: c.stopReason, PromptLogprobs: g.vllmPromptLogprobs(c)}
		if g.tokenIDs {
			ch.PromptTokenIDs, ch.TokenIDs = g.prompts[c.prompt].tokens, c.ids
		}
		if g.logprobs {
			ch.Logprobs = s.completionLogprobs(g, c)
		}
		resp.Choices = append(resp.Choices, ch)
	}
	writeJSON(w, http.StatusOK, resp)
}

// streamChunks writes one chunk per choice that has news in evs.
func (s *Server) streamChunks(out *sseWriter, g *genSpec, choices []*choice, evs []actors.Event) {
	if !out.started {
		out.start()
	}
	for _, ev := range evs {
		c := choices[ev.Index]
		if c.finishSent {
			continue
		}
		text := c.pending(g.stops)
		var calls []toolCallOut
		if c.calls != nil {
			c.parsed.WriteString(text)
			d := c.calls.Update(c.parsed.String(), c.done)
			text, calls = d.Content, c.callDeltas(g.tools.format, d.Calls)
		}
		if text == "" && len(calls) == 0 && !c.done && c.started {
			continue
		}
		var finish *string
		var stopReason any
		if c.done {
			finish, stopReason = strp(c.finish), c.stopReason
			if len(c.callIDs) > 0 {
				finish = strp(callsFinish(c.finish))
			}
		}
		var ids []uint32
		if g.tokenIDs {
			ids = c.ids[c.idsSent:]
			c.idsSent = len(c.ids)
		}
		if g.chat {
			ch := chatChunkChoice{Index: ev.Index, Delta: chatDelta{Content: &text, ToolCalls: calls}, FinishReason: finish, StopReason: stopReason, TokenIDs: ids}
			if text == "" && len(calls) > 0 {
				ch.Delta.Content = nil
			}
			if g.logprobs {
				ch.Logprobs = s.chatLogprobs(g, c)
			}
			if !c.started {
				ch.Delta.Role = "assistant"
			}
			out.data(chatChunk{ID: g.id, Object: "chat.completion.chunk", Created: g.created, Model: g.model, Choices: []chatChunkChoice{ch},
				PromptLogprobs: g.vllmPromptLogprobs(c)})
		} else {
			if !c.started && g.echo {
				text = g.prompts[c.prompt].text + text
			}
			ch := completionChoice{Index: ev.Index, Text: text, FinishReason: finish, StopReason: stopReason, TokenIDs: ids, PromptLogprobs: g.vllmPromptLogprobs(c)}
			if g.logprobs {
				ch.Logprobs = s.completionLogprobs(g, c)
			}
			if !c.started && g.tokenIDs {
				ch.PromptTokenIDs = g.prompts[c.prompt].tokens
			}
			out.data(completionResponse{ID: g.id, Object: "text_completion", Created: g.created, Model: g.model,
				Choices: []completionChoice{ch}})
		}
		c.started, c.finishSent = true, c.done
	}
	out.flush()
}

// callDeltas are the stream's news of c's tool calls: a call's first
// delta has its id, type and name.
func (c *choice) callDeltas(format toolcall.Format, ds []toolcall.CallDelta) []toolCallOut {
	var out []toolCallOut
	for _, d := range ds {
		o := toolCallOut{Index: &d.Index, Function: functionCall{Name: d.Name, Arguments: d.Arguments}}
		if d.Name != "" {
			c.callIDs = append(c.callIDs, toolcall.NewCallID(format))
			o.ID, o.Type = c.callIDs[len(c.callIDs)-1], "function"
		}
		out = append(out, o)
	}
	return out
}

// callsFinish is the finish reason of a message with tool calls: a model
// that stopped stopped to call them; one cut short says so.
func callsFinish(finish string) string {
	if finish == "stop" {
		return "tool_calls"
	}
	return finish
}

func (s *Server) streamUsage(out *sseWriter, g *genSpec, u usage) {
	if g.chat {
		out.data(chatChunk{ID: g.id, Object: "chat.completion.chunk", Created: g.created, Model: g.model, Choices: []chatChunkChoice{}, Usage: &u})
		return
	}
	out.data(completionResponse{ID: g.id, Object: "text_completion", Created: g.created, Model: g.model, Choices: []completionChoice{}, Usage: &u})
}

// finiteLogprob is a log-probability JSON can carry: -9999 for -inf, as
// vLLM writes it.
func finiteLogprob(x float32) float32 {
	if x < -9999 || x != x {
		return -9999
	}
	return x
}

func byteValues(s string) []int {
	out := make([]int, len(s))
	for i := range len(s) {
		out[i] = int(s[i])
	}
	return out
}

// tokenName is how log-probabilities name token id: its text, or
// "token_id:N" when the call asked (return_tokens_as_token_ids).
func (g *genSpec) tokenName(id uint32) string {
	if g.tokensAsIDs {
		return "token_id:" + strconv.FormatUint(uint64(id), 10)
	}
	return g.decode([]uint32{id})
}

// chatLogprobs are the log-probabilities of c's tokens not yet given to
// the client, in the chat shape.
func (s *Server) chatLogprobs(g *genSpec, c *choice) *chatLogprobs {
	out := &chatLogprobs{Content: []chatTokenLogprob{}}
	for i := c.lpsSent; i < len(c.lps) && i < len(c.ids); i++ {
		lp := c.lps[i]
		text := g.tokenName(c.ids[i])
		e := chatTokenLogprob{Token: text, Logprob: finiteLogprob(lp.Logprob), Bytes: byteValues(text),
			TopLogprobs: make([]chatTopLogprob, 0, len(lp.TopTokenIds))}
		for j, id := range lp.TopTokenIds[:min(len(lp.TopTokenIds), g.topLogprobs)] {
			t := g.tokenName(id)
			e.TopLogprobs = append(e.TopLogprobs, chatTopLogprob{Token: t, Logprob: finiteLogprob(lp.TopLogprobs[j]), Bytes: byteValues(t)})
		}
		out.Content = append(out.Content, e)
		c.lpsSent = i + 1
	}
	return out
}

// vllmPromptLogprobs are c's prompt log-probabilities in the shape of
// vLLM's prompt_logprobs, the first time they are there to give: for each
// prompt token but the first (null), its own entry and the promptTop most
// likely tokens', by token id. nil when not asked, not yet computed or
// already given. A chat's choices share one prompt, given once.
func (g *genSpec) vllmPromptLogprobs(c *choice) []map[string]promptLogprob {
	sent := &c.vllmPromptSent
	if g.chat {
		sent = &g.chatPromptSent
	}
	if g.promptTop < 0 || c.promptLps == nil || *sent {
		return nil
	}
	*sent = true
	prompt := g.prompts[c.prompt].tokens
	out := make([]map[string]promptLogprob, len(prompt))
	for j := 1; j < len(prompt) && j-1 < len(c.promptLps); j++ {
		lp := c.promptLps[j-1]
		m := make(map[string]promptLogprob, g.promptTop+1)
		for k, id := range lp.TopTokenIds[:min(len(lp.TopTokenIds), g.promptTop)] {
			m[strconv.FormatUint(uint64(id), 10)] = promptLogprob{Logprob: finiteLogprob(lp.TopLogprobs[k]), Rank: k + 1, DecodedToken: g.tokenName(id)}
		}
		id := prompt[j]
		m[strconv.FormatUint(uint64(id), 10)] = promptLogprob{Logprob: finiteLogprob(lp.Logprob), Rank: int(lp.Rank), DecodedToken: g.tokenName(id)}
		out[j] = m
	}
	return out
}

// completionLogprobs are the log-probabilities of c's tokens not yet
// given to the client, in the completions shape: the top alternatives
// hold the drawn token too, as vLLM's do.
func (s *Server) completionLogprobs(g *genSpec, c *choice) *completionLogprobs {
	out := &completionLogprobs{Tokens: []string{}, TokenLogprobs: []*float32{}, TopLogprobs: []map[string]float32{}, TextOffset: []int{}}
	add := func(id uint32, lp *engine.TokenLogprobs) {
		// With token ids for names, the offsets count their lengths,
		// as vLLM's do.
		text := g.tokenName(id)
		out.Tokens = append(out.Tokens, text)
		out.TextOffset = append(out.TextOffset, c.textOffset)
		c.textOffset += len(text)
		if lp == nil {
			// The prompt's first token has none.
			out.TokenLogprobs, out.TopLogprobs = append(out.TokenLogprobs, nil), append(out.TopLogprobs, nil)
			return
		}
		x := finiteLogprob(lp.Logprob)
		out.TokenLogprobs = append(out.TokenLogprobs, &x)
		top := make(map[string]float32, len(lp.TopTokenIds)+1)
		for j, t := range lp.TopTokenIds[:min(len(lp.TopTokenIds), g.topLogprobs)] {
			top[g.tokenName(t)] = finiteLogprob(lp.TopLogprobs[j])
		}
		top[text] = x
		out.TopLogprobs = append(out.TopLogprobs, top)
	}
	if g.echoLogprobs && !c.promptSent && c.promptLps != nil {
		// Echoed, the prompt's tokens come first: each one's given the
		// tokens before it, none for the first.
		c.promptSent = true
		for j, id := range g.prompts[c.prompt].tokens {
			var lp *engine.TokenLogprobs
			if j > 0 && j-1 < len(c.promptLps) {
				lp = c.promptLps[j-1]
			}
			add(id, lp)
		}
	}
	for i := c.lpsSent; i < len(c.lps) && i < len(c.ids); i++ {
		add(c.ids[i], c.lps[i])
		c.lpsSent = i + 1
	}
	return out
}
