package httpapi

import (
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"

	"github.com/dpnode/dpnode/engine"
	"github.com/dpnode/dpnode/engine/grammar"
	"github.com/dpnode/dpnode/http/toolcall"
)

// Tool calling. The tools a chat request offers are rendered into the
// model's chat template; tool_choice says what the model may do with them:
//
//   - none: nothing is read from the output.
//   - auto (the default with tools): the output is read by the server's
//     parser (--tool-call-parser, with --enable-auto-tool-choice), which
//     finds calls in the syntax of the model's family.
//   - required, or a named function: a grammar forces the output to be
//     calls in that syntax, each call's arguments valid against its
//     function's parameters; without a parser, in vLLM's own formats (the
//     named function's arguments alone, or a JSON list of calls).

// toolParams are a chat request's tool fields.
type toolParams struct {
	Tools             []json.RawMessage `json:"tools"`
	ToolChoice        json.RawMessage   `json:"tool_choice"`
	ParallelToolCalls *bool             `json:"parallel_tool_calls"`
}

// toolDef is an OpenAI tool definition.
type toolDef struct {
	Type     string `json:"type"`
	Function *struct {
		Name       string          `json:"name"`
		Parameters json.RawMessage `json:"parameters"`
	} `json:"function"`
}

// toolSpec is what a chat request's tools ask of it.
type toolSpec struct {
	// defs are the tools for the template, as the client sent them.
	defs []json.RawMessage
	// format reads calls from the output; "" reads none.
	format toolcall.Format
	opts   toolcall.Options
	// gbnf forces calls, for required and a named function; param is the
	// field that asked for it.
	gbnf, param string
}

// Limits on tools: OpenAI's.
const (
	maxTools = 128
	// maxForcedCalls bounds the calls tool_choice required lets a model
	// make at once.
	maxForcedCalls = 16
)

// toolName is what OpenAI allows a function's name to be; the names go
// into grammars and templates as they are.
var toolName = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// noParameters is the schema of a function that takes none.
var noParameters = []byte(`{"type": "object", "properties": {}, "additionalProperties": false}`)

// chatTools checks a request's tool fields and says what they ask.
func (s *Server) chatTools(p *toolParams) (*toolSpec, *apiError) {
	t := &toolSpec{}
	if len(p.Tools) > maxTools {
		return nil, limitError("tools", len(p.Tools), maxTools, "tools")
	}
	defs, names, e := toolDefs(p.Tools)
	if e != nil {
		return nil, e
	}
	if len(defs) > 0 {
		t.defs = p.Tools
	}
	choice, named, e := toolChoice(p.ToolChoice, len(defs) > 0)
	if e != nil {
		return nil, e
	}
	t.opts.Single = p.ParallelToolCalls != nil && !*p.ParallelToolCalls
	switch choice {
	case "none":
		return t, nil
	case "auto":
		if !s.cfg.AutoToolChoice {
			return nil, badRequest(`"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set on the server; or send tool_choice "required", a named function, or "none"`, "tool_choice")
		}
		t.format = toolcall.Format(s.cfg.ToolCallParser)
		return t, nil
	}
	// required or named: a grammar forces the calls.
	use := defs
	if choice == "named" {
		i, ok := names[named]
		if !ok {
			return nil, badRequest(fmt.Sprintf("tool_choice names the function %q, which is not among the tools", named), "tool_choice")
		}
		use = defs[i : i+1]
	}
	for i, d := range use {
		// Each schema is checked alone first, so that the 400 names the
		// tool whose parameters cannot be enforced.
		if _, err := grammar.FromJSONSchema(parameters(d)); err != nil {
			at := i
			if choice == "named" {
				at = names[named]
			}
			param := fmt.Sprintf("tools[%d].function.parameters", at)
			return nil, badRequest(fmt.Sprintf("%s: %v (tool_choice %s enforces the parameters)", param, err, choice), param)
		}
	}
	t.format = toolcall.Format(s.cfg.ToolCallParser)
	switch {
	case t.format != "":
	case choice == "named":
		t.format, t.opts.Named = toolcall.Arguments, named
	default:
		t.format = toolcall.JSONList
	}
	maxCalls := maxForcedCalls
	if t.opts.Single || choice == "named" {
		maxCalls = 1
	}
	gbnf, err := callGrammar(t.format, s.mistralArgs(), use, maxCalls)
	if err != nil {
		return nil, badRequest(fmt.Sprintf("tools: %v", err), "tools")
	}
	t.gbnf, t.param = gbnf, "tool_choice"
	return t, nil
}

