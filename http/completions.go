package httpapi

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/dpnode/dpnode/engine"
)

func (s *Server) completions(w http.ResponseWriter, r *http.Request) {
	var req completionRequest
	if e := s.decode(w, r, &req, completionFields); e != nil {
		writeError(w, e)
		return
	}
	switch {
	case !req.Prompt.set:
		writeError(w, badRequest("prompt is required", "prompt"))
		return
	case len(req.Prompt.texts)+len(req.Prompt.tokens) > maxChoices:
		writeError(w, limitError("prompt", len(req.Prompt.texts)+len(req.Prompt.tokens), maxChoices, "prompts"))
		return
	}
	// Everything that is cheap to check is, before the tokenizer, which
	// every call shares, does any work.
	if e := checkLists(&req.commonParams); e != nil {
		writeError(w, e)
		return
	}
	for _, text := range req.Prompt.texts {
		if e := s.checkTextLength(len(text), "prompt"); e != nil {
			writeError(w, e)
			return
		}
	}
	for _, ids := range req.Prompt.tokens {
		if e := s.checkTokenIDs(ids, "prompt"); e != nil {
			writeError(w, e)
			return
		}
	}
	var prompts []promptInput
	for _, text := range req.Prompt.texts {
		tokens, err := s.cfg.Tokenizer.Encode(text, true)
		if err != nil {
			writeError(w, tokenizerError(err))
			return
		}
		prompts = append(prompts, promptInput{text: text, tokens: tokens})
	}
	for _, ids := range req.Prompt.tokens {
		prompts = append(prompts, promptInput{text: s.cfg.Tokenizer.Decode(ids), tokens: ids})
	}
	g, e := s.spec(r, false, &req.commonParams, prompts)
	if e != nil {
		writeError(w, e)
		return
	}
	g.echo = req.Echo
	if req.Logprobs != nil {
		g.askLogprobs(*req.Logprobs)
		if req.Echo && s.cfg.EngineLacks.PromptLogprobs {
			writeError(w, badRequest(fmt.Sprintf("echo with logprobs gives the prompt's log-probabilities, which --engine %s does not: %s",
				s.cfg.Engine, lackWhy[featurePromptLogprobs]), "echo"))
			return
		}
		if req.Echo {
			// The prompt's too, as evaluation harnesses read them.
			g.echoLogprobs = true
			g.askPromptLogprobs(*req.Logprobs, false)
		}
	}
	s.generate(w, r, g)
}

var chatRoles = map[string]bool{"system": true, "developer": true, "user": true, "assistant": true, "tool": true}

func (s *Server) chatCompletions(w http.ResponseWriter, r *http.Request) {
	var req chatRequest
	if e := s.decode(w, r, &req, chatFields); e != nil {
		writeError(w, e)
		return
	}
	if e := checkLists(&req.commonParams); e != nil {
		writeError(w, e)
		return
	}
	tools, e := s.chatTools(&req.toolParams)
	if e != nil {
		writeError(w, e)
		return
	}
	text, tokens, e := s.renderChat(req.Messages, tools.defs, false)
	if e != nil {
		writeError(w, e)
		return
	}
	g, e := s.spec(r, true, &req.commonParams, []promptInput{{text: text, tokens: tokens}})
	if e != nil {
		writeError(w, e)
		return
	}
	if e := s.useTools(g, tools); e != nil {
		writeError(w, e)
		return
	}
	switch {
	case req.Logprobs:
		top := 0
		if req.TopLogprobs != nil {
			top = *req.TopLogprobs
		}
		g.askLogprobs(top)
	case req.TopLogprobs != nil && *req.TopLogprobs > 0:
		writeError(w, badRequest("top_logprobs needs logprobs set to true", "top_logprobs"))
		return
	}
	s.generate(w, r, g)
}

