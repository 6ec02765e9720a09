package grammar

import (
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// corpusCase is a schema with texts its grammar must admit (valid) and
// texts that are invalid against it, which the grammar must reject.
type corpusCase struct {
	name    string
	schema  string
	valid   []string
	invalid []string
}

var corpus = []corpusCase{
	{
		name:    "person",
		schema:  `{"type":"object","properties":{"name":{"type":"string","maxLength":20},"age":{"type":"integer","minimum":0,"maximum":150},"email":{"type":"string","format":"email"}},"required":["name"]}`,
		valid:   []string{`{"name":"Ann","age":30}`, `{"name":"Bob"}`, `{ "name": "Bob", "age": 0, "email": "bob@example.com" }`},
		invalid: []string{`{"age":3}`, `{"name":"A","age":151}`, `{"name":"A","age":-1}`, `{"name":"A","email":"nope"}`},
	},
	{
		name:    "nested address",
		schema:  `{"type":"object","properties":{"street":{"type":"string"},"city":{"type":"object","properties":{"name":{"type":"string","minLength":1},"zip":{"type":"string","pattern":"^\\d{5}$"}},"required":["name","zip"]}},"required":["street","city"]}`,
		valid:   []string{`{"street":"Main","city":{"name":"X","zip":"12345"}}`, `{"street": "", "city": {"name": "Köln", "zip": "50667"}}`},
		invalid: []string{`{"street":"Main","city":{"name":"","zip":"12345"}}`, `{"street":"Main","city":{"name":"X","zip":"1234"}}`},
	},
	{
		name:    "bounded int array",
		schema:  `{"type":"array","items":{"type":"integer"},"minItems":2,"maxItems":4}`,
		valid:   []string{`[1,2]`, `[1, 2, 3, -4]`, `[ 0,0,0 ]`},
		invalid: []string{`[1]`, `[1,2,3,4,5]`, `[]`, `[1,2.5]`},
	},
	{
		name:    "enum strings",
		schema:  `{"enum":["red","green","blue"]}`,
		valid:   []string{`"red"`, `"green"`, `"blue"`},
		invalid: []string{`"yellow"`, `"Red"`},
	},
	{
		name:    "enum mixed",
		schema:  `{"enum":[1,"two",null,true,{"a":[1,2]},2.5,"a\"b\\c","日本"]}`,
		valid:   []string{`1`, `"two"`, `null`, `true`, `{"a":[1,2]}`, `2.5`, `"a\"b\\c"`, `"日本"`},
		invalid: []string{`false`, `2`, `"three"`},
	},
	{
		name:    "enum with type",
		schema:  `{"type":"integer","enum":[1,2,"3",4.5,6.0]}`,
		valid:   []string{`1`, `2`, `6.0`},
		invalid: []string{`"3"`, `4.5`},
	},
	{
		name:    "const string",
		schema:  `{"const":"fixed"}`,
		valid:   []string{`"fixed"`},
		invalid: []string{`"fix"`},
	},
	{
		name:    "const object",
		schema:  `{"const":{"k":"v","n":[1,2]}}`,
		valid:   []string{`{"k":"v","n":[1,2]}`},
		invalid: []string{`{"k":"v"}`},
	},
	{
		name:   "optional and required",
		schema: `{"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"boolean"},"c":{"type":"null"},"d":{"type":"string"},"e":{"type":"integer"}},"required":["b","d"]}`,
		valid: []string{`{"b":true,"d":"x"}`, `{"a":1,"b":false,"c":null,"d":"","e":5}`, `{"b":true,"c":null,"d":"q"}`,
			`{"a":-3,"b":true,"d":"x","e":0}`},
		invalid: []string{`{"a":1,"d":"x"}`, `{"b":true}`, `{}`},
	},
	{
		name:    "all optional",
		schema:  `{"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"string"},"c":{"type":"boolean"}}}`,
		valid:   []string{`{}`, `{ }`, `{"a":1}`, `{"b":"x"}`, `{"c":true}`, `{"a":1,"c":false}`, `{"a":1,"b":"","c":true}`, `{"b":"x","c":true}`},
		invalid: []string{`{"a":"x"}`, `{"b":1}`},
	},
	{
		name:    "negative integer range",
		schema:  `{"type":"integer","minimum":-50,"maximum":-10}`,
		valid:   []string{`-50`, `-10`, `-23`, `-49`},
		invalid: []string{`-9`, `-51`, `0`, `10`},
	},
	{
		name:    "exclusive integer range",
		schema:  `{"type":"integer","exclusiveMinimum":-3,"exclusiveMaximum":7}`,
		valid:   []string{`-2`, `0`, `6`},
		invalid: []string{`-3`, `7`, `100`},
	},
	{
		name:    "integer range across zero",
		schema:  `{"type":"integer","minimum":-1000,"maximum":1000}`,
		valid:   []string{`-1000`, `-999`, `-1`, `0`, `7`, `99`, `1000`},
		invalid: []string{`-1001`, `1001`, `10000`},
	},
	{
		name:    "integer minimum only",
		schema:  `{"type":"integer","minimum":12345}`,
		valid:   []string{`12345`, `12346`, `99999`, `100000`, `9999999999999999`},
		invalid: []string{`12344`, `0`, `-12345`},
	},
	{
		name:    "integer maximum only",
		schema:  `{"type":"integer","maximum":-7}`,
		valid:   []string{`-7`, `-8`, `-100`, `-9999999999999999`},
		invalid: []string{`-6`, `0`, `7`},
	},
	{
		name:    "integer fractional bounds",
		schema:  `{"type":"integer","minimum":1.5,"maximum":4.5}`,
		valid:   []string{`2`, `3`, `4`},
		invalid: []string{`1`, `5`},
	},
	{
		name:    "number range",
		schema:  `{"type":"number","minimum":0,"maximum":100}`,
		valid:   []string{`0`, `3.25`, `100`, `100.0`, `0.0`, `99.999`, `50`},
		invalid: []string{`100.5`, `-0.5`, `101`},
	},
	{
		name:    "number exclusive",
		schema:  `{"type":"number","exclusiveMinimum":-1,"exclusiveMaximum":1}`,
		valid:   []string{`0`, `0.5`, `-0.5`, `-0.999`, `0.999`},
		invalid: []string{`1`, `-1`, `1.0`, `-1.5`},
	},
	{
		name:    "negative number range",
		schema:  `{"type":"number","minimum":-5,"maximum":-2}`,
		valid:   []string{`-5`, `-5.0`, `-2`, `-3.5`, `-2.0`, `-4.75`},
		invalid: []string{`-5.5`, `-1.5`, `0`, `-1`},
	},
	{
		name:    "number exclusive minimum only",
		schema:  `{"type":"number","exclusiveMinimum":0}`,
		valid:   []string{`0.1`, `1`, `12.5`, `0.001`},
		invalid: []string{`0`, `-1`},
	},
	{
		name:    "number unbounded",
		schema:  `{"type":"number"}`,
		valid:   []string{`0`, `-1.5`, `3e10`, `2.5E-3`, `1e+2`},
		invalid: []string{`"1"`},
	},
	{
		name:    "code pattern",
		schema:  `{"type":"string","pattern":"^[A-Z]{3}-[0-9]{2,4}$"}`,
		valid:   []string{`"ABC-12"`, `"XYZ-1234"`},
		invalid: []string{`"AB-12"`, `"ABC-12345"`, `"abc-12"`},
	},
	{
		name:    "unanchored digits",
		schema:  `{"type":"string","pattern":"\\d{3}"}`,
		valid:   []string{`"123"`, `"ab123cd"`, `"x\n9999"`},
		invalid: []string{`"12"`, `"1a2b3"`},
	},
	{
		name:    "unanchored ab+c",
		schema:  `{"type":"string","pattern":"ab+c"}`,
		valid:   []string{`"abc"`, `"xxabbbcyy"`, `"\"abc\""`},
		invalid: []string{`"ac"`, `"abb"`},
	},
	{
		name:    "pattern with escapes",
		schema:  `{"type":"string","pattern":"^[a\"\\\\]+\\t?$"}`,
		valid:   []string{`"a"`, `"\"\\a"`, `"a\t"`},
		invalid: []string{`""`, `"b"`},
	},
	{
		name:    "pattern alternatives",
		schema:  `{"type":"string","pattern":"^(foo|bar)?baz$"}`,
		valid:   []string{`"baz"`, `"foobaz"`, `"barbaz"`},
		invalid: []string{`"foo"`, `"foobarbaz"`},
	},
	{
		name:    "pattern any char",
		schema:  `{"type":"string","pattern":"^a.c$"}`,
		valid:   []string{`"abc"`, `"a c"`, `"a\"c"`, `"aéc"`},
		invalid: []string{`"ac"`, `"a\nc"`},
	},
	{
		name:    "pattern greek with length",
		schema:  `{"type":"string","pattern":"^[α-ω]{2,3}$","minLength":2,"maxLength":3}`,
		valid:   []string{`"αβ"`, `"ωωω"`},
		invalid: []string{`"α"`, `"ab"`},
	},
	{
		name:    "date",
		schema:  `{"type":"string","format":"date"}`,
		valid:   []string{`"2024-02-29"`, `"2023-12-31"`, `"2000-02-29"`, `"1999-04-30"`},
		invalid: []string{`"2023-02-29"`, `"2023-04-31"`, `"1900-02-29"`, `"2023-13-01"`},
	},
	{
		name:    "time",
		schema:  `{"type":"string","format":"time"}`,
		valid:   []string{`"23:59:59Z"`, `"00:00:00.123+05:30"`, `"12:30:00-08:00"`},
		invalid: []string{`"24:00:00Z"`, `"12:60:00Z"`, `"12:00:00"`},
	},
	{
		name:    "date-time",
		schema:  `{"type":"string","format":"date-time"}`,
		valid:   []string{`"2024-01-15T10:20:30Z"`, `"1999-12-31T23:59:59.999999999+14:00"`},
		invalid: []string{`"2024-01-15 10:20:30Z"`, `"2024-01-15T10:20:30"`},
	},
	{
		name:    "uuid",
		schema:  `{"type":"string","format":"uuid"}`,
		valid:   []string{`"123e4567-e89b-12d3-a456-426614174000"`, `"ABCDEF01-2345-6789-ABCD-EF0123456789"`},
		invalid: []string{`"123e4567e89b12d3a456426614174000"`, `"123e4567-e89b-12d3-a456-42661417400g"`},
	},
	{
		name:    "email",
		schema:  `{"type":"string","format":"email"}`,
		valid:   []string{`"a@b.co"`, `"first.last+tag@mail.example.org"`},
		invalid: []string{`"a@"`, `".a@b.co"`, `"a..b@c.de"`},
	},
	{
		name:    "anyOf",
		schema:  `{"anyOf":[{"type":"string","maxLength":5},{"type":"integer","minimum":0,"maximum":9},{"type":"null"}]}`,
		valid:   []string{`"abc"`, `""`, `7`, `null`},
		invalid: []string{`"abcdef"`, `10`, `true`},
	},
	{
		name:    "type list",
		schema:  `{"type":["string","null"],"maxLength":3}`,
		valid:   []string{`"abc"`, `null`, `""`},
		invalid: []string{`"abcd"`, `1`},
	},
	{
		name:    "type list with bounds",
		schema:  `{"type":["integer","boolean"],"minimum":3}`,
		valid:   []string{`3`, `42`, `true`, `false`},
		invalid: []string{`2`, `"x"`},
	},
	{
		name:    "refs",
		schema:  `{"$defs":{"pt":{"type":"object","properties":{"x":{"type":"integer"},"y":{"type":"integer"}},"required":["x","y"]}},"type":"object","properties":{"a":{"$ref":"#/$defs/pt"},"b":{"$ref":"#/$defs/pt"}},"required":["a"]}`,
		valid:   []string{`{"a":{"x":1,"y":2}}`, `{"a":{"x":1,"y":2},"b":{"x":-1,"y":0}}`},
		invalid: []string{`{"b":{"x":1,"y":2}}`, `{"a":{"x":1}}`},
	},
	{
		name:    "recursive tree",
		schema:  `{"$ref":"#/$defs/node","$defs":{"node":{"type":"object","properties":{"value":{"type":"integer","minimum":0,"maximum":99},"children":{"type":"array","items":{"$ref":"#/$defs/node"},"maxItems":2}},"required":["value"]}}}`,
		valid:   []string{`{"value":1}`, `{"value":1,"children":[]}`, `{"value":1,"children":[{"value":2},{"value":3,"children":[{"value":4}]}]}`},
		invalid: []string{`{"value":1,"children":[{"value":2},{"value":3},{"value":4}]}`, `{"value":100}`},
	},
	{
		name:    "definitions and pointer escapes",
		schema:  `{"definitions":{"a/b":{"type":"string","enum":["x","y"]},"m~n":{"type":"boolean"}},"type":"object","properties":{"p":{"$ref":"#/definitions/a~1b"},"q":{"$ref":"#/definitions/m~0n"},"r":{"$ref":"#/definitions/a%7E1b"}},"required":["p","q"]}`,
		valid:   []string{`{"p":"x","q":true}`, `{"p":"y","q":false,"r":"x"}`},
		invalid: []string{`{"p":"z","q":true}`},
	},
	{
		name:    "root recursion",
		schema:  `{"type":"object","properties":{"next":{"$ref":"#"},"v":{"type":"boolean"}},"required":["v"]}`,
		valid:   []string{`{"v":true}`, `{"next":{"v":false},"v":true}`},
		invalid: []string{`{"next":{},"v":true}`},
	},
	{
		name:    "tuple",
		schema:  `{"type":"array","prefixItems":[{"type":"string"},{"type":"integer"}],"items":false,"minItems":1}`,
		valid:   []string{`["a"]`, `["a",1]`},
		invalid: []string{`[]`, `["a",1,2]`, `[1]`},
	},
	{
		name:    "tuple with rest",
		schema:  `{"type":"array","prefixItems":[{"type":"boolean"},{"type":"null"}],"items":{"type":"number","minimum":0,"maximum":1},"minItems":3,"maxItems":5}`,
		valid:   []string{`[true,null,0.5]`, `[false,null,0,1,0.25]`},
		invalid: []string{`[true,null]`, `[true,null,2]`, `[true,null,0,0,0,0]`},
	},
	{
		name:    "additional properties true",
		schema:  `{"type":"object","properties":{"id":{"type":"integer"}},"required":["id"],"additionalProperties":true}`,
		valid:   []string{`{"id":1}`, `{"id":1,"x":"y","z":[1,{"a":null}]}`},
		invalid: []string{`{"x":1}`, `{"id":"1"}`},
	},
	{
		name:    "additional properties schema",
		schema:  `{"type":"object","properties":{"name":{"type":"string"},"nick":{"type":"string"}},"additionalProperties":{"type":"integer","minimum":0}}`,
		valid:   []string{`{}`, `{"name":"a"}`, `{"a":1,"b":2}`, `{"name":"a","count":3}`, `{"nick":"n","names":4}`},
		invalid: []string{`{"a":-1}`, `{"a":"x"}`},
	},
	{
		name:    "additional properties only",
		schema:  `{"type":"object","additionalProperties":{"type":"boolean"}}`,
		valid:   []string{`{}`, `{"a":true}`, `{"a":true,"b\n":false}`},
		invalid: []string{`{"a":1}`},
	},
	{
		name:    "allOf merge",
		schema:  `{"allOf":[{"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]},{"$ref":"#/$defs/b"}],"$defs":{"b":{"properties":{"b":{"type":"string"}},"required":["b"]}}}`,
		valid:   []string{`{"a":1,"b":"x"}`},
		invalid: []string{`{"a":1}`, `{"b":"x"}`},
	},
	{
		name:    "allOf single ref",
		schema:  `{"type":"object","properties":{"color":{"allOf":[{"$ref":"#/$defs/Color"}],"description":"the color"}},"required":["color"],"$defs":{"Color":{"type":"string","enum":["RED","BLUE"]}}}`,
		valid:   []string{`{"color":"RED"}`, `{"color":"BLUE"}`},
		invalid: []string{`{"color":"GREEN"}`},
	},
	{
		name:    "oneOf discriminated",
		schema:  `{"oneOf":[{"type":"object","properties":{"kind":{"const":"cat"},"lives":{"type":"integer","minimum":1,"maximum":9}},"required":["kind","lives"]},{"type":"object","properties":{"kind":{"const":"dog"},"good":{"type":"boolean"}},"required":["kind"]}]}`,
		valid:   []string{`{"kind":"cat","lives":9}`, `{"kind":"dog"}`, `{"kind":"dog","good":true}`},
		invalid: []string{`{"kind":"cat","lives":10}`, `{"kind":"cow"}`},
	},
	{
		name:    "string length",
		schema:  `{"type":"string","minLength":2,"maxLength":4}`,
		valid:   []string{`"ab"`, `"abcd"`, `"\n\u00e9"`, `"日本語"`},
		invalid: []string{`"a"`, `"abcde"`},
	},
	{
		name:    "scalars",
		schema:  `{"type":"object","properties":{"b":{"type":"boolean"},"n":{"type":"null"}},"required":["b","n"]}`,
		valid:   []string{`{"b":true,"n":null}`, `{"b": false, "n": null}`},
		invalid: []string{`{"b":1,"n":null}`},
	},
	{
		name:    "any value",
		schema:  `{}`,
		valid:   []string{`1`, `"x"`, `[1,{"a":null}]`, `{"k":[true,false]}`, `null`},
		invalid: nil,
	},
	{
		name:   "true schema",
		schema: `true`,
		valid:  []string{`{}`, `[]`, `0.5`},
	},
	{
		name:    "any object",
		schema:  `{"type":"object"}`,
		valid:   []string{`{}`, `{"a":1}`, `{"a":{"b":[1,2,"c"]}}`},
		invalid: []string{`[]`, `1`},
	},
	{
		name:    "matrix",
		schema:  `{"type":"array","items":{"type":"array","items":{"type":"integer","minimum":0,"maximum":9},"minItems":1,"maxItems":3},"maxItems":3}`,
		valid:   []string{`[]`, `[[1]]`, `[[1,2,3],[4],[5,6]]`},
		invalid: []string{`[[]]`, `[[10]]`, `[[1],[1],[1],[1]]`},
	},
	{
		name:    "annotations and extensions",
		schema:  `{"$schema":"https://json-schema.org/draft/2020-12/schema","$id":"https://example.com/s","title":"T","description":"D","$comment":"c","x-order":1,"type":"array","items":{"type":"string","deprecated":true,"examples":["a"],"default":"a","readOnly":true},"uniqueItems":false}`,
		valid:   []string{`[]`, `["a","a"]`},
		invalid: []string{`[1]`},
	},
	{
		name:    "inferred types",
		schema:  `{"properties":{"a":{"minLength":1},"b":{"maximum":5}},"required":["a"]}`,
		valid:   []string{`{"a":"x"}`, `{"a":"x","b":5}`, `{"a":"x","b":-2.5}`},
		invalid: []string{`{"a":""}`, `{"a":"x","b":6}`},
	},
	{
		name:    "unicode enum and keys",
		schema:  `{"type":"object","properties":{"café":{"enum":["naïve","日本","😀"]},"a\"b":{"type":"integer","minimum":1,"maximum":1}},"required":["café","a\"b"]}`,
		valid:   []string{`{"café":"naïve","a\"b":1}`, `{"café":"😀","a\"b":1}`},
		invalid: []string{`{"café":"x","a\"b":1}`},
	},
	{
		name:    "long string",
		schema:  `{"type":"string","minLength":995,"maxLength":2100}`,
		valid:   []string{`"` + strings.Repeat("a", 995) + `"`, `"` + strings.Repeat("b", 2100) + `"`, `"` + strings.Repeat("c", 1500) + `"`},
		invalid: []string{`"` + strings.Repeat("a", 994) + `"`, `"` + strings.Repeat("a", 2101) + `"`},
	},
}

func compileSchema(t testing.TB, schema string) *jsonschema.Schema {
	t.Helper()
	doc, err := jsonschema.UnmarshalJSON(strings.NewReader(schema))
	if err != nil {
		t.Fatalf("schema: %v", err)
	}
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	c.AssertFormat()
	if err := c.AddResource("mem://schema.json", doc); err != nil {
		t.Fatal(err)
	}
	sch, err := c.Compile("mem://schema.json")
	if err != nil {
		t.Fatalf("compile: %v", err)
	}
	return sch
}

func validate(sch *jsonschema.Schema, text string) error {
	inst, err := jsonschema.UnmarshalJSON(strings.NewReader(text))
	if err != nil {
		return err
	}
	return sch.Validate(inst)
}

func grammarFor(t testing.TB, schema string) *tgrammar {
	t.Helper()
	out, err := FromJSONSchema([]byte(schema))
	if err != nil {
		t.Fatalf("FromJSONSchema: %v", err)
	}
	if err := CheckGBNF(out); err != nil {
		t.Fatalf("CheckGBNF refuses a generated grammar: %v\n%s", err, out)
	}
	g, err := parseGBNF(out)
	if err != nil {
		t.Fatalf("parse: %v\n%s", err, out)
	}
	return g
}

// TestCorpusSound derives random texts from each corpus grammar and checks
// them with an independent validator: everything the grammar admits is
// valid.
func TestCorpusSound(t *testing.T) {
	const perSchema = 60
	for i, tc := range corpus {
		t.Run(tc.name, func(t *testing.T) {
			sch := compileSchema(t, tc.schema)
			g := grammarFor(t, tc.schema)
			rng := rand.New(rand.NewPCG(uint64(i), 1))
			gn := &generator{g: g, pick: rng.IntN, maxDepth: 12}
			for range perSchema {
				text, err := gn.generate()
				if err != nil {
					t.Fatal(err)
				}
				if err := validate(sch, text); err != nil {
					t.Fatalf("generated %q is invalid: %v", text, err)
				}
				if !g.matches(text) {
					t.Fatalf("the matcher rejects generated %q", text)
				}
			}
		})
	}
}

// TestCorpusComplete checks that hand-written valid texts are admitted and
// invalid ones are not.
func TestCorpusComplete(t *testing.T) {
	for _, tc := range corpus {
		t.Run(tc.name, func(t *testing.T) {
			sch := compileSchema(t, tc.schema)
			g := grammarFor(t, tc.schema)
			for _, text := range tc.valid {
				if err := validate(sch, text); err != nil {
					t.Fatalf("test data: %q is invalid: %v", text, err)
				}
				if !g.matches(text) {
					t.Errorf("grammar rejects valid %q", text)
				}
			}
			for _, text := range tc.invalid {
				if validate(sch, text) == nil {
					t.Fatalf("test data: %q is valid", text)
				}
				if g.matches(text) {
					t.Errorf("grammar admits invalid %q", text)
				}
			}
		})
	}
}

func TestCorpusSize(t *testing.T) {
	if len(corpus) < 40 {
		t.Fatalf("corpus has %d schemas, want at least 40", len(corpus))
	}
}

// TestWhitespaceBounded checks that no generated grammar admits a newline
// or two spaces between JSON tokens.
func TestWhitespaceBounded(t *testing.T) {
	for _, tc := range corpus {
		g := grammarFor(t, tc.schema)
		for _, text := range []string{"{  }", "[  ]", "{\n}", " {}", "{} ", " 1", "1 "} {
			if g.matches(text) {
				t.Errorf("%s: grammar admits %q", tc.name, text)
			}
		}
	}
}
