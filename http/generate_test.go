package httpapi

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestStreamHoldsBackPartialCharacters feeds a stream the pieces a
// byte-level tokenizer gives "🦙 and é" (llama 3 splits the llama into
// " \xF0\x9F", "\xA6", "\x99"): no event carries part of a character, the
// events add up to the text, and what is left incomplete when the choice
// ends is sent as is, which JSON turns into U+FFFD.
func TestStreamHoldsBackPartialCharacters(t *testing.T) {
	pieces := []string{" \xF0\x9F", "\xA6", "\x99", " and", " \xC3", "\xA9", "!"}
	c := &choice{}
	var sent []string
	for _, p := range pieces {
		if c.addText(p, nil, false) {
			t.Fatal("a stop string matched with none given")
		}
		if s := c.pending(nil); s != "" {
			sent = append(sent, s)
		}
	}
	for _, s := range sent {
		if !json.Valid([]byte(`"`+s+`"`)) || strings.ContainsRune(s, '\uFFFD') || !validUTF8(s) {
			t.Fatalf("a streamed event holds part of a character: %q", s)
		}
	}
	if got := strings.Join(sent, ""); got != " 🦙 and é!" {
		t.Fatalf("the events add up to %q", got)
	}
	if sent[0] != " " {
		t.Fatalf("the space before the llama waited for it: first event %q", sent[0])
	}

	// Ended inside a character: the bytes go out, and JSON makes them
	// U+FFFD rather than failing.
	c = &choice{}
	c.addText("ok \xF0\x9F", nil, false)
	if s := c.pending(nil); s != "ok " {
		t.Fatalf("mid-stream, sent %q", s)
	}
	c.done = true
	rest := c.pending(nil)
	b, err := json.Marshal(rest)
	var back string
	if err != nil || json.Unmarshal(b, &back) != nil || back != "\uFFFD\uFFFD" {
		t.Fatalf("the incomplete end encodes as %s (%v)", b, err)
	}
}

// TestStreamDecodesCharactersATokenizerSplits streams "🦙 and é!" a token
// at a time through a tokenizer that decodes as a server does, by text
// (invalid UTF-8 comes back as U+FFFD): the tokens holding part of a
// character are held until the next ones complete it, so the stream still
// adds up to the text, and a real U+FFFD is late, not lost.
func TestStreamDecodesCharactersATokenizerSplits(t *testing.T) {
	vocab := map[uint32]string{1: " \xF0\x9F", 2: "\xA6", 3: "\x99", 4: " and", 5: " \xC3", 6: "\xA9", 7: "!", 8: " \uFFFD"}
	asked := 0
	decode := func(ids []uint32) string {
		asked++
		var b strings.Builder
		for _, id := range ids {
			b.WriteString(vocab[id])
		}
		return strings.ToValidUTF8(b.String(), "\uFFFD")
	}
	run := func(toks []uint32) []string {
		c := &choice{}
		var sent []string
		for i, tok := range toks {
			final := i == len(toks)-1
			if c.addText(c.decodeText(decode, []uint32{tok}, final), nil, false) {
				t.Fatal("a stop string matched with none given")
			}
			c.done = final
			if s := c.pending(nil); s != "" {
				sent = append(sent, s)
			}
		}
		return sent
	}
	sent := run([]uint32{1, 2, 3, 4, 5, 6, 8, 7})
	if got := strings.Join(sent, ""); got != " 🦙 and é \uFFFD!" {
		t.Fatalf("the events add up to %q (%q)", got, sent)
	}
	if sent[0] != " 🦙" {
		t.Fatalf("first event %q, want the llama whole", sent[0])
	}
	if asked != 8 {
		t.Fatalf("decoded %d times for 8 tokens", asked)
	}
	// The end comes inside a character: what is held goes out as is.
	if sent := run([]uint32{4, 1}); strings.Join(sent, "") != " and \uFFFD" {
		t.Fatalf("ended inside a character: %q", sent)
	}
}

// TestStopStringHoldbackKeepsCharactersWhole checks the stop-string
// holdback and the partial-character one together.
func TestStopStringHoldbackKeepsCharactersWhole(t *testing.T) {
	c := &choice{}
	c.addText("é\xE2", []string{"END"}, false)
	if s := c.pending([]string{"END"}); s != "" {
		t.Fatalf("sent %q while a stop string could still start", s)
	}
	c.addText("\x82\xAC then END more", []string{"END"}, false)
	if got := string(c.text); got != "é€ then " {
		t.Fatalf("text after the stop string: %q", got)
	}
}

func validUTF8(s string) bool { return strings.ToValidUTF8(s, "?") == s }
