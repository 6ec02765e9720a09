package llamacpp

import (
	"errors"
	"fmt"
	"os"

	"github.com/dpnode/dpnode/engine/gguf"
)

// ModelInfo is what a node reads of a GGUF model before any worker loads
// it: enough to check the flags against it and to serve its chat
// template.
type ModelInfo struct {
	Path         string
	Architecture string
	// ContextLength is the context the model was trained for.
	ContextLength int
	VocabSize     int
	// ChatTemplate is tokenizer.chat_template; empty when it has none.
	ChatTemplate string
	// BOSToken and EOSToken are the texts of the model's BOS and EOS
	// tokens, which chat templates write.
	BOSToken, EOSToken string
	// Bytes is the file's size, about what its weights take in memory.
	Bytes int64
	// F32 is set for a model whose weights are all F32 (general.file_type
	// 0): its KV cache is F32 too, as vLLM's follows the model's dtype.
	F32 bool
}

// InspectModel reads path's metadata, with errors that name the file and
// what is wrong with it.
func InspectModel(path string) (*ModelInfo, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("the model file %s: %w", path, err)
	}
	if st.IsDir() {
		return nil, fmt.Errorf("the model file %s is a directory; give a .gguf file (llama.cpp's format)", path)
	}
	g, err := gguf.ReadFile(path)
	if err != nil {
		if errors.Is(err, gguf.ErrNotGGUF) {
			return nil, fmt.Errorf("the model file %s is not a GGUF file, the only format the llama.cpp engine reads (convert a Hugging Face model with llama.cpp's convert_hf_to_gguf.py)", path)
		}
		return nil, fmt.Errorf("the model file %s cannot be read: %w", path, err)
	}
	arch, err := g.Architecture()
	if err != nil {
		return nil, fmt.Errorf("the model file %s has no general.architecture: it is not a model llama.cpp can load", path)
	}
	info := &ModelInfo{Path: path, Architecture: arch, Bytes: st.Size()}
	ctx, ok := g.Uint(arch + ".context_length")
	if !ok || ctx == 0 {
		return nil, fmt.Errorf("the model file %s has no %s.context_length", path, arch)
	}
	info.ContextLength = int(min(ctx, 1<<30))
	tokens, ok := g.Array("tokenizer.ggml.tokens")
	if !ok || len(tokens.Values) == 0 {
		return nil, fmt.Errorf("the model file %s has no tokenizer (tokenizer.ggml.tokens)", path)
	}
	info.VocabSize = len(tokens.Values)
	if len(g.Tensors) == 0 {
		return nil, fmt.Errorf("the model file %s has no weights: it holds a tokenizer only", path)
	}
	info.ChatTemplate, _ = g.String("tokenizer.chat_template")
	if ft, ok := g.Uint("general.file_type"); ok && ft == 0 {
		info.F32 = true
	}
	text := func(key string) string {
		id, ok := g.Uint(key)
		if !ok || id >= uint64(len(tokens.Values)) {
			return ""
		}
		s, _ := tokens.Values[id].(string)
		return s
	}
	info.BOSToken = text("tokenizer.ggml.bos_token_id")
	info.EOSToken = text("tokenizer.ggml.eos_token_id")
	return info, nil
}

// maxTokenBytes is the longest token text of a GGUF vocabulary. A token's
// text there is at least as long as the bytes it stands for: byte-level
// BPE writes each byte as a character of one or two bytes, SentencePiece
// writes a space as three, a byte token <0x41> is six characters for
// one byte, and a special token is its text.
func maxTokenBytes(tokens *gguf.Array) int {
	n := 0
	for _, v := range tokens.Values {
		if s, ok := v.(string); ok {
			n = max(n, len(s))
		}
	}
	return n
}