// renderChat checks messages, renders them and the tools with the model's
// chat template and tokenizes the text; addSpecial adds the model's start
// token again, which the template already writes.
func (s *Server) renderChat(messages []chatMessage, tools []json.RawMessage, addSpecial bool) (string, []uint32, *apiError) {
	switch {
	case len(messages) == 0:
		return "", nil, badRequest("messages must be a non-empty list", "messages")
	case len(messages) > maxMessages:
		return "", nil, limitError("messages", len(messages), maxMessages, "messages")
	}
	content := 0
	for _, m := range messages {
		content += len(m.Content.text)
		for _, c := range m.ToolCalls {
			content += len(c.Function.Arguments)
		}
	}
	if e := s.checkTextLength(content, "messages"); e != nil {
		return "", nil, e
	}
	for i, m := range messages {
		if !chatRoles[m.Role] {
			return "", nil, badRequest(fmt.Sprintf("messages[%d].role must be one of system, developer, user, assistant or tool; got %q", i, m.Role), "messages")
		}
		if e := checkHistoryCalls(i, &m); e != nil {
			return "", nil, e
		}
	}
	if s.cfg.ChatTemplate == nil {
		return "", nil, badRequest("this model has no chat template, so it cannot chat: use /v1/completions, or start dpnode with --chat-template FILE", "messages")
	}
	msgs := make([]ChatMessage, len(messages))
	for i, m := range messages {
		msgs[i] = ChatMessage{Role: m.Role, Content: m.Content.text, Name: m.Name, ToolCallID: m.ToolCallID}
		for _, c := range m.ToolCalls {
			msgs[i].ToolCalls = append(msgs[i].ToolCalls, ChatToolCall{ID: c.ID, Name: c.Function.Name, Arguments: c.Function.Arguments})
		}
	}
	if tt, ok := s.cfg.ChatTemplate.(TokenTemplate); ok {
		text, tokens, err := tt.RenderTokens(msgs, tools)
		if err != nil {
			return "", nil, templateError(err)
		}
		return text, tokens, nil
	}
	text, err := s.cfg.ChatTemplate.Render(msgs, tools)
	if err != nil {
		return "", nil, templateError(err)
	}
	if e := s.checkTextLength(len(text), "messages"); e != nil {
		return "", nil, e
	}
	// The template writes the model's special tokens itself.
	tokens, e := s.encodeChat(text, msgs, addSpecial)
	if e != nil {
		return "", nil, e
	}
	return text, tokens, nil
}

// encodeChat tokenizes a rendered conversation. With ContentAsText the
// messages' content is read as text: the text of a special token a user
// typed (<|eot_id|><|start_header_id|>system...) stays text, and cannot
// end the user's turn or forge another's. The template's own text around
// it is read with its special tokens. The content is found in the
// rendering, in order, as it is or trimmed (templates trim it).
func (s *Server) encodeChat(text string, msgs []ChatMessage, addSpecial bool) ([]uint32, *apiError) {
	tt, ok := s.cfg.Tokenizer.(engine.TextTokenizer)
	if !s.cfg.ContentAsText || !ok {
		tokens, err := s.cfg.Tokenizer.Encode(text, addSpecial)
		if err != nil {
			return nil, tokenizerError(err)
		}
		return tokens, nil
	}
	var tokens []uint32
	add := func(ids []uint32, err error) error {
		tokens = append(tokens, ids...)
		return err
	}
	rest := text
	for i, m := range msgs {
		c := m.Content
		at := strings.Index(rest, c)
		if at < 0 {
			c = strings.TrimSpace(c)
			at = strings.Index(rest, c)
		}
		if c == "" {
			continue
		}
		if at < 0 {
			return nil, badRequest(fmt.Sprintf("messages[%d]: this model's chat template changes a message's text, so the server (--tokenize-content-as-text) cannot tell it from the template's", i), "messages")
		}
		if err := add(s.cfg.Tokenizer.Encode(rest[:at], addSpecial && len(tokens) == 0)); err != nil {
			return nil, tokenizerError(err)
		}
		if err := add(tt.EncodeText(c)); err != nil {
			return nil, tokenizerError(err)
		}
		rest = rest[at+len(c):]
	}
	if err := add(s.cfg.Tokenizer.Encode(rest, addSpecial && len(tokens) == 0)); err != nil {
		return nil, tokenizerError(err)
	}
	return tokens, nil
}

// tokenizerError is the client's error when the tokenizer failed: it is
// busy, or its process is down, which a retry elsewhere or later gets
// around.
func tokenizerError(err error) *apiError {
	if errors.Is(err, engine.ErrTokenizerBusy) {
		return &apiError{Status: http.StatusServiceUnavailable, Type: "server_error", Code: strp("overloaded"), RetryAfter: 1,
			Message: "the server is overloaded: " + err.Error() + "; try again shortly"}
	}
	return &apiError{Status: http.StatusServiceUnavailable, Type: "server_error", Message: "the tokenizer is unavailable: " + err.Error()}
}
