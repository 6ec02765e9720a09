package grammar

import (
	"encoding/json"
	"errors"
	"hash/fnv"
	"math/rand/v2"
	"regexp"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// deriveOne is one random text of g, seeded by the input so that failures
// reproduce; ok is false when the grammar needs more steps than the
// generator takes (a minLength of a million).
func deriveOne(g *tgrammar, seed []byte) (string, bool) {
	h := fnv.New64a()
	h.Write(seed)
	gn := &generator{g: g, pick: rand.New(rand.NewPCG(h.Sum64(), 3)).IntN, maxDepth: 6}
	text, err := gn.generate()
	return text, err == nil
}

// generatedText checks a conversion's result: an error must be an *Error,
// and a grammar must be bounded and parse; it returns one random text of
// the grammar, seeded by the input, and false when there is none to check.
func generatedText(t *testing.T, out string, err error, seed []byte) (string, bool) {
	t.Helper()
	if err != nil {
		var e *Error
		if !errors.As(err, &e) {
			t.Fatalf("error %v is not an *Error", err)
		}
		return "", false
	}
	return deriveOne(checkGenerated(t, out), seed)
}

func checkGenerated(t *testing.T, out string) *tgrammar {
	t.Helper()
	if len(out) > MaxGrammarBytes {
		t.Fatalf("grammar of %d bytes", len(out))
	}
	if err := CheckGBNF(out); err != nil {
		t.Fatalf("CheckGBNF refuses a generated grammar: %v\n%s", err, out)
	}
	g, err := parseGBNF(out)
	if err != nil {
		t.Fatalf("generated grammar does not parse: %v\n%s", err, out)
	}
	return g
}

func FuzzFromJSONSchema(f *testing.F) {
	for _, tc := range corpus {
		f.Add([]byte(tc.schema))
	}
	f.Add([]byte(`{"anyOf":[{"$ref":"#"},{"type":"null"}]}`))
	f.Add([]byte(`{"type":"array","prefixItems":[{"type":"integer","minimum":-3,"exclusiveMaximum":3}],"maxItems":2}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		out, err := FromJSONSchema(data)
		text, ok := generatedText(t, out, err, data)
		if !ok {
			return
		}
		if !json.Valid([]byte(text)) {
			t.Fatalf("generated %q is not JSON\n%s", text, out)
		}
		if sch := tryCompile(data); sch != nil {
			if err := validate(sch, text); err != nil {
				t.Fatalf("generated %q is invalid: %v\n%s", text, err, out)
			}
		}
	})
}

// tryCompile compiles a schema the validator accepts, or returns nil.
func tryCompile(data []byte) (sch *jsonschema.Schema) {
	defer func() {
		if recover() != nil {
			sch = nil
		}
	}()
	doc, err := jsonschema.UnmarshalJSON(strings.NewReader(string(data)))
	if err != nil {
		return nil
	}
	doc = relaxOneOf(doc)
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	c.AssertFormat()
	if c.AddResource("mem://schema.json", doc) != nil {
		return nil
	}
	sch, err = c.Compile("mem://schema.json")
	if err != nil {
		return nil
	}
	return sch
}

// relaxOneOf turns every oneOf into anyOf, because the grammars do not
// enforce oneOf's exclusivity (as documented). Constants are left alone.
func relaxOneOf(v any) any {
	switch v := v.(type) {
	case map[string]any:
		out := map[string]any{}
		for k, val := range v {
			if k == "enum" || k == "const" {
				out[k] = val
				continue
			}
			val = relaxOneOf(val)
			if _, isArray := val.([]any); k == "oneOf" && isArray {
				if _, both := v["anyOf"]; !both {
					k = "anyOf"
				}
			}
			out[k] = val
		}
		return out
	case []any:
		out := make([]any, len(v))
		for i, e := range v {
			out[i] = relaxOneOf(e)
		}
		return out
	}
	return v
}

// fullMatcher reports whether pattern matches a whole text. Wrapping the
// pattern in ^(?:...)$ would not do: \Q quotes to the end.
func fullMatcher(pattern string) (func(string) bool, error) {
	re, err := regexp.Compile(pattern)
	if err != nil {
		return nil, err
	}
	re.Longest()
	return func(s string) bool {
		loc := re.FindStringIndex(s)
		return loc != nil && loc[0] == 0 && loc[1] == len(s)
	}, nil
}

func FuzzFromRegex(f *testing.F) {
	for _, p := range regexCases {
		f.Add(p)
	}
	f.Fuzz(func(t *testing.T, pattern string) {
		out, err := FromRegex(pattern)
		text, ok := generatedText(t, out, err, []byte(pattern))
		if !ok {
			return
		}
		full, err := fullMatcher(pattern)
		if err != nil {
			t.Fatalf("FromRegex accepts %q, which regexp refuses: %v", pattern, err)
		}
		if !full(text) {
			t.Fatalf("generated %q does not match %q\n%s", text, pattern, out)
		}
	})
}
