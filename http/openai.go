package httpapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
)

// promptField is a completion prompt: a string, a list of strings, a list
// of token ids, or a list of token-id lists.
type promptField struct {
	texts  []string
	tokens [][]uint32
	set    bool
}

func (p *promptField) UnmarshalJSON(b []byte) error {
	p.set = true
	b = bytes.TrimSpace(b)
	switch {
	case bytes.Equal(b, []byte("null")):
		p.set = false
		return nil
	case len(b) > 0 && b[0] == '"':
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
		p.texts = []string{s}
		return nil
	}
	if len(b) == 0 || b[0] != '[' {
		return errors.New("prompt must be a string, a list of strings, a list of token ids or a list of such lists")
	}
	// The first element's first byte tells the list's kind: the
	// decoder runs once, on the right type.
	switch first := bytes.TrimLeft(b[1:], " \t\r\n"); {
	case len(first) > 0 && first[0] == ']':
		return errors.New("prompt must not be an empty list")
	case len(first) > 0 && first[0] == '"':
		if err := json.Unmarshal(b, &p.texts); err != nil {
			return errors.New("prompt must be a string, a list of strings, a list of token ids or a list of such lists")
		}
		return nil
	case len(first) > 0 && first[0] == '[':
		if err := json.Unmarshal(b, &p.tokens); err != nil {
			return errors.New("prompt must be a string, a list of strings, a list of token ids or a list of such lists")
		}
		return nil
	default:
		ids, ok := tokenIDs(b)
		if !ok {
			return errors.New("prompt token ids must be non-negative integers")
		}
		p.tokens = [][]uint32{ids}
		return nil
	}
}

// tokenIDs reads a JSON list of non-negative integers that fit in 32 bits,
// the common prompt of a benchmark or a client that tokenizes itself, without
// reflection. It reports false for anything else (a fraction, an exponent,
// a sign, a number too large, another element), which the caller refuses.
func tokenIDs(b []byte) ([]uint32, bool) {
	ids := make([]uint32, 0, bytes.Count(b, []byte(","))+1)
	i := 1 // past '['
	skip := func() {
		for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\r' || b[i] == '\n') {
			i++
		}
	}
	for {
		skip()
		start := i
		var v uint64
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			v = v*10 + uint64(b[i]-'0')
			if v > math.MaxUint32 {
				return nil, false
			}
			i++
		}
		// JSON allows no leading zero but in 0 itself.
		if i == start || (b[start] == '0' && i-start > 1) {
			return nil, false
		}
		ids = append(ids, uint32(v))
		skip()
		if i >= len(b) {
			return nil, false
		}
		switch b[i] {
		case ',':
			i++
		case ']':
			i++
			skip()
			return ids, i == len(b)
		default:
			return nil, false
		}
	}
}

// stopField is a stop string or a list of them.
type stopField []string

func (s *stopField) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	if bytes.Equal(b, []byte("null")) {
		*s = nil
		return nil
	}
	if len(b) > 0 && b[0] == '"' {
		var one string
		if err := json.Unmarshal(b, &one); err != nil {
			return err
		}
		*s = stopField{one}
		return nil
	}
	var many []string
	if err := json.Unmarshal(b, &many); err != nil {
		return errors.New("stop must be a string or a list of strings")
	}
	*s = many
	return nil
}

// contentField is a chat message's content: a string or a list of parts,
// of which text parts are read.
type contentField struct {
	text string
}

func (c *contentField) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	switch {
	case bytes.Equal(b, []byte("null")):
		return nil
	case len(b) > 0 && b[0] == '"':
		return json.Unmarshal(b, &c.text)
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if err := json.Unmarshal(b, &parts); err != nil {
		return errors.New("message content must be a string or a list of content parts")
	}
	if len(parts) > maxContentParts {
		return fmt.Errorf("message content has %d parts; at most %d are allowed", len(parts), maxContentParts)
	}
	// Joined once, in time linear in the text, however many parts.
	size := 0
	for _, p := range parts {
		if p.Type != "text" {
			return errors.New("only text content parts are supported; got a part of type " + p.Type)
		}
		size += len(p.Text)
	}
	var sb strings.Builder
	sb.Grow(size)
	for _, p := range parts {
		sb.WriteString(p.Text)
	}
	c.text = sb.String()
	return nil
}

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

