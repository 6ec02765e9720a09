package httpapi

import (
	"bytes"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/dpnode/dpnode/engine"
	"github.com/dpnode/dpnode/http/toolcall"
)

// choice is the state of one requested completion.
type choice struct {
	subID  string
	prompt int
	text   []byte
	// sent is how much of text the client has; only text that cannot
	// still turn out to be the start of a stop string is sent.
	sent   int
	tokens int
	// ids are the tokens generated, kept for return_token_ids and
	// logprobs only; ids[idsSent:] are not yet streamed.
	ids     []uint32
	idsSent int
	// lps are the tokens' log-probabilities, when asked; lps[lpsSent:]
	// are not yet streamed, and textOffset is where the next one's text
	// starts.
	lps        []*engine.TokenLogprobs
	lpsSent    int
	textOffset int
	// promptLps are the prompt's log-probabilities, when asked (the
	// first set: a moved request computes them again); promptSent is
	// set once they went to the client.
	promptLps  []*engine.TokenLogprobs
	promptSent bool
	// vllmPromptSent is set once vLLM's prompt_logprobs went out.
	vllmPromptSent bool
	// rank served the latest tokens; -1 before the first.
	rank int
	// cached counts the prompt tokens found in the prefix cache.
	cached int
	// firstAt is when the first token came, queued how long the request
	// waited in its engine before its first step, moves how many times it
	// moved to another rank.
	firstAt time.Time
	queued  time.Duration
	moves   int
	finish  string
	// stopReason is vLLM's: the stop string or stop token id that ended
	// the choice; nil for an end-of-sequence token or another finish.
	stopReason any
	done       bool
	// started and finishSent track what a stream has told the client.
	started, finishSent bool
	// calls reads tool calls from the text as it is released (parsed);
	// callIDs are the ids of the calls announced so far.
	calls   *toolcall.Parser
	parsed  strings.Builder
	callIDs []string
	// held are tokens whose text came back ending in U+FFFD, decoded
	// again with the tokens after them (decodeText).
	held []uint32
}

// maxHeld bounds the tokens held for a character the next ones may
// complete: a character is at most four bytes, and an event may carry a
// few tokens before the one that ends inside it.
const maxHeld = 16

// decodeText returns the text of an event's tokens. A tokenizer that
// decodes by asking a server for text (the openai engine's without
// --tokenizer) gives a token holding part of a character as U+FFFD, where
// dpnode's own give its bytes: so tokens whose text ends in U+FFFD are held
// and decoded again with the next ones, which complete the character
// (decoded together, the server gives it whole). A real U+FFFD in the text
// is only late by a few tokens; at the end (final) nothing is held.
func (c *choice) decodeText(decode func([]uint32) string, ids []uint32, final bool) string {
	if len(c.held) > 0 {
		ids = append(c.held, ids...)
		c.held = nil
	}
	if len(ids) == 0 {
		return ""
	}
	text := decode(ids)
	if !final && len(ids) < maxHeld && strings.HasSuffix(text, "\uFFFD") {
		c.held = slices.Clone(ids)
		return ""
	}
	return text
}

// addText appends decoded text and matches stop strings in the part that
// could newly contain one. It reports whether one matched.
func (c *choice) addText(delta string, stops []string, includeStop bool) bool {
	longest := 0
	for _, s := range stops {
		longest = max(longest, len(s))
	}
	from := max(0, len(c.text)-longest+1)
	c.text = append(c.text, delta...)
	at, matched := -1, ""
	for _, s := range stops {
		if i := bytes.Index(c.text[from:], []byte(s)); i >= 0 && (at < 0 || from+i < at) {
			at, matched = from+i, s
		}
	}
	if at < 0 {
		return false
	}
	if includeStop {
		at += len(matched)
	}
	c.text = c.text[:at]
	c.stopReason = matched
	return true
}

// pending returns text the client can have now: all of it once the choice
// is done, else all but a tail that might begin a stop string, cut at a
// rune boundary, and never the first bytes of a character whose last ones
// the next token brings (a token may hold part of a character). What is
// left incomplete at the end is the client's as is, and JSON gives it as
// U+FFFD, as vLLM does.
func (c *choice) pending(stops []string) string {
	end := len(c.text)
	if !c.done {
		for _, s := range stops {
			end = min(end, len(c.text)-len(s)+1)
		}
		for end > c.sent && end < len(c.text) && !utf8.RuneStart(c.text[end]) {
			end--
		}
		if end == len(c.text) {
			start := end - 1
			for start > c.sent && end-start < utf8.UTFMax && !utf8.RuneStart(c.text[start]) {
				start--
			}
			if start >= c.sent && utf8.RuneStart(c.text[start]) && !utf8.FullRune(c.text[start:end]) {
				end = start
			}
		}
	}
	if end <= c.sent {
		return ""
	}
	out := string(c.text[c.sent:end])
	c.sent = end
	return out
}
