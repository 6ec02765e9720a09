package sim

import (
	"hash/fnv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/dpnode/dpnode/engine"
)

// Special token ids.
const (
	PadToken uint32 = 0
	BOSToken uint32 = 1
	EOSToken uint32 = 2
	// firstWordToken is the id of the first vocabulary word; ids below it
	// are special and decode to nothing.
	firstWordToken uint32 = 16
)

// vocabulary is what the simulated model writes: common words, each a
// token with its leading space, and punctuation.
var vocabulary = strings.Fields(`
the of and to in is that for it as was with be by on not he this are or his
from at which but have an had they you were their one all we can her has
there been if more when will would who so no out up into do time only new
some could these two may first then any like other than its over also after
most made many did before must through back years where much your way well
down should because each just those people how too little state good very
make world still own see men work long get here between both life being under
never day same another know while last might us great old year off come since
against go came right used take three states himself few house use during
without again place around however home small found thought went say part
once general high upon school every don't does got united left number course
war until always away something fact though water less public put think
almost hand enough far took head yet government system better set told nothing
night end why called didn't eyes find going look asked later knew point next
program city business give group toward young days let room president side
social given present several order national possible rather second face per
among form important often things looking early white case john become large
big need four within felt along children saw best church ever least power
development light thing seemed family interest want members mind country area
others although turned done open god service certain kind problem began
different door thus help sense means whole matter perhaps itself york times
law human line above name example action company hands local show whether five
history gave today either act feet across taken past quite anything seen having
death week experience body word half really field am car words already themselves
information tell together college shall money period held keep sure free seems
real behind cannot miss political air question making office brought whose
special heard major problems ago became federal moment study available known
result street economic boy position reason change south board individual job
society areas west close turn love community true court force full seem model
engine token cache batch request server cluster node rank wave expert layer
memory latency throughput prefix block stream queue data parallel compute
`)

// specialTokens are the chat template's markers: one token each, decoding
// to nothing, as in Llama 3's tokenizer.
var specialTokens = []string{"<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|end_of_text|>"}

var punctuation = []string{".", ",", "\n", ":", ";", "?", "!", "-", "'", "\""}

// Tokenizer is the simulated model's tokenizer. Encoding is prefix-stable
// (a prompt's tokens begin with the tokens of every prefix that ends at a
// word boundary), so prefix caching works on it as on a real one. Pieces
// outside the vocabulary map to hashed ids, which count and cache like
// real tokens but decode to nothing: only the model's own output needs to
// decode exactly.
type Tokenizer struct {
	ids    map[string]uint32
	pieces []string
	// vocabSize bounds every id, hashed ones included.
	vocabSize uint32
}

var (
	_ engine.Tokenizer  = (*Tokenizer)(nil)
	_ engine.Vocabulary = (*Tokenizer)(nil)
)

// maxPieceRunes splits long words the way BPE does, so token counts track
// those of real tokenizers (about four characters a token on English).
const maxPieceRunes = 6

// NewTokenizer returns the simulated tokenizer with a vocabulary of
// vocabSize ids (128256, Llama 3's, when zero).
func NewTokenizer(vocabSize uint32) *Tokenizer {
	if vocabSize == 0 {
		vocabSize = 128256
	}
	t := &Tokenizer{ids: map[string]uint32{}, vocabSize: vocabSize}
	t.pieces = make([]string, firstWordToken)
	for i, sp := range specialTokens {
		t.ids[sp] = EOSToken + 1 + uint32(i)
	}
	add := func(p string) {
		if _, dup := t.ids[p]; dup {
			return
		}
		t.ids[p] = uint32(len(t.pieces))
		t.pieces = append(t.pieces, p)
	}
	for _, w := range vocabulary {
		add(" " + w)
	}
	for _, p := range punctuation {
		add(p)
	}
	if uint32(len(t.pieces)) >= vocabSize {
		panic("sim: vocabulary size smaller than the built-in vocabulary")
	}
	return t
}

// VocabSize implements engine.Vocabulary.
func (t *Tokenizer) VocabSize() int { return int(t.vocabSize) }

// MaxTokenBytes implements engine.Vocabulary: none, since a run of one
// whitespace character is one piece however long.
func (t *Tokenizer) MaxTokenBytes() int { return 0 }

// numWords is how many ids decode to words.
func (t *Tokenizer) numWords() int { return len(vocabulary) }

// Encode implements engine.Tokenizer; the simulated model adds no special
// tokens of its own, and never fails.
func (t *Tokenizer) Encode(text string, _ bool) ([]uint32, error) {
	return t.Tokens(text), nil
}

// EncodeText implements engine.TextTokenizer: the simulated vocabulary
// has no special tokens, so it is Encode.
func (t *Tokenizer) EncodeText(text string) ([]uint32, error) { return t.Tokens(text), nil }

// Tokens splits text into pieces (a word with its leading space, a run of
// at most three digits, one punctuation or other character, a run of
// whitespace) and maps each to an id.
func (t *Tokenizer) Tokens(text string) []uint32 {
	ids := make([]uint32, 0, len(text)/4+1)
	for len(text) > 0 {
		n := pieceLen(text)
		ids = append(ids, t.id(text[:n]))
		text = text[n:]
	}
	return ids
}

func (t *Tokenizer) id(piece string) uint32 {
	if id, ok := t.ids[piece]; ok {
		return id
	}
	h := fnv.New32a()
	h.Write([]byte(piece))
	base := uint32(len(t.pieces))
	return base + h.Sum32()%(t.vocabSize-base)
}

// pieceLen returns the byte length of the piece at the start of text.
func pieceLen(text string) int {
	if strings.HasPrefix(text, "<|") {
		if end := strings.Index(text[:min(len(text), 24)], "|>"); end > 0 {
			return end + 2
		}
	}
	r, size := utf8.DecodeRuneInString(text)
	start := 0
	if r == ' ' && len(text) > 1 {
		// A space belongs to the word after it.
		next, _ := utf8.DecodeRuneInString(text[1:])
		if unicode.IsLetter(next) {
			start = 1
			r, size = next, 1+utf8.RuneLen(next)
		}
	}
	switch {
	case unicode.IsLetter(r):
		n, runes := size, 1
		for n < len(text) && runes < maxPieceRunes {
			c, s := utf8.DecodeRuneInString(text[n:])
			if !unicode.IsLetter(c) && c != '\'' {
				break
			}
			n += s
			runes++
		}
		return n
	case unicode.IsDigit(r):
		n := size
		for n < len(text) && n-start < 3 && text[n] >= '0' && text[n] <= '9' {
			n++
		}
		return n
	case r == '\n' || unicode.IsSpace(r):
		n := size
		for n < len(text) {
			c, s := utf8.DecodeRuneInString(text[n:])
			if c != r {
				break
			}
			n += s
		}
		return n
	}
	return size
}

// Decode returns the text of ids; special and hashed ids add nothing.
func (t *Tokenizer) Decode(ids []uint32) string {
	var b strings.Builder
	for _, id := range ids {
		if id >= firstWordToken && int(id) < len(t.pieces) {
			b.WriteString(t.pieces[id])
		}
	}
	return b.String()
}
