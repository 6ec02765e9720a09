package toolcall

import (
	"fmt"
	"math/rand/v2"
	"regexp"
	"slices"
	"strings"
	"unicode/utf8"
)

// formats are all the formats, for tests that run each.
var formats = []Format{Hermes, Llama3JSON, Mistral, Arguments, JSONList}

// outcome is what a Parser said about one output: its Result, and what its
// deltas add up to.
type outcome struct {
	content string
	calls   []Call
	// streamed is the concatenation of the deltas' content, and
	// streamedCalls of their calls.
	streamed      string
	streamedCalls []Call
}

// sum adds deltas up, checking each.
type sum struct {
	content strings.Builder
	names   []string
	args    []*strings.Builder
}

// run feeds text to a new Parser in Updates that end at cuts (increasing
// offsets; the last Update, with all of text, is added), and checks the
// invariants every delta must keep. It returns the outcome, or what is
// wrong.
func run(f Format, o Options, text string, cuts []int) (outcome, error) {
	p, err := New(f, o)
	if err != nil {
		return outcome{}, err
	}
	var out outcome
	var ends []int
	for _, c := range cuts {
		if c > 0 && c < len(text) && (len(ends) == 0 || c > ends[len(ends)-1]) {
			ends = append(ends, c)
		}
	}
	ends = append(ends, len(text))
	valid := utf8.ValidString(text)
	var sm sum
	for n, end := range ends {
		final := n == len(ends)-1
		d := p.Update(text[:end], final)
		if err := sm.add(d, valid && !final); err != nil {
			return out, fmt.Errorf("update %d (text[:%d]): %w", n, end, err)
		}
	}
	out.streamed = sm.content.String()
	for i, name := range sm.names {
		out.streamedCalls = append(out.streamedCalls, Call{Name: name, Arguments: sm.args[i].String()})
	}
	out.content, out.calls = p.Result()
	if out.content != out.streamed {
		return out, fmt.Errorf("content %q, but the deltas add up to %q", out.content, out.streamed)
	}
	if !slices.Equal(out.calls, out.streamedCalls) {
		return out, fmt.Errorf("calls %q, but the deltas add up to %q", out.calls, out.streamedCalls)
	}
	if strings.TrimLeft(out.content, " \t\r\n\f\v") == "" && out.content != "" {
		return out, fmt.Errorf("content %q is only whitespace", out.content)
	}
	for _, c := range out.calls {
		if c.Name == "" {
			return out, fmt.Errorf("a call with no name: %q", out.calls)
		}
	}
	if after := p.Update(text+"more", true); after.Content != "" || after.Calls != nil {
		return out, fmt.Errorf("an Update after the final one returned %+v", after)
	}
	return out, nil
}

// add adds d, checking that calls come in order of index, at most once
// each, with a name in a call's first delta only, and, when runes is true,
// that fragments end on whole runes.
func (sm *sum) add(d Delta, runes bool) error {
	if runes && whole(d.Content) != len(d.Content) {
		return fmt.Errorf("content %q ends inside a rune", d.Content)
	}
	sm.content.WriteString(d.Content)
	last := -1
	for _, cd := range d.Calls {
		if cd.Index <= last {
			return fmt.Errorf("call %d after call %d in one delta", cd.Index, last)
		}
		last = cd.Index
		switch {
		case cd.Index == len(sm.names):
			if cd.Name == "" {
				return fmt.Errorf("call %d's first delta has no name", cd.Index)
			}
			sm.names = append(sm.names, cd.Name)
			sm.args = append(sm.args, new(strings.Builder))
		case cd.Index > len(sm.names):
			return fmt.Errorf("call %d announced before call %d", cd.Index, len(sm.names))
		case cd.Name != "":
			return fmt.Errorf("call %d named again, %q", cd.Index, cd.Name)
		case cd.Arguments == "":
			return fmt.Errorf("call %d has an empty delta", cd.Index)
		}
		if runes && whole(cd.Arguments) != len(cd.Arguments) {
			return fmt.Errorf("call %d's fragment %q ends inside a rune", cd.Index, cd.Arguments)
		}
		sm.args[cd.Index].WriteString(cd.Arguments)
	}
	return nil
}

// everyByte cuts text after each of its bytes.
func everyByte(text string) []int {
	cuts := make([]int, len(text))
	for i := range cuts {
		cuts[i] = i + 1
	}
	return cuts
}

// token matches roughly what a BPE tokenizer makes one token of: a word
// with its leading space, up to three digits, a run of punctuation, or
// whitespace.
var token = regexp.MustCompile(`[ ]?[\p{L}\p{M}]+|[0-9]{1,3}|[ ]?[^\s\p{L}\p{M}0-9]{1,3}|\s+`)

// tokenCuts cuts text at token-like boundaries, merging some tokens and
// splitting some inside, at random.
func tokenCuts(text string, r *rand.Rand) []int {
	var cuts []int
	for _, loc := range token.FindAllStringIndex(text, -1) {
		if loc[1]-loc[0] > 1 && r.IntN(8) == 0 {
			cuts = append(cuts, loc[0]+1+r.IntN(loc[1]-loc[0]-1))
		}
		if r.IntN(4) != 0 {
			cuts = append(cuts, loc[1])
		}
	}
	return cuts
}

// randomCuts cuts text into pieces of 1 to 8 bytes.
func randomCuts(text string, r *rand.Rand) []int {
	var cuts []int
	for i := 1 + r.IntN(8); i < len(text); i += 1 + r.IntN(8) {
		cuts = append(cuts, i)
	}
	return cuts
}

// splits are the ways a test feeds one output: in one piece, a byte at a
// time, in two pieces cut at each offset (for outputs up to maxPairs
// bytes), and in random token-like and byte pieces.
func splits(text string, seed uint64, maxPairs int) map[string][]int {
	r := rand.New(rand.NewPCG(seed, 7))
	s := map[string][]int{"one piece": nil, "every byte": everyByte(text)}
	if len(text) <= maxPairs {
		for i := 1; i < len(text); i++ {
			s[fmt.Sprintf("cut at %d", i)] = []int{i}
		}
	}
	for i := range 8 {
		s[fmt.Sprintf("tokens %d", i)] = tokenCuts(text, r)
		s[fmt.Sprintf("random %d", i)] = randomCuts(text, r)
	}
	return s
}

// sameEverywhere runs text through every split and checks that each gives
// the one-piece outcome. It returns that outcome.
func sameEverywhere(f Format, o Options, text string, seed uint64, maxPairs int) (outcome, error) {
	want, err := run(f, o, text, nil)
	if err != nil {
		return want, fmt.Errorf("in one piece: %w", err)
	}
	for name, cuts := range splits(text, seed, maxPairs) {
		got, err := run(f, o, text, cuts)
		if err != nil {
			return want, fmt.Errorf("%s: %w", name, err)
		}
		if got.content != want.content || !slices.Equal(got.calls, want.calls) {
			return want, fmt.Errorf("%s: content %q, calls %q; in one piece content %q, calls %q",
				name, got.content, got.calls, want.content, want.calls)
		}
	}
	return want, nil
}
