package httpapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/ardanlabs/jinja"
)

// ChatMessage is one message of a conversation, as a chat template sees
// it.
type ChatMessage struct {
	Role    string
	Content string
	Name    string
	// ToolCalls are an assistant message's calls; ToolCallID is the call a
	// tool message answers.
	ToolCalls  []ChatToolCall
	ToolCallID string
}

// ChatToolCall is a call an assistant message made.
type ChatToolCall struct {
	ID   string
	Name string
	// Arguments is the JSON text of the arguments. An object is given to
	// the template as a mapping, as Hugging Face's templates expect;
	// anything else as the string it is.
	Arguments string
}

// ChatTemplate renders a conversation, and the tools the model may call
// (each an OpenAI tool definition as JSON, nil for none), as the prompt
// text the model continues, ending with the start of the assistant's turn.
//
// Concurrency: safe for concurrent use.
type ChatTemplate interface {
	Render(msgs []ChatMessage, tools []json.RawMessage) (string, error)
}

// TokenTemplate is a ChatTemplate that renders a conversation straight to
// token ids, the model's special tokens included: a server's own
// template, which answers tokens. Its text is for reading only.
//
// Concurrency: safe for concurrent use.
type TokenTemplate interface {
	ChatTemplate
	RenderTokens(msgs []ChatMessage, tools []json.RawMessage) (string, []uint32, error)
}

// ErrTemplate marks a conversation the template refuses (a role out of
// order, say): the client's error, answered with 400.
var ErrTemplate = errors.New("the chat template refused the conversation")

// ErrTemplateServer marks a failure of the server that renders chats for
// a template (TokenTemplate), not of the conversation: answered with 502.
var ErrTemplateServer = errors.New("the server that renders chats failed")

// templateError answers a template's failure: the conversation's (400),
// unless the server that renders it failed (502).
func templateError(err error) *apiError {
	if errors.Is(err, ErrTemplateServer) {
		return &apiError{Status: http.StatusBadGateway, Message: err.Error(), Type: "server_error"}
	}
	return badRequest(err.Error(), "messages")
}

// JinjaTemplate renders a model's own chat template (tokenizer.chat_template
// in its GGUF, or --chat-template), as Hugging Face's apply_chat_template
// does: Jinja with trim_blocks and lstrip_blocks, the messages in order,
// the tools as the client sent them, add_generation_prompt true, and the
// model's BOS and EOS tokens as text.
type JinjaTemplate struct {
	tmpl     *jinja.Template
	src      string
	bos, eos string
}

var _ ChatTemplate = (*JinjaTemplate)(nil)

// NewJinjaTemplate compiles src.
func NewJinjaTemplate(src, bosToken, eosToken string) (*JinjaTemplate, error) {
	t, err := jinja.Compile(src)
	if err != nil {
		return nil, fmt.Errorf("httpapi: the chat template does not compile: %w", err)
	}
	return &JinjaTemplate{tmpl: t, src: src, bos: bosToken, eos: eosToken}, nil
}

// Source is the template's text.
func (t *JinjaTemplate) Source() string { return t.src }

