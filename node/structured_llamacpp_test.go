//go:build llamacpp

package node_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/shared"
	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/dpnode/dpnode/engine/llamacpp/llamacpptest"
)

// structuredSchemas is the corpus: nested objects, arrays, enums,
// optional and required properties, numbers with ranges, strings with
// patterns and formats. Every string and array is bounded (maxLength,
// maxItems, a pattern or a format), since a random-weight model seldom
// closes an unbounded one.
var structuredSchemas = []string{
	`{"type":"object","properties":{"name":{"type":"string","maxLength":12},"age":{"type":"integer","minimum":0,"maximum":130}},"required":["name","age"]}`,
	`{"type":"object","properties":{"ok":{"type":"boolean"},"note":{"type":"null"}},"required":["ok"]}`,
	`{"type":"object","properties":{"color":{"enum":["red","green","blue"]},"size":{"enum":[1,2,3,null]}},"required":["color","size"]}`,
	`{"type":"object","properties":{"point":{"type":"object","properties":{"x":{"type":"number","minimum":-10,"maximum":10},"y":{"type":"number","minimum":-10,"maximum":10}},"required":["x","y"]}},"required":["point"]}`,
	`{"type":"array","items":{"type":"integer","minimum":-5,"exclusiveMaximum":5},"minItems":1,"maxItems":4}`,
	`{"type":"object","properties":{"tags":{"type":"array","items":{"type":"string","maxLength":6},"maxItems":3}},"required":["tags"]}`,
	`{"type":"object","properties":{"code":{"type":"string","pattern":"^[A-Z]{3}-[0-9]{2,4}$"}},"required":["code"]}`,
	`{"type":"object","properties":{"day":{"type":"string","format":"date"},"at":{"type":"string","format":"time"}},"required":["day","at"]}`,
	`{"type":"object","properties":{"id":{"type":"string","format":"uuid"},"when":{"type":"string","format":"date-time"}},"required":["id","when"]}`,
	`{"type":"object","properties":{"a":{"type":"integer","maximum":9},"b":{"type":"string","maxLength":4},"c":{"type":"boolean"}},"required":["c"]}`,
	`{"anyOf":[{"type":"integer","minimum":0,"maximum":99},{"type":"string","maxLength":5}]}`,
	`{"type":["boolean","null"]}`,
	`{"type":"object","properties":{"kind":{"const":"circle"},"radius":{"type":"number","exclusiveMinimum":0,"maximum":100}},"required":["kind","radius"]}`,
	`{"type":"object","properties":{"pair":{"type":"array","prefixItems":[{"type":"string","maxLength":3},{"type":"integer","minimum":1,"maximum":12}],"minItems":2,"maxItems":2}},"required":["pair"]}`,
	`{"$defs":{"leaf":{"type":"object","properties":{"v":{"type":"integer","minimum":0,"maximum":9}},"required":["v"]}},"type":"object","properties":{"left":{"$ref":"#/$defs/leaf"},"right":{"$ref":"#/$defs/leaf"}},"required":["left","right"]}`,
	`{"type":"object","properties":{"user":{"type":"object","properties":{"name":{"type":"string","minLength":1,"maxLength":8},"roles":{"type":"array","items":{"enum":["admin","dev","ops"]},"minItems":1,"maxItems":3}},"required":["name","roles"]},"active":{"type":"boolean"}},"required":["user","active"]}`,
	`{"type":"integer","minimum":1000,"maximum":1999}`,
	`{"type":"string","pattern":"^(yes|no|maybe)$"}`,
	`{"type":"object","properties":{"score":{"type":"number","minimum":0,"maximum":1},"label":{"type":"string","maxLength":10}},"required":["score","label"]}`,
	`{"type":"array","items":{"type":"object","properties":{"k":{"type":"string","maxLength":3},"n":{"type":"integer","minimum":-100,"maximum":100}},"required":["k","n"]},"maxItems":2}`,
}

// compileSchema compiles s with format assertions on, as the tests check
// what the grammar promises.
func compileSchema(t *testing.T, i int, s string) *jsonschema.Schema {
	t.Helper()
	doc, err := jsonschema.UnmarshalJSON(strings.NewReader(s))
	if err != nil {
		t.Fatal(err)
	}
	c := jsonschema.NewCompiler()
	c.AssertFormat()
	url := fmt.Sprintf("mem://schema-%d.json", i)
	if err := c.AddResource(url, doc); err != nil {
		t.Fatal(err)
	}
	sch, err := c.Compile(url)
	if err != nil {
		t.Fatal(err)
	}
	return sch
}

// validates reports why text is not JSON valid against sch, or nil.
func validates(sch *jsonschema.Schema, text string) error {
	v, err := jsonschema.UnmarshalJSON(strings.NewReader(text))
	if err != nil {
		return err
	}
	return sch.Validate(v)
}

type structuredChat struct {
	Choices []struct {
		Message struct {
			Content string `json:"content"`
		} `json:"message"`
		FinishReason string `json:"finish_reason"`
	} `json:"choices"`
}