// toolDefs reads a request's tools: each a function with a valid name,
// none named twice. names maps a name to its tool's index.
func toolDefs(tools []json.RawMessage) (defs []toolDef, names map[string]int, e *apiError) {
	names = map[string]int{}
	for i, raw := range tools {
		var d toolDef
		param := fmt.Sprintf("tools[%d]", i)
		if err := json.Unmarshal(raw, &d); err != nil || !bytes.HasPrefix(bytes.TrimSpace(raw), []byte("{")) {
			return nil, nil, badRequest(param+" must be a tool definition: {\"type\": \"function\", \"function\": {\"name\": ..., \"parameters\": {...}}}", param)
		}
		switch {
		case d.Type != "function":
			return nil, nil, badRequest(fmt.Sprintf("%s.type must be function, got %q", param, d.Type), param+".type")
		case d.Function == nil:
			return nil, nil, badRequest(param+".function is required", param+".function")
		case !toolName.MatchString(d.Function.Name):
			return nil, nil, badRequest(fmt.Sprintf("%s.function.name must be 1 to 64 letters, digits, underscores or dashes; got %q", param, d.Function.Name), param+".function.name")
		}
		if params := bytes.TrimSpace(d.Function.Parameters); len(params) > 0 && !bytes.Equal(params, []byte("null")) && params[0] != '{' {
			return nil, nil, badRequest(param+".function.parameters must be a JSON schema object", param+".function.parameters")
		}
		if j, dup := names[d.Function.Name]; dup {
			return nil, nil, badRequest(fmt.Sprintf("tools[%d] and tools[%d] are both named %q", j, i, d.Function.Name), param+".function.name")
		}
		names[d.Function.Name] = i
		defs = append(defs, d)
	}
	return defs, names, nil
}

// toolChoice reads tool_choice: none, auto, required, or named with the
// function's name.
func toolChoice(raw json.RawMessage, haveTools bool) (choice, name string, e *apiError) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		if haveTools {
			return "auto", "", nil
		}
		return "none", "", nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		switch s {
		case "none", "auto", "required":
			if !haveTools && s != "none" && s != "auto" {
				return "", "", badRequest(`tool_choice "required" needs tools`, "tool_choice")
			}
			if !haveTools {
				return "none", "", nil
			}
			return s, "", nil
		}
		return "", "", badRequest(fmt.Sprintf(`tool_choice must be "none", "auto", "required" or {"type": "function", "function": {"name": ...}}; got %q`, s), "tool_choice")
	}
	var named struct {
		Type     string `json:"type"`
		Function *struct {
			Name string `json:"name"`
		} `json:"function"`
	}
	if json.Unmarshal(raw, &named) != nil || named.Type != "function" || named.Function == nil || named.Function.Name == "" {
		return "", "", badRequest(`tool_choice must be "none", "auto", "required" or {"type": "function", "function": {"name": ...}}`, "tool_choice")
	}
	if !haveTools {
		return "", "", badRequest("tool_choice names a function, but no tools were given", "tool_choice")
	}
	return "named", named.Function.Name, nil
}

// parameters is a function's parameters schema, or that of no parameters.
func parameters(d toolDef) []byte {
	p := bytes.TrimSpace(d.Function.Parameters)
	if len(p) == 0 || bytes.Equal(p, []byte("null")) {
		return noParameters
	}
	return p
}

