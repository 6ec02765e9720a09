package llamacpp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"strings"
	"unicode/utf8"

	"github.com/dpnode/dpnode/engine/gguf"
)

// TestModelConfig describes a small random-weight model with a real
// tokenizer: what tests and benchmarks serve where no trained weights can
// be had. Its text is nonsense, but llama.cpp computes it exactly as it
// would a trained model's, so it exercises everything around the weights.
type TestModelConfig struct {
	// Vocab is a GGUF file whose tokenizer the model takes, every
	// tokenizer.* key of it: llama.cpp's models/ggml-vocab-*.gguf.
	Vocab string
	// ChatTemplate becomes tokenizer.chat_template; empty keeps the
	// vocabulary file's, if it has one.
	ChatTemplate string
	// The shape of the Llama architecture. Zero values take the defaults
	// of DefaultTestModel.
	Layers, Embedding, Heads, KVHeads, FeedForward int
	ContextLength                                  int
	// Seed makes the weights; one seed always gives the same file.
	Seed uint64
	Name string
	// Silence lists tokens the model never writes: their output rows are
	// zero, so their logits are 0 where the others' reach tens. A model
	// that never writes part of a character (WholeCharacterTokens) is one
	// that servers which fail on such output can be measured with.
	Silence []uint32
}

// DefaultTestModel is a model of 2 layers, 64 wide, with 4 query heads
// over 2 KV heads (grouped-query attention, as Llama 3), that decodes in
// well under a millisecond a token on one core and holds 8,192 tokens of
// context: enough for a 2,000-token shared prefix.
func DefaultTestModel() TestModelConfig {
	return TestModelConfig{Layers: 2, Embedding: 64, Heads: 4, KVHeads: 2, FeedForward: 128, ContextLength: 8192, Seed: 1, Name: "dpnode-test-llama"}
}

func (c *TestModelConfig) fill() error {
	d := DefaultTestModel()
	for _, f := range []struct {
		v   *int
		def int
	}{{&c.Layers, d.Layers}, {&c.Embedding, d.Embedding}, {&c.Heads, d.Heads}, {&c.KVHeads, d.KVHeads}, {&c.FeedForward, d.FeedForward}, {&c.ContextLength, d.ContextLength}} {
		if *f.v == 0 {
			*f.v = f.def
		}
	}
	if c.Name == "" {
		c.Name = d.Name
	}
	switch {
	case c.Vocab == "":
		return errors.New("llamacpp: a test model needs a vocabulary file (llama.cpp's models/ggml-vocab-*.gguf)")
	case c.Embedding%c.Heads != 0:
		return fmt.Errorf("llamacpp: embedding %d is not a multiple of %d heads", c.Embedding, c.Heads)
	case c.Heads%c.KVHeads != 0:
		return fmt.Errorf("llamacpp: %d heads are not a multiple of %d KV heads", c.Heads, c.KVHeads)
	case (c.Embedding/c.Heads)%2 != 0:
		return fmt.Errorf("llamacpp: the head size %d must be even for rotary embeddings", c.Embedding/c.Heads)
	}
	return nil
}

