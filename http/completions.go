package httpapi

import (
	"fmt"
	"net/http"
)

func (s *Server) completions(w http.ResponseWriter, r *http.Request) {
	var req completionRequest
	if e := s.decode(w, r, &req); e != nil {
		writeError(w, e)
		return
	}
	switch {
	case !req.Prompt.set:
		writeError(w, badRequest("prompt is required", "prompt"))
		return
	case req.Logprobs != nil && *req.Logprobs > 0:
		writeError(w, badRequest("logprobs are not supported by this server", "logprobs"))
		return
	case req.Suffix != nil && *req.Suffix != "":
		writeError(w, badRequest("suffix is not supported by this server", "suffix"))
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
	s.generate(w, r, g)
}

var chatRoles = map[string]bool{"system": true, "developer": true, "user": true, "assistant": true, "tool": true}

func (s *Server) chatCompletions(w http.ResponseWriter, r *http.Request) {
	var req chatRequest
	if e := s.decode(w, r, &req); e != nil {
		writeError(w, e)
		return
	}
	switch {
	case len(req.Messages) == 0:
		writeError(w, badRequest("messages must be a non-empty list", "messages"))
		return
	case req.Logprobs:
		writeError(w, badRequest("logprobs are not supported by this server", "logprobs"))
		return
	case len(req.Messages) > maxMessages:
		writeError(w, limitError("messages", len(req.Messages), maxMessages, "messages"))
		return
	}
	if e := checkLists(&req.commonParams); e != nil {
		writeError(w, e)
		return
	}
	content := 0
	for _, m := range req.Messages {
		content += len(m.Content.text)
	}
	if e := s.checkTextLength(content, "messages"); e != nil {
		writeError(w, e)
		return
	}
	for i, m := range req.Messages {
		if !chatRoles[m.Role] {
			writeError(w, badRequest(fmt.Sprintf("messages[%d].role must be one of system, developer, user, assistant or tool; got %q", i, m.Role), "messages"))
			return
		}
	}
	if s.cfg.ChatTemplate == nil {
		writeError(w, badRequest("this model has no chat template, so it cannot chat: use /v1/completions, or start dpnode with --chat-template FILE", "messages"))
		return
	}
	msgs := make([]ChatMessage, len(req.Messages))
	for i, m := range req.Messages {
		msgs[i] = ChatMessage{Role: m.Role, Content: m.Content.text, Name: m.Name}
	}
	text, err := s.cfg.ChatTemplate.Render(msgs)
	if err != nil {
		writeError(w, badRequest(err.Error(), "messages"))
		return
	}
	if e := s.checkTextLength(len(text), "messages"); e != nil {
		writeError(w, e)
		return
	}
	// The template writes the model's special tokens itself.
	tokens, err := s.cfg.Tokenizer.Encode(text, false)
	if err != nil {
		writeError(w, tokenizerError(err))
		return
	}
	g, e := s.spec(r, true, &req.commonParams, []promptInput{{text: text, tokens: tokens}})
	if e != nil {
		writeError(w, e)
		return
	}
	s.generate(w, r, g)
}

// tokenizerError is the client's error when the tokenizer failed: its
// process is down, which a retry elsewhere or later gets around.
func tokenizerError(err error) *apiError {
	return &apiError{Status: http.StatusServiceUnavailable, Type: "server_error", Message: "the tokenizer is unavailable: " + err.Error()}
}
