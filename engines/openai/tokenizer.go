package openai

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	httpapi "github.com/dpnode/dpnode/http"
)

// tokenizeTimeout bounds one call to a server's tokenizer: a hung server
// costs this much once, then the next server answers (see pool).
const tokenizeTimeout = 10 * time.Second

// tokenize returns the token ids of text, by the server's /tokenize.
func (s *server) tokenize(ctx context.Context, text string, addSpecial bool) ([]uint32, error) {
	ctx, cancel := context.WithTimeout(ctx, tokenizeTimeout)
	defer cancel()
	if s.dialect == dialectLlamaServer {
		var out struct {
			Tokens []uint32 `json:"tokens"`
		}
		err := s.call(ctx, http.MethodPost, "/tokenize", map[string]any{"content": text, "add_special": addSpecial, "parse_special": true}, &out)
		return out.Tokens, err
	}
	var out struct {
		Tokens []uint32 `json:"tokens"`
	}
	err := s.call(ctx, http.MethodPost, "/tokenize", map[string]any{"model": s.model, "prompt": text, "add_special_tokens": addSpecial}, &out)
	return out.Tokens, err
}

// detokenize returns the text of ids, by the server's /detokenize.
func (s *server) detokenize(ctx context.Context, ids []uint32) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, tokenizeTimeout)
	defer cancel()
	var out struct {
		Prompt  *string `json:"prompt"`
		Content *string `json:"content"`
	}
	body := map[string]any{"tokens": ids}
	if s.dialect != dialectLlamaServer {
		body["model"] = s.model
	}
	if err := s.call(ctx, http.MethodPost, "/detokenize", body, &out); err != nil {
		return "", err
	}
	switch {
	case out.Prompt != nil:
		return *out.Prompt, nil
	case out.Content != nil:
		return *out.Content, nil
	}
	return "", fmt.Errorf("%s/detokenize answered no text", s.base)
}

// pool is the servers an API server tokenizes and renders chats with: the
// one that answered last, or the next when it fails, so that a dead or
// hung server costs one call's timeout, not every call.
//
// Concurrency: safe for concurrent use.
type pool struct {
	servers []*server
	mu      sync.Mutex
	current int
	// down is when each server may be tried again after failing.
	down []time.Time
}

// downFor is how long a server that failed a call is passed over.
const downFor = 10 * time.Second

func newPool(servers []*server, first int) *pool {
	return &pool{servers: servers, current: first, down: make([]time.Time, len(servers))}
}

// do calls fn with the servers in turn, from the current one, until one
// answers: its answer, or its refusal of the call (a 4xx), is returned.
func (p *pool) do(fn func(*server) error) error {
	p.mu.Lock()
	now := time.Now()
	order := make([]int, 0, len(p.servers))
	for k := range p.servers {
		if i := (p.current + k) % len(p.servers); !now.Before(p.down[i]) {
			order = append(order, i)
		}
	}
	if len(order) == 0 {
		// All failed lately: try them all again.
		for k := range p.servers {
			order = append(order, (p.current+k)%len(p.servers))
		}
	}
	p.mu.Unlock()
	var err error
	for _, i := range order {
		err = fn(p.servers[i])
		var se *statusError
		if err == nil || (errors.As(err, &se) && se.status < 500) {
			p.mu.Lock()
			p.current = i
			p.mu.Unlock()
			return err
		}
		p.mu.Lock()
		p.down[i] = time.Now().Add(downFor)
		p.mu.Unlock()
	}
	return err
}

// remoteTokenizer tokenizes with the servers' /tokenize and /detokenize,
// for an API server given no --tokenizer. Each token's text is asked once
// and kept: a stream's tokens decode from memory. A server's /detokenize
// answers text, so a token that is part of a UTF-8 character decodes, on
// its own, as U+FFFD: tokens among which one is kept as U+FFFD are asked
// together, which gives the character whole. The API server holds a
// streamed token whose text ends in U+FFFD until the next ones complete
// it; --tokenizer gives every byte exactly, without asking.
//
// Concurrency: safe for concurrent use.
type remoteTokenizer struct {
	servers *pool
	logger  *slog.Logger
	mu      sync.RWMutex
	pieces  map[uint32]string
}

func newRemoteTokenizer(servers *pool, logger *slog.Logger) *remoteTokenizer {
	return &remoteTokenizer{servers: servers, logger: logger, pieces: make(map[uint32]string)}
}

// maxPieces bounds the kept texts: far above any vocabulary.
const maxPieces = 1 << 20

