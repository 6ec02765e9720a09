package toolcall

import (
	"encoding/json"
	"hash/fnv"
	"math/rand/v2"
	"slices"
	"testing"
)

// fuzzSeeds are texts that start the fuzzers near the formats.
func fuzzSeeds() []string {
	seeds := []string{
		"",
		"{",
		"[TOOL_CALLS]",
		"<tool_call>{\"name\":\"f\",\"arguments\":{\"a\":[1,{\"b\":\"}\"}]}}</tool_call>",
		"[TOOL_CALLS]f[ARGS]1e5[TOOL_CALLS]g[ARGS]\"x\\u00e9\"[TOOL_CALLS]h[ARGS]{",
		"<|python_tag|>{\"parameters\":{\"a\":-0.5E+2},\"name\":\"f\"};{\"name\":\"g\",\"arguments\":null}",
		"[{\"name\":\"f\",\"parameters\":\"{}\"},{\"name\":\"g\",\"parameters\":[true,false]}]",
	}
	for _, tc := range outputs {
		seeds = append(seeds, tc.text)
	}
	return seeds
}

// FuzzParser reads random texts in every format, in one piece, a byte at a
// time and in random pieces, and checks that the deltas add up to the
// Result and that the Result is the same every way.
func FuzzParser(f *testing.F) {
	for i, s := range fuzzSeeds() {
		f.Add(s, uint64(i), i%3 == 0)
	}
	f.Fuzz(func(t *testing.T, text string, seed uint64, single bool) {
		r := rand.New(rand.NewPCG(seed, 11))
		ways := [][]int{nil, everyByte(text), randomCuts(text, r), tokenCuts(text, r)}
		for _, format := range formats {
			o := Options{Named: "f", Single: single}
			var want outcome
			for n, cuts := range ways {
				got, err := run(format, o, text, cuts)
				if err != nil {
					t.Fatalf("%s, way %d: %v", format, n, err)
				}
				if n == 0 {
					want = got
				} else if got.content != want.content || !slices.Equal(got.calls, want.calls) {
					t.Fatalf("%s, way %d: content %q, calls %q; in one piece content %q, calls %q",
						format, n, got.content, got.calls, want.content, want.calls)
				}
			}
		}
	})
}

// scanAll reads text as one JSON value with the scanner, and reports
// whether it is one.
func scanAll(text string) bool {
	var s scanner
	s.reset(0, 0)
	for {
		switch s.next(text) {
		case evError:
			return false
		case evMore:
			// Only a number may end with the text.
			return s.pos == len(text) && len(s.stack) == 0 &&
				(s.state == stZero || s.state == stInt || s.state == stFrac || s.state == stExpDigits)
		case evEnd:
			if s.depth == 0 {
				return skipSpace(text, s.pos) == len(text) && !containsOtherSpace(text[s.pos:])
			}
		}
	}
}

// containsOtherSpace reports whitespace that JSON does not allow.
func containsOtherSpace(s string) bool {
	for i := range len(s) {
		if s[i] == '\f' || s[i] == '\v' {
			return true
		}
	}
	return false
}

// FuzzScanner checks that the scanner takes what encoding/json takes, and
// reads texts split anywhere the same way.
func FuzzScanner(f *testing.F) {
	for _, s := range []string{nestedArgs, `-0.1e-2`, `"\ud83d\ude00"`, `[1,[2,{"a":{}}]]`, `{"a":tru}`, `01`, `1.`, `"a` + "\x01" + `"`, ` null `} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, text string) {
		if got, want := scanAll(text), json.Valid([]byte(text)); got != want {
			t.Fatalf("scanner says %v, encoding/json %v, for %q", got, want, text)
		}
		// The events are the same read in pieces.
		h := fnv.New64a()
		h.Write([]byte(text))
		cuts := randomCuts(text, rand.New(rand.NewPCG(h.Sum64(), 1)))
		if a, b := events(text, nil), events(text, cuts); !slices.Equal(a, b) {
			t.Fatalf("events %v in one piece, %v in pieces %v", a, b, cuts)
		}
	})
}

// events lists the scanner's events, watching two levels, as text is read
// in pieces cut at cuts.
func events(text string, cuts []int) []int {
	var s scanner
	s.reset(0, 2)
	var out []int
	for _, end := range append(cuts, len(text)) {
		for {
			ev := s.next(text[:end])
			if ev == evMore {
				break
			}
			out = append(out, int(ev), s.at, s.depth)
			if ev == evError || ev == evEnd && s.depth == 0 {
				return out
			}
		}
	}
	return out
}

func TestScannerAgreesWithEncodingJSON(t *testing.T) {
	for _, s := range fuzzSeeds() {
		for i := 0; i <= len(s); i++ {
			for _, text := range []string{s[:i], s[i:]} {
				if got, want := scanAll(text), json.Valid([]byte(text)); got != want {
					t.Fatalf("scanner says %v, encoding/json %v, for %q", got, want, text)
				}
			}
		}
	}
}