// commonParams are the fields both endpoints take and apply. What every
// other field does is in fields.go's tables, which also check the ranges
// of the penalties and min_p.
type commonParams struct {
	Model               string             `json:"model"`
	MaxTokens           *int               `json:"max_tokens"`
	MaxCompletionTokens *int               `json:"max_completion_tokens"`
	MinTokens           int                `json:"min_tokens"`
	Temperature         *float64           `json:"temperature"`
	TopP                *float64           `json:"top_p"`
	TopK                *int               `json:"top_k"`
	N                   *int               `json:"n"`
	Stream              bool               `json:"stream"`
	StreamOptions       *streamOptions     `json:"stream_options"`
	Stop                stopField          `json:"stop"`
	StopTokenIDs        []uint32           `json:"stop_token_ids"`
	IncludeStopStr      bool               `json:"include_stop_str_in_output"`
	Seed                *int64             `json:"seed"`
	IgnoreEOS           bool               `json:"ignore_eos"`
	LogitBias           map[string]float64 `json:"logit_bias"`
	PresencePenalty     *float64           `json:"presence_penalty"`
	FrequencyPenalty    *float64           `json:"frequency_penalty"`
	RepetitionPenalty   *float64           `json:"repetition_penalty"`
	MinP                *float64           `json:"min_p"`
	// SkipSpecialTokens false writes special tokens as their text.
	SkipSpecialTokens *bool `json:"skip_special_tokens"`
	// CacheSalt keeps the call's prefix-cache blocks apart from other
	// salts' (vLLM's cache_salt): a tenant that sends its own salt neither
	// hits nor learns of another's cached prompts through cached_tokens.
	CacheSalt *string `json:"cache_salt"`
	// ReturnTokenIDs adds the prompt's and the completion's token ids to
	// the response, as vLLM's return_token_ids does.
	ReturnTokenIDs bool `json:"return_token_ids"`
	// ReturnTokensAsTokenIDs names the tokens of log-probabilities
	// "token_id:N" rather than by their text, as vLLM's
	// return_tokens_as_token_ids does: a token that is part of a
	// character, or whose text another token shares, is then known.
	ReturnTokensAsTokenIDs bool `json:"return_tokens_as_token_ids"`
	// PromptLogprobs asks for vLLM's prompt_logprobs: each prompt token's
	// log-probability and rank, and this many more likely tokens'.
	PromptLogprobs *int `json:"prompt_logprobs"`
	structuredParams
}

type chatMessage struct {
	Role    string       `json:"role"`
	Content contentField `json:"content"`
	Name    string       `json:"name"`
	// ToolCalls are an assistant message's calls; ToolCallID is the call
	// a tool message answers.
	ToolCalls  []toolCallIn `json:"tool_calls"`
	ToolCallID string       `json:"tool_call_id"`
}

