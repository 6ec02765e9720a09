package httpapi

import (
	"fmt"
	"net/http"
	"strings"
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
	}
	var prompts []promptInput
	for _, text := range req.Prompt.texts {
		prompts = append(prompts, promptInput{text: text, tokens: s.cfg.Tokenizer.Encode(text)})
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
	}
	for i, m := range req.Messages {
		if !chatRoles[m.Role] {
			writeError(w, badRequest(fmt.Sprintf("messages[%d].role must be one of system, developer, user, assistant or tool; got %q", i, m.Role), "messages"))
			return
		}
	}
	text := chatTemplate(req.Messages)
	g, e := s.spec(r, true, &req.commonParams, []promptInput{{text: text, tokens: s.cfg.Tokenizer.Encode(text)}})
	if e != nil {
		writeError(w, e)
		return
	}
	s.generate(w, r, g)
}

// chatTemplate renders messages in the Llama 3 chat format, ending with
// the header of the assistant's turn.
func chatTemplate(msgs []chatMessage) string {
	var b strings.Builder
	b.WriteString("<|begin_of_text|>")
	for _, m := range msgs {
		b.WriteString("<|start_header_id|>")
		b.WriteString(m.Role)
		b.WriteString("<|end_header_id|>\n\n")
		b.WriteString(m.Content.text)
		b.WriteString("<|eot_id|>")
	}
	b.WriteString("<|start_header_id|>assistant<|end_header_id|>\n\n")
	return b.String()
}