func (t *remoteTokenizer) Encode(text string, addSpecial bool) ([]uint32, error) {
	var ids []uint32
	err := t.servers.do(func(s *server) (err error) {
		ids, err = s.tokenize(context.Background(), text, addSpecial)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("tokenizing with the engine's servers: %w", err)
	}
	if ids == nil {
		ids = []uint32{}
	}
	return ids, nil
}

// Decode returns the text of ids: from the kept texts when every one is
// known and none of several is partial; a single unknown token is asked
// and kept; a longer sequence with unknown or partial tokens is asked
// whole, which decodes characters split across its tokens exactly.
func (t *remoteTokenizer) Decode(ids []uint32) string {
	var b strings.Builder
	t.mu.RLock()
	known := true
	for _, id := range ids {
		p, ok := t.pieces[id]
		// A piece with U+FFFD in it is part of a character, alone.
		if !ok || (len(ids) > 1 && strings.ContainsRune(p, utf8.RuneError)) {
			known = false
			break
		}
		b.WriteString(p)
	}
	t.mu.RUnlock()
	if known {
		return b.String()
	}
	var text string
	err := t.servers.do(func(s *server) (err error) {
		text, err = s.detokenize(context.Background(), ids)
		return err
	})
	if err != nil {
		t.logger.Warn("decoding tokens with the engine's servers failed; their text is lost", "tokens", len(ids), "err", err)
		return ""
	}
	if len(ids) == 1 {
		t.mu.Lock()
		if len(t.pieces) < maxPieces {
			t.pieces[ids[0]] = text
		}
		t.mu.Unlock()
	}
	return text
}

// remoteTemplate renders chats with a server's own template: llama-server
// by /apply-template; vLLM and dpnode by /tokenize with the messages,
// whose tokens are read back as text.
//
// Concurrency: safe for concurrent use.
type remoteTemplate struct {
	servers *pool
}

// chatMessageJSON is a message as OpenAI's API writes it.
type chatMessageJSON struct {
	Role       string         `json:"role"`
	Content    string         `json:"content"`
	Name       string         `json:"name,omitempty"`
	ToolCalls  []toolCallJSON `json:"tool_calls,omitempty"`
	ToolCallID string         `json:"tool_call_id,omitempty"`
}

type toolCallJSON struct {
	ID       string `json:"id"`
	Type     string `json:"type"`
	Function struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

func (t *remoteTemplate) Render(msgs []httpapi.ChatMessage, tools []json.RawMessage) (string, error) {
	text, _, err := t.render(msgs, tools, false)
	return text, err
}

// RenderTokens renders with vLLM's and dpnode's /tokenize, which answers
// the tokens of the server's rendering, special tokens included; a
// llama-server's rendering is text, tokenized by its /tokenize.
func (t *remoteTemplate) RenderTokens(msgs []httpapi.ChatMessage, tools []json.RawMessage) (string, []uint32, error) {
	return t.render(msgs, tools, true)
}

func (t *remoteTemplate) render(msgs []httpapi.ChatMessage, tools []json.RawMessage, tokens bool) (text string, ids []uint32, err error) {
	err = t.servers.do(func(s *server) error {
		text, ids, err = t.renderWith(s, msgs, tools, tokens)
		return err
	})
	return text, ids, templateError(err)
}

func (t *remoteTemplate) renderWith(s *server, msgs []httpapi.ChatMessage, tools []json.RawMessage, tokens bool) (string, []uint32, error) {
	wire := make([]chatMessageJSON, len(msgs))
	for i, m := range msgs {
		wire[i] = chatMessageJSON{Role: m.Role, Content: m.Content, Name: m.Name, ToolCallID: m.ToolCallID}
		for _, c := range m.ToolCalls {
			tc := toolCallJSON{ID: c.ID, Type: "function"}
			tc.Function.Name, tc.Function.Arguments = c.Name, c.Arguments
			wire[i].ToolCalls = append(wire[i].ToolCalls, tc)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), tokenizeTimeout)
	defer cancel()
	if s.dialect == dialectLlamaServer {
		var out struct {
			Prompt string `json:"prompt"`
		}
		body := map[string]any{"messages": wire}
		if len(tools) > 0 {
			body["tools"] = tools
		}
		if err := s.call(ctx, http.MethodPost, "/apply-template", body, &out); err != nil {
			return "", nil, err
		}
		if !tokens {
			return out.Prompt, nil, nil
		}
		ids, err := s.tokenize(ctx, out.Prompt, false)
		if err != nil {
			return "", nil, err
		}
		return out.Prompt, ids, nil
	}
	var out struct {
		Tokens []uint32 `json:"tokens"`
	}
	body := map[string]any{"model": s.model, "messages": wire, "add_generation_prompt": true, "add_special_tokens": false}
	if len(tools) > 0 {
		body["tools"] = tools
	}
	if err := s.call(ctx, http.MethodPost, "/tokenize", body, &out); err != nil {
		return "", nil, err
	}
	text, err := s.detokenize(ctx, out.Tokens)
	if err != nil {
		return "", nil, err
	}
	return text, out.Tokens, nil
}

// templateError is a server's refusal of a conversation as the client's
// error (400), and anything else as the server's failure (502).
func templateError(err error) error {
	if err == nil {
		return nil
	}
	var se *statusError
	if errors.As(err, &se) && se.status < 500 {
		return fmt.Errorf("%w: %s", httpapi.ErrTemplate, se.msg)
	}
	return fmt.Errorf("%w: %w", httpapi.ErrTemplateServer, err)
}
