package llamacpp

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/dpnode/dpnode/engine"
	"github.com/dpnode/dpnode/engine/gguf"
	dpnodev1 "github.com/dpnode/dpnode/proto/dpnode/v1"
)

// Tokenizer is a model's tokenizer, llama.cpp's own: texts are tokenized
// by a worker that loaded the model's vocabulary only, and tokens are
// turned back into text from the vocabulary's pieces, fetched from that
// worker once. A worker that dies is started again at the next call.
type Tokenizer struct {
	cfg   WorkerConfig
	model string
	// Timeout bounds one tokenization, the worker's start included.
	timeout time.Duration

	// maxTokenBytes is the vocabulary's longest token text.
	maxTokenBytes int

	mu     sync.Mutex
	w      *Worker
	ready  *dpnodev1.ModelReady
	pieces []string
	// special is the text of the tokens whose piece is empty but whose
	// text output that keeps special tokens shows.
	special map[uint32]string
}

var (
	_ engine.Tokenizer        = (*Tokenizer)(nil)
	_ engine.Vocabulary       = (*Tokenizer)(nil)
	_ engine.SpecialTokenizer = (*Tokenizer)(nil)
	_ engine.GrammarChecker   = (*Tokenizer)(nil)
)

// ErrTokenizerDown is returned while the tokenizer's worker cannot be
// started.
var ErrTokenizerDown = errors.New("llamacpp: the tokenizer is unavailable")

// NewTokenizer starts a vocabulary worker for model and fetches its
// pieces.
func NewTokenizer(ctx context.Context, cfg WorkerConfig, model string) (*Tokenizer, error) {
	t := &Tokenizer{cfg: cfg, model: model, timeout: 30 * time.Second}
	// The file's own vocabulary bounds a token's text; a file this
	// process cannot read is the worker's to report.
	if g, err := gguf.ReadFile(model); err == nil {
		if tokens, ok := g.Array("tokenizer.ggml.tokens"); ok {
			t.maxTokenBytes = maxTokenBytes(tokens)
		}
	}
	if _, err := t.worker(ctx); err != nil {
		return nil, err
	}
	return t, nil
}

// worker returns the running worker, starting one if there is none.
func (t *Tokenizer) worker(ctx context.Context) (*Worker, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.w != nil {
		select {
		case <-t.w.Done():
			t.cfg.Logger.Warn("the tokenizer's worker exited; starting it again", "error", t.w.Err())
			t.w = nil
		default:
			return t.w, nil
		}
	}
	w, ready, err := StartWorker(ctx, t.cfg, &dpnodev1.LoadModel{Path: t.model, VocabOnly: true})
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrTokenizerDown, err)
	}
	if t.pieces == nil {
		rep, err := w.Call(ctx, &dpnodev1.WorkerRequest{Body: &dpnodev1.WorkerRequest_Vocabulary{Vocabulary: &dpnodev1.GetVocabulary{}}})
		if err != nil {
			w.Close()
			return nil, fmt.Errorf("%w: fetching the vocabulary: %w", ErrTokenizerDown, err)
		}
		v := rep.GetVocabulary()
		if v == nil || len(v.Offsets) != int(ready.VocabSize)+1 {
			w.Close()
			return nil, fmt.Errorf("%w: the worker sent a vocabulary of the wrong size", ErrTokenizerDown)
		}
		t.pieces = make([]string, ready.VocabSize)
		for i := range t.pieces {
			a, b := v.Offsets[i], v.Offsets[i+1]
			if a > b || int(b) > len(v.Pieces) {
				w.Close()
				return nil, fmt.Errorf("%w: the worker sent a malformed vocabulary", ErrTokenizerDown)
			}
			t.pieces[i] = string(v.Pieces[a:b])
		}
		if len(v.SpecialIds) != len(v.SpecialTexts) {
			w.Close()
			return nil, fmt.Errorf("%w: the worker sent a malformed vocabulary", ErrTokenizerDown)
		}
		t.special = make(map[uint32]string, len(v.SpecialIds))
		for i, id := range v.SpecialIds {
			t.special[id] = string(v.SpecialTexts[i])
		}
	}
	t.w, t.ready = w, ready
	return w, nil
}

// Ready is the worker's account of the vocabulary.
func (t *Tokenizer) Ready() *dpnodev1.ModelReady {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.ready
}

