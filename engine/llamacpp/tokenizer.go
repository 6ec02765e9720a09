package llamacpp

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dpnode/dpnode/engine"
	"github.com/dpnode/dpnode/engine/gguf"
	dpnodev1 "github.com/dpnode/dpnode/proto/dpnode/v1"
)

// Tokenizer is a model's tokenizer, llama.cpp's own: texts are tokenized
// by a pool of workers that loaded the model's vocabulary only, and tokens
// are turned back into text from the vocabulary's pieces, fetched from a
// worker once. A worker that dies is started again at its next call.
//
// Every request of the node goes through it, so what waits for it is
// bounded: texts queue up to a total of QueueBytes, and a call past that
// is refused at once (engine.ErrTokenizerBusy) rather than queued behind
// seconds of other work. A call's timeout starts when a worker takes it:
// the time spent queueing is the load's, not the worker's fault.
type Tokenizer struct {
	cfg   WorkerConfig
	model string
	// timeout bounds one tokenization, and grammarTimeout one grammar's
	// check. A worker's start is bounded apart (workerStartTimeout): a
	// slow start is the machine's, not the text's or the grammar's.
	timeout, grammarTimeout time.Duration

	// maxTokenBytes is the vocabulary's longest token text.
	maxTokenBytes int

	// free holds the pool's workers not in a call.
	free chan *tokWorker
	all  []*tokWorker
	// queued is the bytes of the texts waiting for a worker or in one;
	// queueBytes bounds it.
	queued     atomic.Int64
	queueBytes int64

	mu     sync.Mutex
	ready  *dpnodev1.ModelReady
	pieces []string
	// special is the text of the tokens whose piece is empty but whose
	// text output that keeps special tokens shows.
	special map[uint32]string
}

// tokWorker is one worker of the pool; w is nil until it is first used,
// and after it exited.
type tokWorker struct {
	mu sync.Mutex
	w  *Worker
}

var (
	_ engine.Tokenizer        = (*Tokenizer)(nil)
	_ engine.Vocabulary       = (*Tokenizer)(nil)
	_ engine.SpecialTokenizer = (*Tokenizer)(nil)
	_ engine.GrammarChecker   = (*Tokenizer)(nil)
	_ engine.TextTokenizer    = (*Tokenizer)(nil)
)

// ErrTokenizerDown is returned while the tokenizer's worker cannot be
// started.
var ErrTokenizerDown = errors.New("llamacpp: the tokenizer is unavailable")

// TokenizerConfig sizes a Tokenizer's pool and queue.
type TokenizerConfig struct {
	// Workers is the pool's size; 0 means DefaultTokenizerWorkers.
	Workers int
	// QueueBytes bounds the text waiting for the workers or in them; 0
	// means DefaultTokenizerQueueBytes.
	QueueBytes int64
}

// DefaultTokenizerWorkers: as many as there are cores, up to 4. A
// vocabulary-only worker holds its vocabulary, tens of megabytes.
func DefaultTokenizerWorkers() int { return min(4, runtime.NumCPU()) }

// DefaultTokenizerQueueBytes is 64 MiB of text: at the few megabytes a
// second a worker tokenizes, seconds of work.
const DefaultTokenizerQueueBytes = 64 << 20

// NewTokenizer starts a vocabulary worker for model and fetches its
// pieces; the pool's other workers start when first needed.
func NewTokenizer(ctx context.Context, cfg WorkerConfig, model string, tc TokenizerConfig) (*Tokenizer, error) {
	if tc.Workers <= 0 {
		tc.Workers = DefaultTokenizerWorkers()
	}
	if tc.QueueBytes <= 0 {
		tc.QueueBytes = DefaultTokenizerQueueBytes
	}
	t := &Tokenizer{cfg: cfg, model: model, timeout: 30 * time.Second, grammarTimeout: grammarTimeout, free: make(chan *tokWorker, tc.Workers), queueBytes: tc.QueueBytes}
	for range tc.Workers {
		m := &tokWorker{}
		t.all = append(t.all, m)
		t.free <- m
	}
	// The file's own vocabulary bounds a token's text; a file this
	// process cannot read is the worker's to report.
	if g, err := gguf.ReadFile(model); err == nil {
		if tokens, ok := g.Array("tokenizer.ggml.tokens"); ok {
			t.maxTokenBytes = maxTokenBytes(tokens)
		}
	}
	if _, err := t.worker(ctx, t.all[0]); err != nil {
		return nil, err
	}
	return t, nil
}

// worker returns m's running worker, starting one if there is none. The
// first worker started fetches the vocabulary's pieces.
func (t *Tokenizer) worker(ctx context.Context, m *tokWorker) (*Worker, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.w != nil {
		select {
		case <-m.w.Done():
			t.cfg.Logger.Warn("a tokenizer worker exited; starting it again", "error", m.w.Err())
			m.w = nil
		default:
			return m.w, nil
		}
	}
	w, ready, err := StartWorker(ctx, t.cfg, &dpnodev1.LoadModel{Path: t.model, VocabOnly: true})
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrTokenizerDown, err)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.pieces == nil {
		if err := t.fetchVocabulary(ctx, w, ready); err != nil {
			w.Close()
			return nil, err
		}
	}
	t.ready = ready
	m.w = w
	return w, nil
}

// workerStartTimeout bounds a worker's start, its vocabulary included: a
// vocabulary-only load, which takes a second or two on a busy machine.
const workerStartTimeout = 30 * time.Second

