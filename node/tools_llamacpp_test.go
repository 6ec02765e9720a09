//go:build llamacpp

package node_test

import (
	"context"
	"encoding/json"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/shared"
	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/dpnode/dpnode/engine/llamacpp/llamacpptest"
	"github.com/dpnode/dpnode/node"
)

// The tools of the tool tests: bounded strings and numbers, an enum, a
// nested object and a function without parameters, so that a
// random-weight model under the grammar finishes its calls.
var testTools = map[string]string{
	"get_weather": `{"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city", "unit"], "additionalProperties": false}`,
	"book_table":  `{"type": "object", "properties": {"guests": {"type": "integer", "minimum": 1, "maximum": 12}, "when": {"type": "object", "properties": {"day": {"type": "string", "format": "date"}, "hour": {"type": "integer", "minimum": 11, "maximum": 23}}, "required": ["day", "hour"]}}, "required": ["guests", "when"]}`,
	"get_time":    ``,
}

func sdkTools(t *testing.T) []openai.ChatCompletionToolUnionParam {
	t.Helper()
	var out []openai.ChatCompletionToolUnionParam
	for _, name := range slices.Sorted(mapKeys(testTools)) {
		def := shared.FunctionDefinitionParam{Name: name, Description: openai.String("The " + strings.ReplaceAll(name, "_", " ") + " tool")}
		if s := testTools[name]; s != "" {
			if err := json.Unmarshal([]byte(s), &def.Parameters); err != nil {
				t.Fatal(err)
			}
		}
		out = append(out, openai.ChatCompletionFunctionTool(def))
	}
	return out
}

func mapKeys(m map[string]string) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// checkCall holds a call to the tools' schemas: a function among them, an
// id, and arguments valid against its parameters.
func checkCall(t *testing.T, family string, c openai.ChatCompletionMessageToolCallUnion) {
	t.Helper()
	schema, ok := testTools[c.Function.Name]
	if !ok {
		t.Fatalf("%s: a call to %q, which is not a tool", family, c.Function.Name)
	}
	if schema == "" {
		schema = `{"type": "object", "properties": {}, "additionalProperties": false}`
	}
	if c.ID == "" || c.Type != "function" {
		t.Fatalf("%s: call %+v has no id or type", family, c)
	}
	if family == "mistral" && !regexp.MustCompile(`^[A-Za-z0-9]{9}$`).MatchString(c.ID) {
		t.Fatalf("mistral: call id %q is not 9 letters and digits", c.ID)
	}
	doc, err := jsonschema.UnmarshalJSON(strings.NewReader(schema))
	if err != nil {
		t.Fatal(err)
	}
	comp := jsonschema.NewCompiler()
	comp.AssertFormat()
	if err := comp.AddResource("tool.json", doc); err != nil {
		t.Fatal(err)
	}
	sch, err := comp.Compile("tool.json")
	if err != nil {
		t.Fatal(err)
	}
	args, err := jsonschema.UnmarshalJSON(strings.NewReader(c.Function.Arguments))
	if err != nil {
		t.Fatalf("%s: the arguments of %s are not JSON: %v: %q", family, c.Function.Name, err, c.Function.Arguments)
	}
	if err := sch.Validate(args); err != nil {
		t.Fatalf("%s: the arguments of %s %s: %v", family, c.Function.Name, c.Function.Arguments, err)
	}
}

// toolFamilies are the model families of the tests: a tokenizer, a chat
// template and the parser that reads its calls; "" is a node without a
// parser, which forces calls in vLLM's own formats.
var toolFamilies = []struct {
	name, vocab, template string
}{
	{"llama3_json", "llama-bpe", "meta-llama-Llama-3.1-8B-Instruct"},
	{"hermes", "qwen2", "Qwen-Qwen2.5-7B-Instruct"},
	{"mistral", "llama-spm", "mistralai-Mistral-Nemo-Instruct-2407"},
	{"", "llama-bpe", "meta-llama-Llama-3.1-8B-Instruct"},
}

