package grammar

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
)

func wantSchemaError(t *testing.T, schema, keyword string) *Error {
	t.Helper()
	out, err := FromJSONSchema([]byte(schema))
	var e *Error
	if !errors.As(err, &e) {
		t.Fatalf("FromJSONSchema(%.80s) = %v, %v; want an *Error", schema, out, err)
	}
	if e.Keyword != keyword {
		t.Fatalf("FromJSONSchema(%.80s): keyword %q, want %q (%v)", schema, e.Keyword, keyword, e)
	}
	if !strings.HasPrefix(e.Error(), "json_schema") {
		t.Fatalf("message %q does not name its source", e.Error())
	}
	return e
}

func TestRefusedKeywords(t *testing.T) {
	for _, kw := range []string{
		"multipleOf", "not", "if", "then", "else", "patternProperties", "propertyNames",
		"minProperties", "maxProperties", "dependentRequired", "dependentSchemas", "dependencies",
		"unevaluatedProperties", "contains", "minContains", "maxContains", "unevaluatedItems",
		"additionalItems", "contentSchema", "$anchor", "$dynamicRef", "$dynamicAnchor",
		"$recursiveRef", "$recursiveAnchor", "$vocabulary",
	} {
		t.Run(kw, func(t *testing.T) {
			e := wantSchemaError(t, fmt.Sprintf(`{"properties":{"age":{"type":"integer",%q:2}}}`, kw), kw)
			if e.Path != "/properties/age" {
				t.Errorf("path %q", e.Path)
			}
			if want := "json_schema /properties/age: " + kw + " is not supported"; e.Error() != want {
				t.Errorf("message %q, want %q", e.Error(), want)
			}
		})
	}
}

