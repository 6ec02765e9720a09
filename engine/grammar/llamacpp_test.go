//go:build llamacpp

package grammar

import (
	"testing"

	"github.com/dpnode/dpnode/engine/llamacpp/llamacpptest"
)

// TestLlamaCppParsesEveryCorpusGrammar holds the grammars this package
// writes to llama.cpp's own parser, as the vocabulary worker checks a
// request's: every grammar of the schema corpus, the JSON object grammar,
// and regexes and choices.
func TestLlamaCppParsesEveryCorpusGrammar(t *testing.T) {
	tok := llamacpptest.Tokenizer(t, llamacpptest.Model(t))
	check := func(what, g string, err error) {
		t.Helper()
		if err != nil {
			t.Errorf("%s: %v", what, err)
			return
		}
		if err := tok.CheckGrammar(g); err != nil {
			t.Errorf("%s: llama.cpp refuses %q: %v", what, g, err)
		}
	}
	for _, c := range corpus {
		g, err := FromJSONSchema([]byte(c.schema))
		check(c.name, g, err)
	}
	check("json object", JSONObject(), nil)
	for _, re := range regexCases {
		g, err := FromRegex(re)
		check(re, g, err)
	}
	g, err := FromChoice([]string{"a", "b\"c", "日本", `\`})
	check("choice", g, err)
	args := []byte(`{"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}`)
	g, err = Repeated("", [][]Part{{{Text: "<tool_call>\n{\"name\": \"f\", \"arguments\": "}, {Schema: args}, {Text: "}\n</tool_call>"}},
		{{Text: "<tool_call>\n{\"name\": \"g\", \"arguments\": "}, {Schema: []byte(`{}`)}, {Text: "}\n</tool_call>"}}}, "\n", "", 1, 8)
	check("hermes tool calls", g, err)
	g, err = Repeated("[TOOL_CALLS][", [][]Part{{{Text: `{"name": "f", "arguments": `}, {Schema: args}, {Text: "}"}}}, ", ", "]", 1, 1)
	check("mistral tool calls", g, err)
	g, err = Repeated("", [][]Part{{{Schema: args}}}, "", "", 1, 1)
	check("arguments only", g, err)
}