// TestLlamaCppToolCallsWithTheSDK: for each family, the OpenAI SDK's
// chat.completions with tools, a named function and tool_choice required
// (one call, and parallel calls) returns calls to the tools whose
// arguments validate against their parameters, streamed the same as
// whole; and the calls, sent back with their results, render into the
// next prompt.
func TestLlamaCppToolCallsWithTheSDK(t *testing.T) {
	for _, f := range toolFamilies {
		name := f.name
		if name == "" {
			name = "no parser"
		}
		t.Run(name, func(t *testing.T) {
			model := llamacpptest.FamilyModel(t, f.vocab, f.template)
			n := startLlamaNode(t, func(o *node.Options) {
				o.Model, o.GPUs = model, 1
				o.ToolCallParser, o.EnableAutoToolChoice = f.name, f.name != ""
			})
			client := openai.NewClient(option.WithBaseURL(n.base+"/v1"), option.WithAPIKey("none"), option.WithHTTPClient(n.http), option.WithMaxRetries(0))
			ctx := context.Background()
			user := []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Book a table for four tomorrow at eight, and tell me the weather in Paris.")}
			params := func(choice openai.ChatCompletionToolChoiceOptionUnionParam, parallel bool, seed int64) openai.ChatCompletionNewParams {
				return openai.ChatCompletionNewParams{Model: model, Messages: user, Tools: sdkTools(t), ToolChoice: choice,
					ParallelToolCalls: openai.Bool(parallel), MaxTokens: openai.Int(400), Seed: openai.Int(seed)}
			}
			named := openai.ChatCompletionToolChoiceOptionUnionParam{OfFunctionToolChoice: &openai.ChatCompletionNamedToolChoiceParam{
				Function: openai.ChatCompletionNamedToolChoiceFunctionParam{Name: "book_table"}}}
			required := openai.ChatCompletionToolChoiceOptionUnionParam{OfAuto: openai.String("required")}

			ask := func(what string, p openai.ChatCompletionNewParams) openai.ChatCompletionChoice {
				t.Helper()
				resp, err := client.Chat.Completions.New(ctx, p)
				if err != nil {
					t.Fatalf("%s: %v", what, err)
				}
				return resp.Choices[0]
			}
			for seed := range int64(3) {
				c := ask("named", params(named, false, seed))
				if c.FinishReason != "tool_calls" || len(c.Message.ToolCalls) != 1 || c.Message.ToolCalls[0].Function.Name != "book_table" {
					t.Fatalf("named, seed %d: finish %q, calls %+v, content %q", seed, c.FinishReason, c.Message.ToolCalls, c.Message.Content)
				}
				checkCall(t, f.name, c.Message.ToolCalls[0])
				if c = ask("required, one call", params(required, false, seed)); c.FinishReason != "tool_calls" || len(c.Message.ToolCalls) != 1 {
					t.Fatalf("required, one call, seed %d: finish %q, calls %+v, content %q", seed, c.FinishReason, c.Message.ToolCalls, c.Message.Content)
				}
				checkCall(t, f.name, c.Message.ToolCalls[0])
				if c = ask("required, parallel", params(required, true, seed)); len(c.Message.ToolCalls) == 0 {
					t.Fatalf("required, parallel, seed %d: no calls: finish %q, content %q", seed, c.FinishReason, c.Message.Content)
				}
				if c.FinishReason == "tool_calls" {
					for _, call := range c.Message.ToolCalls {
						checkCall(t, f.name, call)
					}
				}
			}

			// Greedy, the stream's calls add up to the whole answer's.
			p := params(named, false, 0)
			p.Temperature = openai.Float(0)
			whole, err := client.Chat.Completions.New(ctx, p)
			if err != nil {
				t.Fatal(err)
			}
			stream := client.Chat.Completions.NewStreaming(ctx, p)
			var acc openai.ChatCompletionAccumulator
			chunks := 0
			for stream.Next() {
				acc.AddChunk(stream.Current())
				chunks++
			}
			if err := stream.Err(); err != nil {
				t.Fatal(err)
			}
			got, want := acc.Choices[0], whole.Choices[0]
			if got.FinishReason != want.FinishReason || len(got.Message.ToolCalls) != 1 ||
				got.Message.ToolCalls[0].Function.Name != want.Message.ToolCalls[0].Function.Name ||
				got.Message.ToolCalls[0].Function.Arguments != want.Message.ToolCalls[0].Function.Arguments {
				t.Fatalf("streamed (%d chunks) %+v\nwhole %+v", chunks, got, want)
			}
			checkCall(t, f.name, got.Message.ToolCalls[0])
			t.Logf("greedy: %s(%s), id %s, in %d chunks", got.Message.ToolCalls[0].Function.Name, got.Message.ToolCalls[0].Function.Arguments, got.Message.ToolCalls[0].ID, chunks)
			if chunks < 3 {
				t.Fatalf("the call came in %d chunks", chunks)
			}

			// The call and its result, sent back, are in the next prompt.
			call := whole.Choices[0].Message
			history := append(slices.Clone(user), call.ToParam(), openai.ToolMessage(`{"booked": true}`, call.ToolCalls[0].ID))
			next, err := client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: model, Messages: history, Tools: sdkTools(t),
				ToolChoice: openai.ChatCompletionToolChoiceOptionUnionParam{OfAuto: openai.String("none")}, MaxTokens: openai.Int(4)})
			if err != nil {
				t.Fatal(err)
			}
			if next.Usage.PromptTokens <= whole.Usage.PromptTokens+int64(len(call.ToolCalls[0].Function.Arguments)/8) {
				t.Fatalf("the prompt with the call and its result has %d tokens, without %d", next.Usage.PromptTokens, whole.Usage.PromptTokens)
			}
			if len(next.Choices[0].Message.ToolCalls) != 0 {
				t.Fatalf("tool_choice none returned calls: %+v", next.Choices[0].Message.ToolCalls)
			}
		})
	}
}