// toolCallIn is a call in an assistant message of the history.
type toolCallIn struct {
	ID       string `json:"id"`
	Type     string `json:"type"`
	Function struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

type chatRequest struct {
	commonParams
	Messages    []chatMessage `json:"messages"`
	Logprobs    bool          `json:"logprobs"`
	TopLogprobs *int          `json:"top_logprobs"`
	toolParams
}

type completionRequest struct {
	commonParams
	Prompt   promptField `json:"prompt"`
	Echo     bool        `json:"echo"`
	Logprobs *int        `json:"logprobs"`
}

type usage struct {
	PromptTokens        int                  `json:"prompt_tokens"`
	CompletionTokens    int                  `json:"completion_tokens"`
	TotalTokens         int                  `json:"total_tokens"`
	PromptTokensDetails *promptTokensDetails `json:"prompt_tokens_details,omitempty"`
}

// promptTokensDetails reports prefix-cache hits, as OpenAI does.
type promptTokensDetails struct {
	CachedTokens int `json:"cached_tokens"`
}

type chatMessageOut struct {
	Role string `json:"role"`
	// Content is null when the message is tool calls only.
	Content   *string       `json:"content"`
	ToolCalls []toolCallOut `json:"tool_calls,omitempty"`
}

// toolCallOut is a call the model made, whole or (streamed) in part.
type toolCallOut struct {
	// Index is the call's place among the message's calls: streamed
	// deltas only.
	Index    *int         `json:"index,omitempty"`
	ID       string       `json:"id,omitempty"`
	Type     string       `json:"type,omitempty"`
	Function functionCall `json:"function"`
}

type functionCall struct {
	Name      string `json:"name,omitempty"`
	Arguments string `json:"arguments"`
}

type chatChoice struct {
	Index        int            `json:"index"`
	Message      chatMessageOut `json:"message"`
	Logprobs     *chatLogprobs  `json:"logprobs"`
	FinishReason string         `json:"finish_reason"`
	// StopReason is vLLM's: the stop string or token id that matched.
	StopReason any      `json:"stop_reason"`
	TokenIDs   []uint32 `json:"token_ids,omitempty"`
}

type chatResponse struct {
	ID             string       `json:"id"`
	Object         string       `json:"object"`
	Created        int64        `json:"created"`
	Model          string       `json:"model"`
	Choices        []chatChoice `json:"choices"`
	Usage          usage        `json:"usage"`
	PromptTokenIDs []uint32     `json:"prompt_token_ids,omitempty"`
	// PromptLogprobs are vLLM's, when asked.
	PromptLogprobs []map[string]promptLogprob `json:"prompt_logprobs,omitempty"`
}

// promptLogprob is one entry of vLLM's prompt_logprobs: a token's
// log-probability at a prompt position, its rank there, and its text.
type promptLogprob struct {
	Logprob      float32 `json:"logprob"`
	Rank         int     `json:"rank"`
	DecodedToken string  `json:"decoded_token"`
}

type chatDelta struct {
	Role      string        `json:"role,omitempty"`
	Content   *string       `json:"content,omitempty"`
	ToolCalls []toolCallOut `json:"tool_calls,omitempty"`
}

type chatChunkChoice struct {
	Index        int           `json:"index"`
	Delta        chatDelta     `json:"delta"`
	Logprobs     *chatLogprobs `json:"logprobs"`
	FinishReason *string       `json:"finish_reason"`
	StopReason   any           `json:"stop_reason"`
	TokenIDs     []uint32      `json:"token_ids,omitempty"`
}

type chatChunk struct {
	ID             string                     `json:"id"`
	Object         string                     `json:"object"`
	Created        int64                      `json:"created"`
	Model          string                     `json:"model"`
	Choices        []chatChunkChoice          `json:"choices"`
	Usage          *usage                     `json:"usage,omitempty"`
	PromptLogprobs []map[string]promptLogprob `json:"prompt_logprobs,omitempty"`
}

type completionChoice struct {
	Index          int                 `json:"index"`
	Text           string              `json:"text"`
	Logprobs       *completionLogprobs `json:"logprobs"`
	FinishReason   *string             `json:"finish_reason"`
	StopReason     any                 `json:"stop_reason"`
	PromptTokenIDs []uint32            `json:"prompt_token_ids,omitempty"`
	TokenIDs       []uint32            `json:"token_ids,omitempty"`
	// PromptLogprobs are vLLM's, when asked.
	PromptLogprobs []map[string]promptLogprob `json:"prompt_logprobs,omitempty"`
}

type completionResponse struct {
	ID      string             `json:"id"`
	Object  string             `json:"object"`
	Created int64              `json:"created"`
	Model   string             `json:"model"`
	Choices []completionChoice `json:"choices"`
	Usage   *usage             `json:"usage,omitempty"`
}

type modelCard struct {
	ID          string `json:"id"`
	Object      string `json:"object"`
	Created     int64  `json:"created"`
	OwnedBy     string `json:"owned_by"`
	Root        string `json:"root"`
	MaxModelLen int    `json:"max_model_len"`
}

type modelList struct {
	Object string      `json:"object"`
	Data   []modelCard `json:"data"`
}

// chatLogprobs are a chat choice's log-probabilities, OpenAI's shape.
type chatLogprobs struct {
	Content []chatTokenLogprob `json:"content"`
}

type chatTokenLogprob struct {
	Token       string           `json:"token"`
	Logprob     float32          `json:"logprob"`
	Bytes       []int            `json:"bytes"`
	TopLogprobs []chatTopLogprob `json:"top_logprobs"`
}

type chatTopLogprob struct {
	Token   string  `json:"token"`
	Logprob float32 `json:"logprob"`
	Bytes   []int   `json:"bytes"`
}

// completionLogprobs are a completion choice's, the legacy shape: each
// token's text, log-probability, most likely alternatives (the drawn token
// among them) and offset in the choice's text.
type completionLogprobs struct {
	Tokens        []string             `json:"tokens"`
	TokenLogprobs []*float32           `json:"token_logprobs"`
	TopLogprobs   []map[string]float32 `json:"top_logprobs"`
	TextOffset    []int                `json:"text_offset"`
}
