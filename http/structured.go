package httpapi

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/dpnode/dpnode/engine"
	"github.com/dpnode/dpnode/engine/grammar"
)

// Structured output: a request constrains its output with one of OpenAI's
// response_format (json_object, json_schema), vLLM's structured_outputs
// (json, regex, choice, grammar, json_object) or vLLM's older guided_*
// fields. Each becomes a GBNF grammar here, before admission, and the
// engine checks the grammar in its vocabulary worker; the rank's sampler
// then draws only tokens the grammar allows.

// responseFormat is OpenAI's response_format.
type responseFormat struct {
	Type       string `json:"type"`
	JSONSchema *struct {
		Name   string          `json:"name"`
		Schema json.RawMessage `json:"schema"`
		// Strict is accepted either way: the schema is always enforced,
		// as vLLM enforces it.
		Strict *bool `json:"strict"`
	} `json:"json_schema"`
}

// structuredOutputs is vLLM's structured_outputs.
type structuredOutputs struct {
	JSON       json.RawMessage `json:"json"`
	Regex      *string         `json:"regex"`
	Choice     []string        `json:"choice"`
	Grammar    *string         `json:"grammar"`
	JSONObject *bool           `json:"json_object"`
	// The grammar's whitespace is always a single space at most, and
	// additional properties are taken only where a schema allows them:
	// these ask for what is done anyway.
	DisableFallback             *bool           `json:"disable_fallback"`
	DisableAnyWhitespace        *bool           `json:"disable_any_whitespace"`
	DisableAdditionalProperties *bool           `json:"disable_additional_properties"`
	WhitespacePattern           *string         `json:"whitespace_pattern"`
	StructuralTag               json.RawMessage `json:"structural_tag"`
}

// structuredParams are the fields of a request that constrain its output.
type structuredParams struct {
	ResponseFormat    *responseFormat    `json:"response_format"`
	StructuredOutputs *structuredOutputs `json:"structured_outputs"`
	GuidedJSON        json.RawMessage    `json:"guided_json"`
	GuidedRegex       *string            `json:"guided_regex"`
	GuidedChoice      []string           `json:"guided_choice"`
	GuidedGrammar     *string            `json:"guided_grammar"`
}

// constraint is one way a request constrains its output, and where.
type constraint struct {
	param string
	gbnf  func() (string, error)
}