// TestLlamaCppStructuredOutput sends 200 chat requests over the schema
// corpus, 8 at a time on two ranks, greedy and sampled, with OpenAI's
// response_format and vLLM's structured_outputs: every answer of the
// random-weight model is JSON valid against its schema, ended by the
// model's end token once the grammar is done (finish_reason stop).
func TestLlamaCppStructuredOutput(t *testing.T) {
	n := startLlamaNode(t)
	schemas := make([]*jsonschema.Schema, len(structuredSchemas))
	for i, s := range structuredSchemas {
		schemas[i] = compileSchema(t, i, s)
	}
	const requests = 200
	var wg sync.WaitGroup
	work := make(chan int)
	for range 8 {
		wg.Go(func() {
			for i := range work {
				k := i % len(structuredSchemas)
				schema := json.RawMessage(structuredSchemas[k])
				body := map[string]any{
					"messages":   []map[string]string{{"role": "user", "content": fmt.Sprintf("Answer %d in JSON.", i)}},
					"max_tokens": 400, "seed": i,
				}
				if i%3 == 0 {
					body["temperature"] = 0
				}
				if i%2 == 0 {
					body["response_format"] = map[string]any{"type": "json_schema", "json_schema": map[string]any{"name": "answer", "schema": schema, "strict": true}}
				} else {
					body["structured_outputs"] = map[string]any{"json": schema}
				}
				var out structuredChat
				if err := n.tryPostJSON("/v1/chat/completions", body, &out); err != nil {
					t.Errorf("request %d: %v", i, err)
					continue
				}
				c := out.Choices[0]
				if err := validates(schemas[k], c.Message.Content); err != nil || c.FinishReason != "stop" {
					t.Errorf("request %d, schema %d: finish %q, %q: %v", i, k, c.FinishReason, c.Message.Content, err)
				}
			}
		})
	}
	for i := range requests {
		work <- i
	}
	close(work)
	wg.Wait()
}

// TestLlamaCppStructuredOutputOtherForms: a regex, a choice and a grammar
// (vLLM's structured_outputs and guided_* fields) on completions, and
// json_object; each answer matches what it asked for.
func TestLlamaCppStructuredOutputOtherForms(t *testing.T) {
	n := startLlamaNode(t)
	cases := []struct {
		field map[string]any
		match func(string) bool
	}{
		{map[string]any{"structured_outputs": map[string]any{"regex": `[a-c]{2,5}-\d{3}`}}, regexp.MustCompile(`^[a-c]{2,5}-\d{3}$`).MatchString},
		{map[string]any{"guided_regex": `(cat|dog)s?`}, regexp.MustCompile(`^(cat|dog)s?$`).MatchString},
		{map[string]any{"structured_outputs": map[string]any{"choice": []string{"alpha", "beta", "gamma δ"}}}, func(s string) bool { return slices.Contains([]string{"alpha", "beta", "gamma δ"}, s) }},
		{map[string]any{"guided_choice": []string{"yes", "no"}}, func(s string) bool { return s == "yes" || s == "no" }},
		{map[string]any{"guided_grammar": `root ::= "x" [0-9] [0-9]?`}, regexp.MustCompile(`^x[0-9][0-9]?$`).MatchString},
		{map[string]any{"response_format": map[string]any{"type": "json_object"}, "max_tokens": 2000}, func(s string) bool {
			var v map[string]any
			return json.Unmarshal([]byte(s), &v) == nil
		}},
	}
	for i, c := range cases {
		for _, temp := range []float64{0, 1} {
			body := map[string]any{"prompt": []uint32{128000, 9906, 1917}, "max_tokens": 64, "temperature": temp, "seed": i}
			for k, v := range c.field {
				body[k] = v
			}
			var out completion
			n.postJSON(t, "/v1/completions", body, &out)
			if ch := out.Choices[0]; !c.match(ch.Text) || ch.FinishReason != "stop" {
				t.Errorf("%v at temperature %v: %q, finish %q", c.field, temp, ch.Text, ch.FinishReason)
			}
		}
	}
}

