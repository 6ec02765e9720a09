package engine

// Tokenizer turns text into a model's token ids and back.
//
// Concurrency: safe for concurrent use; HTTP handlers share one.
type Tokenizer interface {
	Encode(text string) []uint32
	// Decode returns the text of ids. Decoding a stream's tokens a piece at
	// a time gives the same text as decoding them at once.
	Decode(ids []uint32) string
	// EOS is the end-of-sequence token id.
	EOS() uint32
}