func TestSchemaErrors(t *testing.T) {
	for _, tc := range []struct{ name, schema, keyword string }{
		{"uniqueItems", `{"type":"array","uniqueItems":true}`, "uniqueItems"},
		{"unknown keyword", `{"type":"string","nullable":true}`, "nullable"},
		{"nested $id", `{"properties":{"a":{"$id":"x","type":"string"}}}`, "$id"},
		{"remote ref", `{"$ref":"other.json#/a"}`, "$ref"},
		{"anchor ref", `{"$ref":"#foo"}`, "$ref"},
		{"dangling ref", `{"$ref":"#/$defs/nope"}`, "$ref"},
		{"ref not a string", `{"$ref":1}`, "$ref"},
		{"left recursion", `{"anyOf":[{"$ref":"#"},{"type":"null"}]}`, "$ref"},
		{"ref cycle", `{"$defs":{"a":{"$ref":"#/$defs/b"},"b":{"$ref":"#/$defs/a"}},"$ref":"#/$defs/a"}`, "$ref"},
		{"infinite recursion", `{"properties":{"next":{"$ref":"#"}},"required":["next"]}`, "$ref"},
		{"ref with siblings", `{"$ref":"#/$defs/a","type":"object","$defs":{"a":{}}}`, "type"},
		{"unsupported format", `{"type":"string","format":"uri"}`, "format"},
		{"format and pattern", `{"type":"string","format":"date","pattern":"x"}`, "format"},
		{"lookahead", `{"type":"string","pattern":"(?=a)"}`, "pattern"},
		{"word boundary", `{"type":"string","pattern":"\\bword"}`, "pattern"},
		{"surrogate in pattern", `{"type":"string","pattern":"\\x{D800}"}`, "pattern"},
		{"inner anchor", `{"type":"string","pattern":"a$b"}`, "pattern"},
		{"unanchored with maxLength", `{"type":"string","pattern":"ab","maxLength":5}`, "maxLength"},
		{"pattern longer than maxLength", `{"type":"string","pattern":"^a{2,9}$","maxLength":5}`, "maxLength"},
		{"pattern shorter than minLength", `{"type":"string","pattern":"^a{2,9}$","minLength":3}`, "minLength"},
		{"format with maxLength", `{"type":"string","format":"date-time","maxLength":20}`, "maxLength"},
		{"minLength above maxLength", `{"type":"string","minLength":5,"maxLength":4}`, "minLength"},
		{"negative maxLength", `{"type":"string","maxLength":-1}`, "maxLength"},
		{"huge maxItems", `{"type":"array","maxItems":1e9}`, "maxItems"},
		{"minItems above maxItems", `{"type":"array","minItems":3,"maxItems":2}`, "minItems"},
		{"minItems beyond tuple", `{"type":"array","prefixItems":[{}],"items":false,"minItems":2}`, "minItems"},
		{"items as array", `{"type":"array","items":[{}]}`, "items"},
		{"non-integer number bound", `{"type":"number","minimum":0.5}`, "minimum"},
		{"non-integer exclusive bound", `{"type":"number","exclusiveMaximum":2.5}`, "exclusiveMaximum"},
		{"empty integer range", `{"type":"integer","minimum":5,"maximum":4}`, "minimum"},
		{"empty exclusive range", `{"type":"integer","exclusiveMinimum":1,"exclusiveMaximum":2}`, "exclusiveMinimum"},
		{"empty number range", `{"type":"number","minimum":3,"exclusiveMaximum":3}`, "minimum"},
		{"integer beyond digits", `{"type":"integer","minimum":1e20}`, "minimum"},
		{"number beyond digits", `{"type":"number","maximum":-1e17}`, "maximum"},
		{"bound not a number", `{"type":"integer","minimum":"1"}`, "minimum"},
		{"huge exponent", `{"type":"integer","minimum":1e999999999}`, "minimum"},
		{"allOf of non-objects", `{"allOf":[{"type":"string"},{"maxLength":3}]}`, "allOf"},
		{"allOf with additionalProperties", `{"allOf":[{"properties":{"a":{}}},{"additionalProperties":false}]}`, "allOf"},
		{"allOf duplicate property", `{"allOf":[{"properties":{"a":{}}},{"properties":{"a":{}}}]}`, "allOf"},
		{"anyOf with siblings", `{"anyOf":[{"type":"string"}],"properties":{"a":{}}}`, "properties"},
		{"anyOf and oneOf", `{"anyOf":[{}],"oneOf":[{}]}`, "oneOf"},
		{"empty anyOf", `{"anyOf":[]}`, "anyOf"},
		{"enum and const", `{"enum":[1],"const":1}`, "const"},
		{"enum with minLength", `{"enum":["a"],"minLength":1}`, "minLength"},
		{"enum of wrong type", `{"type":"string","enum":[1,2]}`, "enum"},
		{"empty enum", `{"enum":[]}`, "enum"},
		{"unknown type", `{"type":"float"}`, "type"},
		{"duplicate type", `{"type":["string","string"]}`, "type"},
		{"required not declared", `{"type":"object","properties":{"a":{}},"required":["b"]}`, "required"},
		{"required not an array", `{"type":"object","properties":{"a":{}},"required":"a"}`, "required"},
		{"properties not an object", `{"type":"object","properties":[]}`, "properties"},
		{"bad additionalProperties", `{"type":"object","additionalProperties":1}`, "additionalProperties"},
		{"false schema", `false`, ""},
		{"false subschema", `{"properties":{"a":false}}`, ""},
		{"schema not an object", `[]`, ""},
		{"invalid JSON", `{"type":`, ""},
		{"duplicate key", `{"type":"string","type":"integer"}`, ""},
		{"trailing data", `{} {}`, ""},
	} {
		t.Run(tc.name, func(t *testing.T) { wantSchemaError(t, tc.schema, tc.keyword) })
	}
}