// Encode implements engine.Tokenizer with llama_tokenize, reading special
// tokens written as text (a chat template's <|eot_id|>) as those tokens,
// as Hugging Face's tokenizers do.
func (t *Tokenizer) Encode(text string, addSpecial bool) ([]uint32, error) {
	req := &dpnodev1.TokenizeText{Text: text, AddSpecial: addSpecial, ParseSpecial: true}
	rep, err := t.call(&dpnodev1.WorkerRequest{Body: &dpnodev1.WorkerRequest_Tokenize{Tokenize: req}}, t.timeout)
	switch {
	case errors.Is(err, ErrTokenizerDown):
		return nil, err
	case err != nil:
		return nil, fmt.Errorf("%w: %w", ErrTokenizerDown, err)
	}
	return rep.GetTokens().GetIds(), nil
}

// grammarTimeout bounds a grammar's check: llama.cpp parses a grammar
// and finds its first stacks in far less, unless the grammar is built to
// take long; the worker is then stopped, and started again at the next
// call.
const grammarTimeout = 5 * time.Second

// CheckGrammar implements engine.GrammarChecker: llama.cpp parses gbnf
// for the model's vocabulary in the vocabulary worker, where a grammar
// that crashes or hangs the parser takes no rank with it.
func (t *Tokenizer) CheckGrammar(gbnf string) error {
	_, err := t.call(&dpnodev1.WorkerRequest{Body: &dpnodev1.WorkerRequest_CheckGrammar{CheckGrammar: &dpnodev1.CheckGrammar{Gbnf: gbnf}}}, grammarTimeout)
	var refused *ReplyError
	switch {
	case errors.As(err, &refused):
		return fmt.Errorf("%w: %s", engine.ErrBadGrammar, refused.Message)
	case errors.Is(err, context.DeadlineExceeded):
		t.mu.Lock()
		if t.w != nil {
			t.w.Close()
		}
		t.mu.Unlock()
		return fmt.Errorf("%w: llama.cpp took more than %s to parse it", engine.ErrBadGrammar, grammarTimeout)
	}
	return err
}

// call sends req to the worker within timeout; a worker that died under
// the call is started again, once. A reply that refuses req is a
// *ReplyError; any other failure wraps ErrTokenizerDown, or is the
// timeout's.
func (t *Tokenizer) call(req *dpnodev1.WorkerRequest, timeout time.Duration) (*dpnodev1.WorkerReply, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	for attempt := 0; ; attempt++ {
		w, err := t.worker(ctx)
		if err != nil {
			return nil, err
		}
		rep, err := w.Call(ctx, req)
		var refused *ReplyError
		if err == nil || errors.As(err, &refused) || errors.Is(err, context.DeadlineExceeded) {
			return rep, err
		}
		select {
		case <-w.Done():
			if attempt == 0 {
				continue
			}
		default:
		}
		return nil, fmt.Errorf("%w: %w", ErrTokenizerDown, err)
	}
}

// Pid is the process id of the tokenizer's worker.
func (t *Tokenizer) Pid() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.w.Pid()
}

// Decode implements engine.Tokenizer: each token's piece, in order, as
// llama.cpp's server writes a completion. A piece may be part of a UTF-8
// character; the pieces that follow complete it.
func (t *Tokenizer) Decode(ids []uint32) string {
	t.mu.Lock()
	pieces := t.pieces
	t.mu.Unlock()
	n := 0
	for _, id := range ids {
		if int(id) < len(pieces) {
			n += len(pieces[id])
		}
	}
	b := make([]byte, 0, n)
	for _, id := range ids {
		if int(id) < len(pieces) {
			b = append(b, pieces[id]...)
		}
	}
	return string(b)
}

// DecodeSpecial implements engine.SpecialTokenizer: Decode, with special
// tokens written as their text (<|eot_id|>), as vLLM writes them with
// skip_special_tokens false.
func (t *Tokenizer) DecodeSpecial(ids []uint32) string {
	t.mu.Lock()
	pieces, special := t.pieces, t.special
	t.mu.Unlock()
	var b strings.Builder
	for _, id := range ids {
		if text, ok := special[id]; ok {
			b.WriteString(text)
		} else if int(id) < len(pieces) {
			b.WriteString(pieces[id])
		}
	}
	return b.String()
}

// VocabSize implements engine.Vocabulary: the number of tokens.
func (t *Tokenizer) VocabSize() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.pieces)
}

// MaxTokenBytes implements engine.Vocabulary: the longest token text of
// the model file's vocabulary, special tokens included.
func (t *Tokenizer) MaxTokenBytes() int { return t.maxTokenBytes }

// Close stops the worker.
func (t *Tokenizer) Close() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.w != nil {
		return t.w.Close()
	}
	return nil
}
