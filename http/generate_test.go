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