// TestLlamaCppToolsReachThePrompt: tools are rendered into the prompt
// (more prompt tokens with them), auto needs the server's flags, and bad
// tool fields are 400s that name the field.
func TestLlamaCppToolsReachThePrompt(t *testing.T) {
	n := startLlamaNode(t, func(o *node.Options) { o.GPUs = 1 })
	tools := []map[string]any{{"type": "function", "function": map[string]any{"name": "get_weather",
		"parameters": json.RawMessage(testTools["get_weather"])}}}
	msgs := []map[string]any{{"role": "user", "content": "Weather in Paris?"}}
	var without, with struct {
		Usage struct {
			PromptTokens int `json:"prompt_tokens"`
		} `json:"usage"`
	}
	n.postJSON(t, "/v1/chat/completions", map[string]any{"messages": msgs, "max_tokens": 1}, &without)
	n.postJSON(t, "/v1/chat/completions", map[string]any{"messages": msgs, "max_tokens": 1, "tools": tools, "tool_choice": "none"}, &with)
	if with.Usage.PromptTokens < without.Usage.PromptTokens+20 {
		t.Fatalf("prompt tokens: %d with the tool, %d without", with.Usage.PromptTokens, without.Usage.PromptTokens)
	}
	var tk struct {
		Count int `json:"count"`
	}
	n.postJSON(t, "/tokenize", map[string]any{"messages": msgs, "tools": tools}, &tk)
	if tk.Count != with.Usage.PromptTokens {
		t.Fatalf("/tokenize counts %d tokens with the tools, the completion %d", tk.Count, with.Usage.PromptTokens)
	}
	for name, c := range map[string]struct {
		body  map[string]any
		param string
	}{
		"auto without the flags":   {map[string]any{"tools": tools}, "tool_choice"},
		"a named unknown function": {map[string]any{"tools": tools, "tool_choice": map[string]any{"type": "function", "function": map[string]any{"name": "nope"}}}, "tool_choice"},
		"required without tools":   {map[string]any{"tool_choice": "required"}, "tool_choice"},
		"a bad name":               {map[string]any{"tools": []map[string]any{{"type": "function", "function": map[string]any{"name": "no spaces"}}}, "tool_choice": "none"}, "tools[0].function.name"},
		"not a function":           {map[string]any{"tools": []map[string]any{{"type": "retrieval"}}, "tool_choice": "none"}, "tools[0].type"},
		"parameters it cannot enforce": {map[string]any{"tools": []map[string]any{{"type": "function", "function": map[string]any{"name": "f",
			"parameters": map[string]any{"type": "object", "properties": map[string]any{"n": map[string]any{"type": "number", "multipleOf": 3}}}}}}, "tool_choice": "required"}, "tools[0].function.parameters"},
		"tools and a schema": {map[string]any{"tools": tools, "tool_choice": "required", "response_format": map[string]any{"type": "json_object"}}, "tool_choice"},
		"functions":          {map[string]any{"functions": []map[string]any{{"name": "f"}}}, "functions"},
	} {
		body := map[string]any{"messages": msgs, "max_tokens": 4}
		for k, v := range c.body {
			body[k] = v
		}
		var e struct {
			Error struct {
				Param   string `json:"param"`
				Message string `json:"message"`
			} `json:"error"`
		}
		code, raw := n.post(t, "/v1/chat/completions", body)
		if code != http.StatusBadRequest || json.Unmarshal(raw, &e) != nil || e.Error.Param != c.param {
			t.Errorf("%s: %d %s; want 400 naming %s", name, code, raw, c.param)
		}
	}
}