// constraints lists what p asks for; more than one is the client's error.
// It is a table of the places a request may ask for a constraint (vLLM's
// response_format, structured_outputs and the older guided_ fields),
// which reads best in one place.
func (p *structuredParams) constraints() ([]constraint, *apiError) {
	var cs []constraint
	schema := func(param string, s json.RawMessage) {
		cs = append(cs, constraint{param, func() (string, error) {
			// vLLM takes the schema as an object or as a string of one.
			var text string
			if json.Unmarshal(s, &text) == nil {
				s = json.RawMessage(text)
			}
			return grammar.FromJSONSchema(s)
		}})
	}
	regex := func(param, re string) {
		cs = append(cs, constraint{param, func() (string, error) { return grammar.FromRegex(re) }})
	}
	choice := func(param string, c []string) {
		cs = append(cs, constraint{param, func() (string, error) { return grammar.FromChoice(c) }})
	}
	gbnf := func(param, g string) {
		cs = append(cs, constraint{param, func() (string, error) { return g, grammar.CheckGBNF(g) }})
	}
	jsonObject := func(param string) {
		cs = append(cs, constraint{param, func() (string, error) { return grammar.JSONObject(), nil }})
	}
	if f := p.ResponseFormat; f != nil {
		switch f.Type {
		case "", "text":
		case "json_object":
			jsonObject("response_format")
		case "json_schema":
			if f.JSONSchema == nil || len(f.JSONSchema.Schema) == 0 || string(f.JSONSchema.Schema) == "null" {
				return nil, badRequest("response_format json_schema needs json_schema.schema", "response_format.json_schema.schema")
			}
			schema("response_format.json_schema.schema", f.JSONSchema.Schema)
		default:
			return nil, badRequest(fmt.Sprintf("response_format type %q is not supported: it must be text, json_object or json_schema", f.Type), "response_format.type")
		}
	}
	if o := p.StructuredOutputs; o != nil {
		switch {
		case o.WhitespacePattern != nil:
			return nil, badRequest("structured_outputs.whitespace_pattern is not supported: JSON is written with at most one space between tokens", "structured_outputs.whitespace_pattern")
		case len(o.StructuralTag) > 0 && string(o.StructuralTag) != "null":
			return nil, badRequest("structured_outputs.structural_tag is not supported by this server", "structured_outputs.structural_tag")
		}
		if len(o.JSON) > 0 && string(o.JSON) != "null" {
			schema("structured_outputs.json", o.JSON)
		}
		if o.Regex != nil {
			regex("structured_outputs.regex", *o.Regex)
		}
		if o.Choice != nil {
			choice("structured_outputs.choice", o.Choice)
		}
		if o.Grammar != nil {
			gbnf("structured_outputs.grammar", *o.Grammar)
		}
		if o.JSONObject != nil && *o.JSONObject {
			jsonObject("structured_outputs.json_object")
		}
	}
	if len(p.GuidedJSON) > 0 && string(p.GuidedJSON) != "null" {
		schema("guided_json", p.GuidedJSON)
	}
	if p.GuidedRegex != nil {
		regex("guided_regex", *p.GuidedRegex)
	}
	if p.GuidedChoice != nil {
		choice("guided_choice", p.GuidedChoice)
	}
	if p.GuidedGrammar != nil {
		gbnf("guided_grammar", *p.GuidedGrammar)
	}
	if len(cs) > 1 {
		names := make([]string, len(cs))
		for i, c := range cs {
			names[i] = c.param
		}
		return nil, badRequest("only one structured output constraint may be given; got "+strings.Join(names, ", "), cs[1].param)
	}
	return cs, nil
}

// structuredGrammar is the grammar the request's output must match, or ""
// when it asks for none: converted, then checked by the engine.
func (s *Server) structuredGrammar(p *structuredParams) (string, *apiError) {
	cs, e := p.constraints()
	if e != nil || len(cs) == 0 {
		return "", e
	}
	c := cs[0]
	gbnf, err := c.gbnf()
	if err != nil {
		return "", badRequest(fmt.Sprintf("%s: %v", c.param, err), c.param)
	}
	return gbnf, s.engineTakes(gbnf, c.param)
}

// engineTakes has the engine check gbnf, which the field param asked for.
// A tokenizer that cannot (the openai engine's servers') leaves the check
// to the engine: a server's refusal reaches the client as a 400.
func (s *Server) engineTakes(gbnf, param string) *apiError {
	checker, ok := s.cfg.Tokenizer.(engine.GrammarChecker)
	if !ok {
		return nil
	}
	if s.checkedGrammars.has(gbnf) {
		return nil
	}
	if err := checker.CheckGrammar(gbnf); err != nil {
		if errors.Is(err, engine.ErrBadGrammar) {
			return badRequest(fmt.Sprintf("%s: %v", param, err), param)
		}
		return tokenizerError(err)
	}
	s.checkedGrammars.add(gbnf)
	return nil
}

// grammarSet remembers grammars the engine has parsed, so that clients
// that send the same schema again and again are checked once. It forgets
// all once full: a client sending ever new grammars costs a check each.
type grammarSet struct {
	mu  sync.Mutex
	set map[string]struct{}
}

// checkedGrammars bounds the grammars remembered.
const checkedGrammars = 256

func (g *grammarSet) has(gbnf string) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	_, ok := g.set[gbnf]
	return ok
}

func (g *grammarSet) add(gbnf string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.set == nil || len(g.set) >= checkedGrammars {
		g.set = map[string]struct{}{}
	}
	g.set[gbnf] = struct{}{}
}
