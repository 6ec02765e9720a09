package grammar

import (
	"errors"
	"math/rand/v2"
	"regexp"
	"strings"
	"testing"
)

// TestRepeatedWritesToolCalls builds the grammar of Hermes-style tool
// calls over two functions and derives random texts from it: each is one
// to three calls, each call names one of the functions, and its arguments
// are valid against that function's parameters.
func TestRepeatedWritesToolCalls(t *testing.T) {
	params := map[string]string{
		"get_weather": `{"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}, "unit": {"enum": ["celsius", "fahrenheit"]}}, "required": ["city"], "additionalProperties": false}`,
		"get_time":    `{"type": "object", "properties": {}, "additionalProperties": false}`,
	}
	names := []string{"get_weather", "get_time"}
	var alts [][]Part
	for _, name := range names {
		alts = append(alts, []Part{
			{Text: "<tool_call>\n{\"name\": \"" + name + "\", \"arguments\": "},
			{Schema: []byte(params[name])},
			{Text: "}\n</tool_call>"},
		})
	}
	gbnf, err := Repeated("", alts, "\n", "", 1, 3)
	if err != nil {
		t.Fatal(err)
	}
	g, err := parseGBNF(gbnf)
	if err != nil {
		t.Fatalf("%v\n%s", err, gbnf)
	}
	schemas := map[string]func(string) error{}
	for name, p := range params {
		sch := compileSchema(t, p)
		schemas[name] = func(text string) error { return validate(sch, text) }
	}
	call := regexp.MustCompile(`(?s)^<tool_call>\n\{"name": "([a-z_]+)", "arguments": (.*)\}\n</tool_call>$`)
	rng := rand.New(rand.NewPCG(1, 2))
	counts := map[int]int{}
	for range 300 {
		gn := &generator{g: g, pick: rng.IntN, maxDepth: 10}
		text, err := gn.generate()
		if err != nil {
			t.Fatal(err)
		}
		calls := strings.Split(text, "\n<tool_call>")
		counts[len(calls)]++
		for i, c := range calls {
			if i > 0 {
				c = "<tool_call>" + c
			}
			m := call.FindStringSubmatch(c)
			if m == nil {
				t.Fatalf("%q is not a call", c)
			}
			check, ok := schemas[m[1]]
			if !ok {
				t.Fatalf("%q calls an unknown function", c)
			}
			if err := check(m[2]); err != nil {
				t.Fatalf("the arguments of %q: %v", c, err)
			}
		}
		if !g.matches(text) {
			t.Fatalf("the grammar does not match its own text %q", text)
		}
	}
	if counts[1] == 0 || counts[3] == 0 || counts[4] != 0 {
		t.Fatalf("calls per text: %v; want 1 to 3", counts)
	}
	for _, bad := range []string{
		"",
		`<tool_call>` + "\n" + `{"name": "get_weather", "arguments": {}}` + "\n</tool_call>",
		`<tool_call>` + "\n" + `{"name": "other", "arguments": {}}` + "\n</tool_call>",
	} {
		if g.matches(bad) {
			t.Errorf("the grammar matches %q", bad)
		}
	}
}

// TestRepeatedOpensAndCloses: the Mistral and JSON-list shapes, one
// item exactly.
func TestRepeatedOpensAndCloses(t *testing.T) {
	gbnf, err := Repeated("[TOOL_CALLS][", [][]Part{{{Text: `{"name": "f", "arguments": `}, {Schema: []byte(`{"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}}, "required": ["n"], "additionalProperties": false}`)}, {Text: "}"}}}, ", ", "]", 1, 1)
	if err != nil {
		t.Fatal(err)
	}
	g, err := parseGBNF(gbnf)
	if err != nil {
		t.Fatal(err)
	}
	for text, want := range map[string]bool{
		`[TOOL_CALLS][{"name": "f", "arguments": {"n": 3}}]`:                                       true,
		`[TOOL_CALLS][{"name": "f", "arguments": {"n":3}}]`:                                        true,
		`[TOOL_CALLS][{"name": "f", "arguments": {"n": 3}}, {"name": "f", "arguments": {"n": 4}}]`: false,
		`[TOOL_CALLS][{"name": "f", "arguments": {"n": 10}}]`:                                      false,
		`{"name": "f", "arguments": {"n": 3}}`:                                                     false,
	} {
		if g.matches(text) != want {
			t.Errorf("matches(%q) = %v, want %v", text, !want, want)
		}
	}
}

func TestRepeatedRefuses(t *testing.T) {
	one := [][]Part{{{Schema: []byte(`{"type": "object"}`)}}}
	for name, try := range map[string]func() (string, error){
		"no alternatives": func() (string, error) { return Repeated("", nil, "", "", 1, 1) },
		"zero items":      func() (string, error) { return Repeated("", one, "", "", 0, 1) },
		"max below min":   func() (string, error) { return Repeated("", one, "", "", 2, 1) },
		"too many items":  func() (string, error) { return Repeated("", one, "", "", 1, MaxItems+1) },
		"a bad schema": func() (string, error) {
			return Repeated("", [][]Part{{{Text: "x"}}, {{Schema: []byte(`{"type": "number", "multipleOf": 3}`)}}}, "", "", 1, 1)
		},
		"schema not JSON": func() (string, error) { return Repeated("", [][]Part{{{Schema: []byte(`{`)}}}, "", "", 1, 1) },
	} {
		_, err := try()
		var e *Error
		if !errors.As(err, &e) {
			t.Errorf("%s: %v, want an *Error", name, err)
		}
	}
	_, err := Repeated("", [][]Part{{{Text: "x"}}, {{Schema: []byte(`{"type": "number", "multipleOf": 3}`)}}}, "", "", 1, 1)
	if !strings.Contains(err.Error(), "alternative 1, part 0") || !strings.Contains(err.Error(), "multipleOf") {
		t.Errorf("the error %q does not say where", err)
	}
}
