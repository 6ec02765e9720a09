package llamaengine

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/dpnode/dpnode/engine/llamacpp"
	httpapi "github.com/dpnode/dpnode/http"
)

// Vocabulary is a GGUF model's tokenizer and chat template, checked: what
// an API server tokenizes and renders chats with, for this engine and for
// any other that reads a model's vocabulary (the openai engine's
// --tokenizer).
type Vocabulary struct {
	Path   string
	Info   *llamacpp.ModelInfo
	binary string
	// Template is nil for a model without a chat template.
	Template *httpapi.JinjaTemplate
}

// InspectVocabulary reads the model file at path, named by flag in
// errors, and its chat template, which the file chatTemplate replaces
// when not empty; it checks that the llama.cpp worker that tokenizes is
// installed. It starts nothing.
func InspectVocabulary(flag, path, chatTemplate string) (*Vocabulary, error) {
	info, err := llamacpp.InspectModel(path)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", flag, err)
	}
	binary, err := llamacpp.FindWorker()
	if err != nil {
		return nil, fmt.Errorf("%s is read by llama.cpp: %w", flag, err)
	}
	v := &Vocabulary{Path: path, Info: info, binary: binary}
	src, from := info.ChatTemplate, path
	if chatTemplate != "" {
		b, err := os.ReadFile(chatTemplate)
		if err != nil {
			return nil, fmt.Errorf("--chat-template: %v", err)
		}
		src, from = string(b), chatTemplate
	}
	if src != "" {
		if v.Template, err = httpapi.NewJinjaTemplate(src, info.BOSToken, info.EOSToken); err != nil {
			return nil, fmt.Errorf("the chat template of %s: %v", from, err)
		}
	}
	return v, nil
}

// OpenTokenizer starts the worker that tokenizes with the vocabulary.
func (v *Vocabulary) OpenTokenizer(ctx context.Context, logger *slog.Logger) (*llamacpp.Tokenizer, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	tok, err := llamacpp.NewTokenizer(ctx, llamacpp.WorkerConfig{Binary: v.binary, Env: []string{llamacpp.WorkerRoleEnv + "=tokenizer"},
		Logger: logger.With("component", "tokenizer")}, v.Path, llamacpp.TokenizerConfig{})
	if err != nil {
		return nil, fmt.Errorf("the tokenizer of %s: %w", v.Path, err)
	}
	return tok, nil
}