func TestLimits(t *testing.T) {
	nested := strings.Repeat(`{"type":"array","items":`, MaxDepth+1) + `{}` + strings.Repeat(`}`, MaxDepth+1)
	okNested := strings.Repeat(`{"type":"array","items":`, MaxDepth) + `{}` + strings.Repeat(`}`, MaxDepth)
	big := `{"type":"string","description":"` + strings.Repeat("x", MaxSchemaBytes) + `"}`
	deepJSON := `{"default":` + strings.Repeat("[", maxJSONNesting+1) + strings.Repeat("]", maxJSONNesting+1) + `}`
	longPattern := strings.Repeat("a", MaxPatternBytes+1)
	var props []string
	for i := range 16 {
		// Distinct patterns, so that no two values share a rule.
		props = append(props, fmt.Sprintf(`"p%d":{"type":"string","pattern":"(?i)%s"}`, i, strings.Repeat(string(rune('a'+i))+"b", 1800)))
	}
	explosive := `{"type":"object","properties":{` + strings.Join(props, ",") + `}}`
	if len(explosive) > MaxSchemaBytes {
		t.Fatalf("explosive schema is %d bytes", len(explosive))
	}

	for _, tc := range []struct {
		name    string
		run     func() (string, error)
		keyword string
	}{
		{"schema size", func() (string, error) { return FromJSONSchema([]byte(big)) }, ""},
		{"schema depth", func() (string, error) { return FromJSONSchema([]byte(nested)) }, ""},
		{"JSON nesting", func() (string, error) { return FromJSONSchema([]byte(deepJSON)) }, ""},
		{"schema pattern size", func() (string, error) {
			return FromJSONSchema([]byte(`{"type":"string","pattern":"` + longPattern + `"}`))
		}, "pattern"},
		{"generated grammar size", func() (string, error) { return FromJSONSchema([]byte(explosive)) }, ""},
		{"regex size", func() (string, error) { return FromRegex(longPattern) }, "pattern"},
		{"long names with extra keys", func() (string, error) {
			return FromJSONSchema([]byte(`{"type":"object","properties":{"` + strings.Repeat("k", 30000) + `":{}},"additionalProperties":true}`))
		}, "additionalProperties"},
		{"choices", func() (string, error) { return FromChoice(make([]string, MaxChoices+1)) }, "choice"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := tc.run()
			var e *Error
			if !errors.As(err, &e) || e.Keyword != tc.keyword {
				t.Fatalf("got %d bytes, %v; want an *Error for %q", len(out), err, tc.keyword)
			}
		})
	}
	if _, err := FromJSONSchema([]byte(okNested)); err != nil {
		t.Errorf("nesting of exactly MaxDepth: %v", err)
	}
	if err := CheckGBNF("root ::= \"" + strings.Repeat("a", MaxGrammarBytes) + "\""); err == nil {
		t.Error("CheckGBNF accepts a grammar above MaxGrammarBytes")
	}
}