// mistralArgs says the model's template writes Mistral's newer calls
// (name[ARGS]{...}), not a JSON list.
func (s *Server) mistralArgs() bool {
	t, ok := s.cfg.ChatTemplate.(*JinjaTemplate)
	return ok && strings.Contains(t.Source(), "[ARGS]")
}

// callGrammar is the grammar of one to maxCalls calls of the functions
// defs, written in format's syntax.
func callGrammar(format toolcall.Format, mistralArgs bool, defs []toolDef, maxCalls int) (string, error) {
	var open, sep, close string
	var call func(name string, args []byte) []grammar.Part
	object := func(key string) func(string, []byte) []grammar.Part {
		return func(name string, args []byte) []grammar.Part {
			return []grammar.Part{{Text: `{"name": "` + name + `", "` + key + `": `}, {Schema: args}, {Text: "}"}}
		}
	}
	switch format {
	case toolcall.Hermes:
		sep = "\n"
		call = func(name string, args []byte) []grammar.Part {
			return []grammar.Part{{Text: "<tool_call>\n{\"name\": \"" + name + "\", \"arguments\": "}, {Schema: args}, {Text: "}\n</tool_call>"}}
		}
	case toolcall.Llama3JSON:
		sep, call = "; ", object("parameters")
	case toolcall.Mistral:
		if mistralArgs {
			call = func(name string, args []byte) []grammar.Part {
				return []grammar.Part{{Text: "[TOOL_CALLS]" + name + "[ARGS]"}, {Schema: args}}
			}
			break
		}
		open, sep, close, call = "[TOOL_CALLS][", ", ", "]", object("arguments")
	case toolcall.JSONList:
		open, sep, close, call = "[", ", ", "]", object("parameters")
	case toolcall.Arguments:
		call = func(_ string, args []byte) []grammar.Part { return []grammar.Part{{Schema: args}} }
		maxCalls = 1
	default:
		return "", fmt.Errorf("no grammar for the tool-call format %q", format)
	}
	alts := make([][]grammar.Part, len(defs))
	for i, d := range defs {
		alts[i] = call(d.Function.Name, parameters(d))
	}
	return grammar.Repeated(open, alts, sep, close, 1, maxCalls)
}

// checkHistoryCalls checks the tool calls of the i-th message.
func checkHistoryCalls(i int, m *chatMessage) *apiError {
	if len(m.ToolCalls) > 0 && m.Role != "assistant" {
		return badRequest(fmt.Sprintf("messages[%d] has tool_calls, which only assistant messages may have", i), fmt.Sprintf("messages[%d].tool_calls", i))
	}
	for j, c := range m.ToolCalls {
		param := fmt.Sprintf("messages[%d].tool_calls[%d]", i, j)
		switch {
		case c.Type != "" && c.Type != "function":
			return badRequest(fmt.Sprintf("%s.type must be function, got %q", param, c.Type), param+".type")
		case c.Function.Name == "":
			return badRequest(param+".function.name is required", param+".function.name")
		}
	}
	return nil
}

// useTools makes g force and read the calls t asks for.
func (s *Server) useTools(g *genSpec, t *toolSpec) *apiError {
	if t.gbnf != "" {
		if g.sampling[0].Grammar != "" {
			return badRequest("tool_choice forces tool calls, which a structured output constraint cannot also shape: send one or the other", t.param)
		}
		if e := s.engineTakes(t.gbnf, t.param); e != nil {
			return e
		}
		for i := range g.sampling {
			g.sampling[i].Grammar = t.gbnf
		}
	}
	if t.format == "" {
		return nil
	}
	g.tools = t
	if t.format != toolcall.Arguments && t.format != toolcall.JSONList {
		// The families mark calls with special tokens ([TOOL_CALLS],
		// <|python_tag|>, Hermes' <tool_call> in some vocabularies), which
		// the parser must see, as vLLM's parsers do.
		if st, ok := s.cfg.Tokenizer.(engine.SpecialTokenizer); ok {
			g.decode = st.DecodeSpecial
		}
	}
	return nil
}
