package engine

import "errors"

// Tokenizer turns text into a model's token ids and back.
//
// Concurrency: safe for concurrent use; HTTP handlers share one.
type Tokenizer interface {
	// Encode returns the token ids of text. addSpecial adds what the model
	// wants around a text (a BOS token): a completion's prompt gets it, a
	// chat template writes its own.
	Encode(text string, addSpecial bool) ([]uint32, error)
	// Decode returns the text of ids. Decoding a stream's tokens a piece at
	// a time gives the same bytes as decoding them at once; a piece may end
	// inside a UTF-8 character that the next piece completes.
	Decode(ids []uint32) string
}

// TextTokenizer is a Tokenizer that can also read a text as text only:
// the text of a special token (<|eot_id|>) in it is that text's ordinary
// tokens, not the special token, and nothing is added around it.
type TextTokenizer interface {
	EncodeText(text string) ([]uint32, error)
}

// SpecialTokenizer is a Tokenizer that can also write special tokens as
// their text, for output that keeps them (skip_special_tokens false).
//
// Concurrency: safe for concurrent use.
type SpecialTokenizer interface {
	DecodeSpecial(ids []uint32) string
}

// GrammarChecker is a Tokenizer whose engine takes grammars (structured
// output): it checks that the engine parses one, before a request that
// carries it is admitted.
//
// Concurrency: safe for concurrent use.
type GrammarChecker interface {
	// CheckGrammar returns an error wrapping ErrBadGrammar when the engine
	// cannot use gbnf (GBNF, start rule root), and another when the check
	// itself could not be made.
	CheckGrammar(gbnf string) error
}

// ErrBadGrammar is a grammar the engine refuses: the client's to fix.
var ErrBadGrammar = errors.New("engine: the grammar is not usable")

// ErrTokenizerBusy is a call a tokenizer refused because the texts waiting
// for it already hold all it queues: the client should try again shortly,
// as when the server is past its requests' limit.
var ErrTokenizerBusy = errors.New("engine: the tokenizer is busy")

// Vocabulary is what a Tokenizer may tell of its model's vocabulary, so
// that a request can be checked before any work is done for it.
//
// Concurrency: safe for concurrent use.
type Vocabulary interface {
	// VocabSize bounds every token id of the model.
	VocabSize() int
	// MaxTokenBytes is the most bytes of text one token stands for, so
	// that a text of n bytes has at least n/MaxTokenBytes tokens; 0 when
	// there is no such bound.
	MaxTokenBytes() int
}