func TestCheckGBNF(t *testing.T) {
	for _, g := range []string{
		"root ::= \"a\"",
		"root ::= object\nvalue  ::= object | array | string | number | (\"true\" | \"false\" | \"null\") ws\n\nobject ::=\n  \"{\" ws (\n            string \":\" ws value\n    (\",\" ws string \":\" ws value)*\n  )? \"}\" ws\n\narray  ::=\n  \"[\" ws (\n            value\n    (\",\" ws value)*\n  )? \"]\" ws\n\nstring ::=\n  \"\\\"\" (\n    [^\"\\\\\\x7F\\x00-\\x1F] |\n    \"\\\\\" ([\"\\\\bfnrt] | \"u\" [0-9a-fA-F]{4}) # escapes\n  )* \"\\\"\" ws\n\nnumber ::= (\"-\"? ([0-9] | [1-9] [0-9]{0,15})) (\".\" [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws\n\n# Optional space\nws ::= | \" \" | \"\\n\" [ \\t]{0,20}\n",
		"# comment\nroot ::= <think> thinking </think> .*\nthinking ::= !</think>*\n",
		"root ::= <[1000]> [\\u0041-\\U0001F600] \"\\x41\"{2,} x\nx ::= \"x\" |\n  \"y\"\n",
		"root ::= (\"a\" | \"b\")+ [\\]\\-\\[^]? \"\\\"\"",
		JSONObject(),
	} {
		if err := CheckGBNF(g); err != nil {
			t.Errorf("CheckGBNF(%.40q): %v", g, err)
		}
	}
	for name, g := range map[string]string{
		"no root":        "start ::= \"a\"",
		"undefined rule": "root ::= a b\na ::= \"a\"",
		"open paren":     "root ::= (\"a\"",
		"close paren":    "root ::= \"a\")",
		"open literal":   "root ::= \"a",
		"open class":     "root ::= [a-z",
		"bad escape":     "root ::= \"\\q\"",
		"short hex":      "root ::= \"\\x4\"",
		"bad name":       "ro_ot ::= \"a\"",
		"no ::=":         "root = \"a\"",
		"lone operator":  "root ::= * \"a\"",
		"bad count":      "root ::= \"a\"{3,1}",
		"huge count":     "root ::= \"a\"{3000}",
		"open count":     "root ::= \"a\"{3",
		"open token":     "root ::= <think",
		"deep nesting":   "root ::= " + strings.Repeat("(", 200) + "\"a\"" + strings.Repeat(")", 200),
		"bad utf8":       "root ::= \"\xff\"",
		"empty":          "",
	} {
		err := CheckGBNF(g)
		var e *Error
		if !errors.As(err, &e) || e.Keyword != "grammar" {
			t.Errorf("%s: CheckGBNF = %v, want an *Error for grammar", name, err)
		}
	}
}

func TestGeneratedGrammarsAreLlamaSafe(t *testing.T) {
	// The test parser refuses repeated groups and counts above 1000, as
	// llama.cpp would mishandle them; these schemas need blocks.
	for _, schema := range []string{
		`{"type":"string","maxLength":1000000}`,
		`{"type":"string","minLength":2500,"maxLength":7777}`,
		`{"type":"array","items":{"type":"integer"},"minItems":1001,"maxItems":123456}`,
		`{"type":"string","pattern":"^(ab{0,500}c){0,2}$"}`,
	} {
		grammarFor(t, schema)
	}
}

func TestBlockCounts(t *testing.T) {
	for _, n := range []struct{ lo, hi int }{{0, 2500}, {1001, 1001}, {999, 3001}, {2000, 2000}, {0, 1000}, {1500, unbounded}} {
		b := newBuilder()
		b.define(b.reserve("root"), repOf(lit("a"), n.lo, n.hi))
		g, err := parseGBNF(b.text())
		if err != nil {
			t.Fatalf("%v: %v", n, err)
		}
		for _, c := range []int{n.lo - 1, n.lo, n.lo + 1, (n.lo + max(n.hi, n.lo)) / 2, n.hi - 1, n.hi, n.hi + 1} {
			if c < 0 {
				continue
			}
			want := c >= n.lo && (n.hi == unbounded || c <= n.hi)
			if got := g.matches(strings.Repeat("a", c)); got != want {
				t.Errorf("a{%d,%d} on %d a's: %v, want %v\n%s", n.lo, n.hi, c, got, want, b.text())
			}
		}
	}
}

func TestJSONObject(t *testing.T) {
	g, err := parseGBNF(JSONObject())
	if err != nil {
		t.Fatal(err)
	}
	gn := &generator{g: g, pick: rand.New(rand.NewPCG(7, 7)).IntN, maxDepth: 8}
	for range 200 {
		text, err := gn.generate()
		if err != nil {
			t.Fatal(err)
		}
		var v map[string]any
		if err := json.Unmarshal([]byte(text), &v); err != nil {
			t.Fatalf("generated %q is not a JSON object: %v", text, err)
		}
	}
	for _, text := range []string{`{}`, `{"a": [1, {"b": null}], "c": "\u00e9"}`} {
		if !g.matches(text) {
			t.Errorf("rejects %q", text)
		}
	}
	for _, text := range []string{`[]`, `1`, `{"a":1}\n`} {
		if g.matches(text) {
			t.Errorf("admits %q", text)
		}
	}
}