// startedWorker is m's worker, started if it is not running, within
// workerStartTimeout.
func (t *Tokenizer) startedWorker(m *tokWorker) (*Worker, error) {
	ctx, cancel := context.WithTimeout(context.Background(), workerStartTimeout)
	defer cancel()
	return t.worker(ctx, m)
}

// fetchVocabulary takes the pieces and special texts from w. t.mu is
// held.
func (t *Tokenizer) fetchVocabulary(ctx context.Context, w *Worker, ready *dpnodev1.ModelReady) error {
	rep, err := w.Call(ctx, &dpnodev1.WorkerRequest{Body: &dpnodev1.WorkerRequest_Vocabulary{Vocabulary: &dpnodev1.GetVocabulary{}}})
	if err != nil {
		return fmt.Errorf("%w: fetching the vocabulary: %w", ErrTokenizerDown, err)
	}
	v := rep.GetVocabulary()
	if v == nil || len(v.Offsets) != int(ready.VocabSize)+1 || len(v.SpecialIds) != len(v.SpecialTexts) {
		return fmt.Errorf("%w: the worker sent a malformed vocabulary", ErrTokenizerDown)
	}
	pieces := make([]string, ready.VocabSize)
	for i := range pieces {
		a, b := v.Offsets[i], v.Offsets[i+1]
		if a > b || int(b) > len(v.Pieces) {
			return fmt.Errorf("%w: the worker sent a malformed vocabulary", ErrTokenizerDown)
		}
		pieces[i] = string(v.Pieces[a:b])
	}
	t.pieces = pieces
	t.special = make(map[uint32]string, len(v.SpecialIds))
	for i, id := range v.SpecialIds {
		t.special[id] = string(v.SpecialTexts[i])
	}
	return nil
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
	return t.tokenize(&dpnodev1.TokenizeText{Text: text, AddSpecial: addSpecial, ParseSpecial: true})
}

// EncodeText implements engine.TextTokenizer with llama_tokenize, special
// tokens' text read as text and nothing added.
func (t *Tokenizer) EncodeText(text string) ([]uint32, error) {
	return t.tokenize(&dpnodev1.TokenizeText{Text: text})
}

func (t *Tokenizer) tokenize(req *dpnodev1.TokenizeText) ([]uint32, error) {
	rep, err := t.call(&dpnodev1.WorkerRequest{Body: &dpnodev1.WorkerRequest_Tokenize{Tokenize: req}}, int64(len(req.Text)), t.timeout)
	switch {
	case errors.Is(err, ErrTokenizerDown), errors.Is(err, engine.ErrTokenizerBusy):
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
// for the model's vocabulary in a vocabulary worker, where a grammar that
// crashes or hangs the parser takes no rank with it.
func (t *Tokenizer) CheckGrammar(gbnf string) error {
	_, err := t.call(&dpnodev1.WorkerRequest{Body: &dpnodev1.WorkerRequest_CheckGrammar{CheckGrammar: &dpnodev1.CheckGrammar{Gbnf: gbnf}}}, int64(len(gbnf)), t.grammarTimeout)
	var refused *ReplyError
	switch {
	case errors.As(err, &refused):
		return fmt.Errorf("%w: %s", engine.ErrBadGrammar, refused.Message)
	case errors.Is(err, ErrTokenizerDown), errors.Is(err, engine.ErrTokenizerBusy):
		// The pool's fault, not the grammar's, though a worker that
		// could not start in time also says it ran out of time.
		return err
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("%w: llama.cpp took more than %s to parse it", engine.ErrBadGrammar, t.grammarTimeout)
	}
	return err
}

// call sends req, of size bytes, to a worker of the pool, which has
// timeout for it; a worker that died under the call is started again,
// once. A worker that takes longer is stopped (a grammar built to hang
// the parser; a text that takes it that long), so that the pool does not
// keep it. A reply that refuses req is a *ReplyError; any other failure
// wraps ErrTokenizerDown or engine.ErrTokenizerBusy, or is the timeout's.
func (t *Tokenizer) call(req *dpnodev1.WorkerRequest, size int64, timeout time.Duration) (*dpnodev1.WorkerReply, error) {
	// A text longer than the whole queue still goes, alone.
	if n := t.queued.Add(size); n > t.queueBytes && n != size {
		t.queued.Add(-size)
		return nil, fmt.Errorf("%w: %d bytes of text wait for its %d workers", engine.ErrTokenizerBusy, t.queueBytes, len(t.all))
	}
	defer t.queued.Add(-size)
	// The queue's bytes bound the wait; the timeout starts once a worker
	// runs, started for the call if need be.
	m := <-t.free
	defer func() { t.free <- m }()
	for attempt := 0; ; attempt++ {
		w, err := t.startedWorker(m)
		if err != nil {
			return nil, err
		}
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		rep, err := w.Call(ctx, req)
		cancel()
		var refused *ReplyError
		switch {
		case errors.Is(err, context.DeadlineExceeded):
			w.Close()
			return nil, err
		case err == nil || errors.As(err, &refused):
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

// Pid is the process id of the pool's first worker.
func (t *Tokenizer) Pid() int {
	m := t.all[0]
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.w.Pid()
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

// Close stops the workers.
func (t *Tokenizer) Close() error {
	var errs []error
	for _, m := range t.all {
		m.mu.Lock()
		if m.w != nil {
			errs = append(errs, m.w.Close())
		}
		m.mu.Unlock()
	}
	return errors.Join(errs...)
}