// Render implements ChatTemplate.
func (t *JinjaTemplate) Render(msgs []ChatMessage, tools []json.RawMessage) (string, error) {
	list := make([]jinja.Value, len(msgs))
	for i, m := range msgs {
		// In the order vLLM gives a message its keys: templates that
		// print a message whole print it so. tool_calls and tool_call_id
		// are there only when given: templates test "is defined".
		d := jinja.NewDict()
		d.AsDict().Set("role", jinja.NewString(m.Role))
		d.AsDict().Set("content", jinja.NewString(m.Content))
		if len(m.ToolCalls) > 0 {
			calls := make([]jinja.Value, len(m.ToolCalls))
			for j, c := range m.ToolCalls {
				fn := jinja.NewDict()
				fn.AsDict().Set("name", jinja.NewString(c.Name))
				args := jinja.NewString(c.Arguments)
				if v, err := jsonValue([]byte(c.Arguments)); err == nil && v.IsDict() {
					args = v
				}
				fn.AsDict().Set("arguments", args)
				call := jinja.NewDict()
				call.AsDict().Set("id", jinja.NewString(c.ID))
				call.AsDict().Set("type", jinja.NewString("function"))
				call.AsDict().Set("function", fn)
				calls[j] = call
			}
			d.AsDict().Set("tool_calls", jinja.NewList(calls))
		}
		if m.Role == "tool" && m.ToolCallID != "" {
			d.AsDict().Set("tool_call_id", jinja.NewString(m.ToolCallID))
		}
		if m.Name != "" {
			d.AsDict().Set("name", jinja.NewString(m.Name))
		}
		list[i] = d
	}
	toolList := jinja.None()
	if len(tools) > 0 {
		items := make([]jinja.Value, len(tools))
		for i, raw := range tools {
			v, err := jsonValue(raw)
			if err != nil {
				return "", fmt.Errorf("%w: tools[%d]: %v", ErrTemplate, i, err)
			}
			items[i] = v
		}
		toolList = jinja.NewList(items)
	}
	out, err := t.tmpl.RenderValues(map[string]jinja.Value{
		"messages":              jinja.NewList(list),
		"add_generation_prompt": jinja.NewBool(true),
		"bos_token":             jinja.NewString(t.bos),
		"eos_token":             jinja.NewString(t.eos),
		"tools":                 toolList,
	})
	if err != nil {
		return "", fmt.Errorf("%w: %v", ErrTemplate, err)
	}
	return out, nil
}

// jsonValue decodes JSON text into template values, keeping the order of
// object keys as Python's json.loads does, integers apart from floats.
func jsonValue(b []byte) (jinja.Value, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	v, err := decodeValue(dec, 0)
	if err != nil {
		return jinja.None(), err
	}
	if _, err := dec.Token(); err == nil {
		return jinja.None(), errors.New("text after the JSON value")
	}
	return v, nil
}

// maxJSONDepth bounds the nesting jsonValue reads (the body's decoder
// already bounds the size).
const maxJSONDepth = 64

func decodeValue(dec *json.Decoder, depth int) (jinja.Value, error) {
	if depth > maxJSONDepth {
		return jinja.None(), fmt.Errorf("nested deeper than %d", maxJSONDepth)
	}
	tok, err := dec.Token()
	if err != nil {
		return jinja.None(), err
	}
	switch t := tok.(type) {
	case nil:
		return jinja.None(), nil
	case bool:
		return jinja.NewBool(t), nil
	case string:
		return jinja.NewString(t), nil
	case json.Number:
		if !strings.ContainsAny(string(t), ".eE") {
			if i, err := t.Int64(); err == nil {
				return jinja.NewInt(i), nil
			}
		}
		f, err := t.Float64()
		if err != nil {
			return jinja.None(), err
		}
		return jinja.NewFloat(f), nil
	case json.Delim:
		if t == '[' {
			var items []jinja.Value
			for dec.More() {
				v, err := decodeValue(dec, depth+1)
				if err != nil {
					return jinja.None(), err
				}
				items = append(items, v)
			}
			_, err := dec.Token()
			return jinja.NewList(items), err
		}
		d := jinja.NewDict()
		for dec.More() {
			k, err := dec.Token()
			if err != nil {
				return jinja.None(), err
			}
			v, err := decodeValue(dec, depth+1)
			if err != nil {
				return jinja.None(), err
			}
			d.AsDict().Set(k.(string), v)
		}
		_, err := dec.Token()
		return d, err
	}
	return jinja.None(), fmt.Errorf("unexpected %v", tok)
}

// Llama3Template is the Llama 3 chat format without a system preamble of
// its own: the simulated model's template. It renders no tools: the
// simulated engine refuses them.
type Llama3Template struct{}

var _ ChatTemplate = Llama3Template{}

// Render implements ChatTemplate.
func (Llama3Template) Render(msgs []ChatMessage, _ []json.RawMessage) (string, error) {
	var b strings.Builder
	b.WriteString("<|begin_of_text|>")
	for _, m := range msgs {
		b.WriteString("<|start_header_id|>")
		b.WriteString(m.Role)
		b.WriteString("<|end_header_id|>\n\n")
		b.WriteString(m.Content)
		b.WriteString("<|eot_id|>")
	}
	b.WriteString("<|start_header_id|>assistant<|end_header_id|>\n\n")
	return b.String(), nil
}
