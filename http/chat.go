package httpapi

import (
	"errors"
	"fmt"
	"strings"

	"github.com/ardanlabs/jinja"
)

// ChatMessage is one message of a conversation, as a chat template sees
// it.
type ChatMessage struct {
	Role    string
	Content string
	Name    string
}

// ChatTemplate renders a conversation as the prompt text the model
// continues, ending with the start of the assistant's turn.
//
// Concurrency: safe for concurrent use.
type ChatTemplate interface {
	Render(msgs []ChatMessage) (string, error)
}

// ErrTemplate marks a conversation the template refuses (a role out of
// order, say): the client's error, answered with 400.
var ErrTemplate = errors.New("the chat template refused the conversation")

// JinjaTemplate renders a model's own chat template (tokenizer.chat_template
// in its GGUF, or --chat-template), as Hugging Face's apply_chat_template
// does: Jinja with trim_blocks and lstrip_blocks, the messages in order,
// add_generation_prompt true, and the model's BOS and EOS tokens as text.
type JinjaTemplate struct {
	tmpl     *jinja.Template
	bos, eos string
}

var _ ChatTemplate = (*JinjaTemplate)(nil)

// NewJinjaTemplate compiles src.
func NewJinjaTemplate(src, bosToken, eosToken string) (*JinjaTemplate, error) {
	t, err := jinja.Compile(src)
	if err != nil {
		return nil, fmt.Errorf("httpapi: the chat template does not compile: %w", err)
	}
	return &JinjaTemplate{tmpl: t, bos: bosToken, eos: eosToken}, nil
}

// Render implements ChatTemplate.
func (t *JinjaTemplate) Render(msgs []ChatMessage) (string, error) {
	list := make([]jinja.Value, len(msgs))
	for i, m := range msgs {
		// In the order Hugging Face's messages have their keys: templates
		// that print a message whole print it so.
		d := jinja.NewDict()
		d.AsDict().Set("role", jinja.NewString(m.Role))
		d.AsDict().Set("content", jinja.NewString(m.Content))
		if m.Name != "" {
			d.AsDict().Set("name", jinja.NewString(m.Name))
		}
		list[i] = d
	}
	out, err := t.tmpl.RenderValues(map[string]jinja.Value{
		"messages":              jinja.NewList(list),
		"add_generation_prompt": jinja.NewBool(true),
		"bos_token":             jinja.NewString(t.bos),
		"eos_token":             jinja.NewString(t.eos),
		"tools":                 jinja.None(),
	})
	if err != nil {
		return "", fmt.Errorf("%w: %v", ErrTemplate, err)
	}
	return out, nil
}

// Llama3Template is the Llama 3 chat format without a system preamble of
// its own: the simulated model's template.
type Llama3Template struct{}

var _ ChatTemplate = Llama3Template{}

// Render implements ChatTemplate.
func (Llama3Template) Render(msgs []ChatMessage) (string, error) {
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
