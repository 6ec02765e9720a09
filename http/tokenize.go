package httpapi

import (
	"encoding/json"
	"net/http"
	"strings"
)

// vLLM's /tokenize and /detokenize, which clients use to count tokens as
// the model does: a prompt (add_special_tokens true by default) or chat
// messages (rendered with the model's template, add_special_tokens false).

type tokenizeRequest struct {
	Model            string            `json:"model"`
	Prompt           *string           `json:"prompt"`
	Messages         []chatMessage     `json:"messages"`
	Tools            []json.RawMessage `json:"tools"`
	AddSpecialTokens *bool             `json:"add_special_tokens"`
}

type tokenizeResponse struct {
	Count       int      `json:"count"`
	MaxModelLen int      `json:"max_model_len"`
	Tokens      []uint32 `json:"tokens"`
	TokenStrs   []string `json:"token_strs"`
}

var tokenizeFields = newFieldTable("tokenize", []fieldRule{
	applied("model"),
	applied("prompt"),
	applied("messages"),
	applied("add_special_tokens"),
	refused("return_token_strs", nullOrBool(false), "the tokenizer gives each token's text, not its vocabulary's token strings"),
	refused("add_generation_prompt", nullOrBool(true), "the template always ends with the start of the assistant's turn"),
	refused("continue_final_message", nullOrBool(false), "the template always ends with the start of the assistant's turn"),
	refused("chat_template", isNull, "the model's chat template (or --chat-template) renders every chat"),
	refused("chat_template_kwargs", nullOrEmpty, "the chat template is rendered with the messages only"),
	applied("tools").notSimulated(nullOrEmpty, whyTools),
	refused("mm_processor_kwargs", nullOrEmpty, "this server takes text only"),
})

func (s *Server) tokenize(w http.ResponseWriter, r *http.Request) {
	var req tokenizeRequest
	if e := s.decode(w, r, &req, tokenizeFields); e != nil {
		writeError(w, e)
		return
	}
	if e := s.checkModel(req.Model); e != nil {
		writeError(w, e)
		return
	}
	var tokens []uint32
	switch {
	case req.Prompt != nil && req.Messages != nil:
		writeError(w, badRequest("give either prompt or messages, not both", "messages"))
		return
	case req.Prompt != nil:
		if e := s.checkTextLength(len(*req.Prompt), "prompt"); e != nil {
			writeError(w, e)
			return
		}
		var err error
		tokens, err = s.cfg.Tokenizer.Encode(*req.Prompt, req.AddSpecialTokens == nil || *req.AddSpecialTokens)
		if err != nil {
			writeError(w, tokenizerError(err))
			return
		}
	case req.Messages != nil:
		tools, e := s.chatTools(&toolParams{Tools: req.Tools, ToolChoice: json.RawMessage(`"none"`)})
		if e != nil {
			writeError(w, e)
			return
		}
		_, tokens, e = s.renderChat(req.Messages, tools.defs, req.AddSpecialTokens != nil && *req.AddSpecialTokens)
		if e != nil {
			writeError(w, e)
			return
		}
	default:
		writeError(w, badRequest("prompt or messages is required", "prompt"))
		return
	}
	if tokens == nil {
		tokens = []uint32{}
	}
	writeJSON(w, http.StatusOK, tokenizeResponse{Count: len(tokens), MaxModelLen: s.cfg.MaxModelLen, Tokens: tokens})
}

type detokenizeRequest struct {
	Model  string   `json:"model"`
	Tokens []uint32 `json:"tokens"`
}

var detokenizeFields = newFieldTable("detokenize", []fieldRule{applied("model"), applied("tokens")})

func (s *Server) detokenize(w http.ResponseWriter, r *http.Request) {
	var req detokenizeRequest
	if e := s.decode(w, r, &req, detokenizeFields); e != nil {
		writeError(w, e)
		return
	}
	if e := s.checkModel(req.Model); e != nil {
		writeError(w, e)
		return
	}
	if req.Tokens == nil {
		writeError(w, badRequest("tokens is required", "tokens"))
		return
	}
	if len(req.Tokens) > s.cfg.MaxModelLen {
		writeError(w, limitError("tokens", len(req.Tokens), s.cfg.MaxModelLen, "tokens"))
		return
	}
	if e := s.checkTokenIDs(req.Tokens, "tokens"); e != nil {
		writeError(w, e)
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"prompt": s.cfg.Tokenizer.Decode(req.Tokens)})
}

// model answers GET /v1/models/{id}: the model card, or 404 for another
// model. Model names hold slashes, so the id is the rest of the path.
func (s *Server) model(w http.ResponseWriter, r *http.Request) {
	id := strings.TrimPrefix(r.URL.Path, "/v1/models/")
	if e := s.checkModel(id); e != nil || id == "" {
		if e == nil {
			e = &apiError{Status: http.StatusNotFound, Type: "invalid_request_error", Message: "no model id in the path: GET /v1/models/{id}"}
		}
		writeError(w, e)
		return
	}
	writeJSON(w, http.StatusOK, s.modelCard())
}