// TestLlamaCppStructuredOutputRefusals: every way a constraint can be
// wrong is a 400 that names the field, and the node serves on.
func TestLlamaCppStructuredOutputRefusals(t *testing.T) {
	n := startLlamaNode(t)
	for _, c := range []struct {
		field map[string]any
		param string
		says  string
	}{
		{map[string]any{"response_format": map[string]any{"type": "bogus"}}, "response_format.type", "bogus"},
		{map[string]any{"response_format": map[string]any{"type": "json_schema"}}, "response_format.json_schema.schema", "schema"},
		{map[string]any{"response_format": map[string]any{"type": "json_schema", "json_schema": map[string]any{"name": "x", "schema": map[string]any{"type": "integer", "multipleOf": 3}}}},
			"response_format.json_schema.schema", "multipleOf"},
		{map[string]any{"structured_outputs": map[string]any{"json": map[string]any{"type": "array", "uniqueItems": true}}}, "structured_outputs.json", "uniqueItems"},
		{map[string]any{"guided_regex": `a(?=b)`}, "guided_regex", ""},
		{map[string]any{"guided_grammar": `root ::= "unterminated`}, "guided_grammar", ""},
		{map[string]any{"guided_grammar": `root ::= root "a"`}, "guided_grammar", ""},
		{map[string]any{"guided_choice": []string{}}, "guided_choice", ""},
		{map[string]any{"guided_regex": "a", "guided_choice": []string{"a"}}, "guided_choice", "only one"},
		{map[string]any{"structured_outputs": map[string]any{"regex": "a", "whitespace_pattern": " "}}, "structured_outputs.whitespace_pattern", ""},
	} {
		body := map[string]any{"prompt": "Hello", "max_tokens": 8}
		for k, v := range c.field {
			body[k] = v
		}
		code, raw := n.post(t, "/v1/completions", body)
		var e struct {
			Error struct {
				Message string `json:"message"`
				Param   string `json:"param"`
			} `json:"error"`
		}
		if code != http.StatusBadRequest || json.Unmarshal(raw, &e) != nil || e.Error.Param != c.param || !strings.Contains(e.Error.Message, c.says) {
			t.Errorf("%v: %d %s; want a 400 naming %s (%q)", c.field, code, raw, c.param, c.says)
		}
	}
	if ids, _ := n.greedy(t, []uint32{128000, 9906}, 4); len(ids) != 4 {
		t.Fatalf("after the refusals: %v", ids)
	}
}

// TestLlamaCppStructuredOutputWithTheSDK uses the OpenAI Go SDK's
// json_schema response format, as a client of OpenAI's structured outputs
// does.
func TestLlamaCppStructuredOutputWithTheSDK(t *testing.T) {
	n := startLlamaNode(t)
	client := openai.NewClient(option.WithBaseURL(n.base+"/v1"), option.WithAPIKey("none"), option.WithHTTPClient(n.http), option.WithMaxRetries(0))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const schema = `{"type":"object","properties":{"city":{"type":"string","maxLength":16},"population":{"type":"integer","minimum":0,"maximum":40000000}},"required":["city","population"],"additionalProperties":false}`
	var s map[string]any
	if err := json.Unmarshal([]byte(schema), &s); err != nil {
		t.Fatal(err)
	}
	chat, err := client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
		Model:    openai.ChatModel(llamacpptest.Model(t)),
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Name a large city and its population.")},
		ResponseFormat: openai.ChatCompletionNewParamsResponseFormatUnion{OfJSONSchema: &shared.ResponseFormatJSONSchemaParam{
			JSONSchema: shared.ResponseFormatJSONSchemaJSONSchemaParam{Name: "city", Schema: s, Strict: openai.Bool(true)}}},
		Seed: openai.Int(3),
	})
	if err != nil {
		t.Fatal(sdkErr(err))
	}
	var city struct {
		City       string `json:"city"`
		Population int    `json:"population"`
	}
	if c := chat.Choices[0]; c.FinishReason != "stop" || json.Unmarshal([]byte(c.Message.Content), &city) != nil ||
		validates(compileSchema(t, 0, schema), c.Message.Content) != nil {
		t.Fatalf("%+v", c)
	}
}

// TestLlamaCppStructuredOutputAcrossAKill streams constrained requests,
// kills a rank's worker mid-stream, and checks that each moved request
// rebuilt its grammar from the tokens it had: the same tokens as alone,
// and valid JSON.
func TestLlamaCppStructuredOutputAcrossAKill(t *testing.T) {
	n := startLlamaNode(t)
	const schema = `{"type":"object","properties":{"words":{"type":"array","items":{"type":"string","maxLength":8},"minItems":4,"maxItems":4},"n":{"type":"integer","minimum":0,"maximum":999}},"required":["words","n"]}`
	sch := compileSchema(t, 0, schema)
	ps := prompts(8)
	fields := func(i int) map[string]any {
		return map[string]any{"ignore_eos": false, "temperature": 1, "seed": i, "structured_outputs": map[string]any{"json": json.RawMessage(schema)}}
	}
	alone := make([][]uint32, len(ps))
	for i, p := range ps {
		alone[i], _ = n.sample(t, p, 200, fields(i))
	}
	results := n.streamAcrossAKill(t, len(ps), func(i int) ([]uint32, int, map[string]any) { return ps[i], 200, fields(i) }, 6)
	detokenize := func(ids []uint32) string {
		var out struct {
			Prompt string `json:"prompt"`
		}
		n.postJSON(t, "/detokenize", map[string]any{"tokens": ids}, &out)
		return out.Prompt
	}
	for i, r := range results {
		if r.err != nil || !slices.Equal(r.ids, alone[i]) {
			t.Errorf("stream %d across a killed worker: %v\n    %v\nalone %v", i, r.err, r.ids, alone[i])
			continue
		}
		if text := detokenize(r.ids); validates(sch, text) != nil {
			t.Errorf("stream %d: %q: %v", i, text, validates(sch, text))
		}
	}
	if moved := n.metric(t, "dpnode_requests_migrated_total"); moved == 0 {
		t.Fatal("no stream was migrated off the killed worker's rank")
	}
}
