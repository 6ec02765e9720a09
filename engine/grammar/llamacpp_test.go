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
}
