package grammar

import (
	"encoding/json"
	"regexp"
	"slices"
	"strconv"
	"testing"

	"pgregory.net/rapid"
)

var regexCases = []string{
	`[A-Z]{3}-[0-9]{2,4}`,
	`\d{3}`,
	`ab+c`,
	`(foo|bar)*baz`,
	`[^a-c]{2}x?`,
	`(?i)hello wörld`,
	`a.b`,
	`\p{Greek}+`,
	`x{2,5}y{0,3}`,
	`\w+@\w+\.com`,
	`(a|b|)c`,
	`^abc$`,
	`^(ab|cd)$`,
	`[\s\S]{1,3}`,
	`\.\*\+\?\[\]\{\}\(\)\|\^\$\\`,
	`"quoted" \\ and \x00\x7f`,
	`(?s).{0,4}`,
	`[\x{1F600}-\x{1F64F}]{1,2}`,
	`(ab){2,3}(cd)?`,
	`[-^\]]+`,
	`(?U)a+?b`,
	``,
	`\Qa.b\E`,
	`((a|b){1,3}c){0,2}`,
	`[^\n]*`,
	`\PL{2}`,
	`z{1000}`,
}

// pickFrom draws the generator's choices from rapid, so that failures
// shrink.
func pickFrom(t *rapid.T) func(n int) int {
	return func(n int) int { return rapid.IntRange(0, n-1).Draw(t, "pick") }
}

func regexGrammar(t *testing.T, pattern string) *tgrammar {
	t.Helper()
	out, err := FromRegex(pattern)
	if err != nil {
		t.Fatalf("FromRegex(%q): %v", pattern, err)
	}
	if err := CheckGBNF(out); err != nil {
		t.Fatalf("CheckGBNF: %v\n%s", err, out)
	}
	g, err := parseGBNF(out)
	if err != nil {
		t.Fatalf("parse: %v\n%s", err, out)
	}
	return g
}

// TestFromRegexSound: everything the grammar generates matches the pattern
// as a whole.
func TestFromRegexSound(t *testing.T) {
	for _, p := range regexCases {
		t.Run(p, func(t *testing.T) {
			g := regexGrammar(t, p)
			re := regexp.MustCompile(`^(?:` + p + `)$`)
			rapid.Check(t, func(rt *rapid.T) {
				gn := &generator{g: g, pick: pickFrom(rt), maxDepth: 8}
				s, err := gn.generate()
				if err != nil {
					rt.Fatal(err)
				}
				if !re.MatchString(s) {
					rt.Fatalf("generated %q does not match", s)
				}
			})
		})
	}
}

// TestFromRegexComplete: everything the pattern matches as a whole, the
// grammar matches, and random text is matched by both or by neither.
func TestFromRegexComplete(t *testing.T) {
	for _, p := range regexCases {
		t.Run(p, func(t *testing.T) {
			g := regexGrammar(t, p)
			full := `^(?:` + p + `)$`
			re := regexp.MustCompile(full)
			rapid.Check(t, func(rt *rapid.T) {
				s := rapid.StringMatching(full).Draw(rt, "match")
				if !g.matches(s) {
					rt.Fatalf("grammar rejects %q", s)
				}
				other := rapid.String().Draw(rt, "other")
				if g.matches(other) != re.MatchString(other) {
					rt.Fatalf("grammar and regexp disagree on %q", other)
				}
			})
		})
	}
}

// TestPatternInJSONString: a schema pattern generates JSON strings whose
// content the pattern finds, with quotes, backslashes and control
// characters escaped.
func TestPatternInJSONString(t *testing.T) {
	patterns := []string{`^[a"\\]{1,4}$`, `[\x00-\x1f]`, `^.{2}$`, `x"y`, `^\\d$`, `(?i)^ß$`, `[^a]`, `^[\x{2028}\x{2029}\r\n]?$`}
	for _, p := range patterns {
		t.Run(p, func(t *testing.T) {
			schema, _ := json.Marshal(map[string]string{"type": "string", "pattern": p})
			g := grammarFor(t, string(schema))
			re := regexp.MustCompile(p)
			rapid.Check(t, func(rt *rapid.T) {
				gn := &generator{g: g, pick: pickFrom(rt), maxDepth: 8}
				text, err := gn.generate()
				if err != nil {
					rt.Fatal(err)
				}
				var s string
				if err := json.Unmarshal([]byte(text), &s); err != nil {
					rt.Fatalf("generated %q is not a JSON string: %v", text, err)
				}
				if !re.MatchString(s) {
					rt.Fatalf("generated %q: %q does not match", text, s)
				}
			})
		})
	}
}

func TestFromRegexErrors(t *testing.T) {
	for _, p := range []string{`(?=a)`, `(a)\1`, `a\bb`, `(?m)^a$`, `^a|b`, `a^b`, `[`, `[^\x00-\x{10FFFF}]`, string([]byte{0xff}), `\x{D800}`, `(?i)a\x{DFFF}`} {
		_, err := FromRegex(p)
		e, ok := err.(*Error)
		if !ok || e.Keyword != "pattern" {
			t.Errorf("FromRegex(%q) = %v, want an *Error for pattern", p, err)
		}
	}
}

func TestFromChoice(t *testing.T) {
	choices := []string{"yes", "no", "", "ye", "a\"b\\c", "日本", "line\nbreak", "[x]", "\x01"}
	out, err := FromChoice(choices)
	if err != nil {
		t.Fatal(err)
	}
	if err := CheckGBNF(out); err != nil {
		t.Fatal(err)
	}
	g, err := parseGBNF(out)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range choices {
		if !g.matches(c) {
			t.Errorf("grammar rejects choice %q", c)
		}
	}
	rapid.Check(t, func(rt *rapid.T) {
		gn := &generator{g: g, pick: pickFrom(rt), maxDepth: 8}
		s, err := gn.generate()
		if err != nil {
			rt.Fatal(err)
		}
		if !slices.Contains(choices, s) {
			rt.Fatalf("generated %q is not a choice", s)
		}
		other := rapid.String().Draw(rt, "other")
		if g.matches(other) != slices.Contains(choices, other) {
			rt.Fatalf("grammar and choice list disagree on %q", other)
		}
	})
}

func TestFromChoiceErrors(t *testing.T) {
	many := make([]string, MaxChoices+1)
	for i := range many {
		many[i] = strconv.Itoa(i)
	}
	for name, choices := range map[string][]string{
		"empty":    nil,
		"too many": many,
		"bad utf8": {"ok", string([]byte{0xc3})},
		"too long": {string(make([]byte, MaxGrammarBytes+1))},
	} {
		_, err := FromChoice(choices)
		if e, ok := err.(*Error); !ok || e.Keyword != "choice" {
			t.Errorf("%s: got %v, want an *Error for choice", name, err)
		}
	}
}