// WriteTestModel writes the model cfg describes to w, in GGUF, with F32
// weights drawn from normal distributions scaled as a trained
// transformer's are (about 1/√width), so that activations stay in range
// and greedy decoding has clear winners. It is two tables, the metadata
// and the tensors, which read best as the file lays them out.
func WriteTestModel(w io.Writer, cfg TestModelConfig) error {
	if err := cfg.fill(); err != nil {
		return err
	}
	vocab, err := gguf.ReadFile(cfg.Vocab)
	if err != nil {
		return fmt.Errorf("llamacpp: reading the vocabulary: %w", err)
	}
	tokens, ok := vocab.Array("tokenizer.ggml.tokens")
	if !ok || len(tokens.Values) == 0 {
		return fmt.Errorf("llamacpp: %s has no tokenizer.ggml.tokens", cfg.Vocab)
	}
	nVocab := len(tokens.Values)
	headDim := cfg.Embedding / cfg.Heads
	kvDim := headDim * cfg.KVHeads
	kv := []gguf.KV{
		{Key: "general.architecture", Value: "llama"},
		{Key: "general.name", Value: cfg.Name},
		{Key: "general.file_type", Value: uint32(0)}, // all F32
		{Key: "llama.context_length", Value: uint32(cfg.ContextLength)},
		{Key: "llama.embedding_length", Value: uint32(cfg.Embedding)},
		{Key: "llama.block_count", Value: uint32(cfg.Layers)},
		{Key: "llama.feed_forward_length", Value: uint32(cfg.FeedForward)},
		{Key: "llama.attention.head_count", Value: uint32(cfg.Heads)},
		{Key: "llama.attention.head_count_kv", Value: uint32(cfg.KVHeads)},
		{Key: "llama.attention.layer_norm_rms_epsilon", Value: float32(1e-5)},
		{Key: "llama.rope.freq_base", Value: float32(500000)},
		{Key: "llama.rope.dimension_count", Value: uint32(headDim)},
		{Key: "llama.vocab_size", Value: uint32(nVocab)},
	}
	for _, e := range vocab.KV {
		if strings.HasPrefix(e.Key, "tokenizer.") && !(e.Key == "tokenizer.chat_template" && cfg.ChatTemplate != "") {
			kv = append(kv, e)
		}
	}
	if cfg.ChatTemplate != "" {
		kv = append(kv, gguf.KV{Key: "tokenizer.chat_template", Value: cfg.ChatTemplate})
	}

	rng := rand.New(rand.NewPCG(cfg.Seed, 0x64706e6f6465))
	normal := func(n int, std float64) []float32 {
		out := make([]float32, n)
		for i := range out {
			out[i] = float32(rng.NormFloat64() * std)
		}
		return out
	}
	ones := func(n int) []float32 {
		out := make([]float32, n)
		for i := range out {
			out[i] = 1
		}
		return out
	}
	e, ff := uint64(cfg.Embedding), uint64(cfg.FeedForward)
	inv := func(n uint64) float64 { return 1 / math.Sqrt(float64(n)) }
	tensors := []gguf.Tensor{{Name: "token_embd.weight", Dims: []uint64{e, uint64(nVocab)}, Data: normal(cfg.Embedding*nVocab, 1)}}
	for l := range cfg.Layers {
		blk := func(name string) string { return fmt.Sprintf("blk.%d.%s.weight", l, name) }
		tensors = append(tensors,
			gguf.Tensor{Name: blk("attn_norm"), Dims: []uint64{e}, Data: ones(cfg.Embedding)},
			gguf.Tensor{Name: blk("attn_q"), Dims: []uint64{e, e}, Data: normal(cfg.Embedding*cfg.Embedding, inv(e))},
			gguf.Tensor{Name: blk("attn_k"), Dims: []uint64{e, uint64(kvDim)}, Data: normal(cfg.Embedding*kvDim, inv(e))},
			gguf.Tensor{Name: blk("attn_v"), Dims: []uint64{e, uint64(kvDim)}, Data: normal(cfg.Embedding*kvDim, inv(e))},
			gguf.Tensor{Name: blk("attn_output"), Dims: []uint64{e, e}, Data: normal(cfg.Embedding*cfg.Embedding, inv(e))},
			gguf.Tensor{Name: blk("ffn_norm"), Dims: []uint64{e}, Data: ones(cfg.Embedding)},
			gguf.Tensor{Name: blk("ffn_gate"), Dims: []uint64{e, ff}, Data: normal(cfg.Embedding*cfg.FeedForward, inv(e))},
			gguf.Tensor{Name: blk("ffn_up"), Dims: []uint64{e, ff}, Data: normal(cfg.Embedding*cfg.FeedForward, inv(e))},
			gguf.Tensor{Name: blk("ffn_down"), Dims: []uint64{ff, e}, Data: normal(cfg.FeedForward*cfg.Embedding, inv(ff))},
		)
	}
	// An output projection of its own: tied to the embedding, a random
	// model only repeats its last token, whatever came before it.
	output := normal(cfg.Embedding*nVocab, 1)
	for _, t := range cfg.Silence {
		if int(t) < nVocab {
			clear(output[int(t)*cfg.Embedding : (int(t)+1)*cfg.Embedding])
		}
	}
	tensors = append(tensors,
		gguf.Tensor{Name: "output_norm.weight", Dims: []uint64{e}, Data: ones(cfg.Embedding)},
		gguf.Tensor{Name: "output.weight", Dims: []uint64{e, uint64(nVocab)}, Data: output})
	return gguf.Write(w, kv, tensors)
}

// PartialCharacterTokens returns the tokens of a vocabulary whose text, as
// llama.cpp renders it, is not whole UTF-8 characters: a token that is part
// of one. It asks a vocabulary worker.
func PartialCharacterTokens(ctx context.Context, cfg WorkerConfig, vocab string) ([]uint32, error) {
	tok, err := NewTokenizer(ctx, cfg, vocab, TokenizerConfig{Workers: 1})
	if err != nil {
		return nil, err
	}
	defer tok.Close()
	var out []uint32
	for id := range uint32(tok.VocabSize()) {
		if !utf8.ValidString(tok.Decode([]uint32{id})) {
			out = append(out, id)
		}
	}
	return out, nil
}
