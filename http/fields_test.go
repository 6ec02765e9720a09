package httpapi

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/prometheus/client_golang/prometheus"
	"pgregory.net/rapid"

	"github.com/dpnode/dpnode/actors/actorstest"
	"github.com/dpnode/dpnode/dp"
)

// jsonNames returns the JSON names of t's fields, as the SDK writes them.
func jsonNames(t reflect.Type) []string {
	var names []string
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name != "" && name != "-" {
			names = append(names, name)
		}
	}
	return names
}

// TestFieldTablesCoverTheSDK walks the OpenAI SDK's request types: every
// field it can send must be in a table, so that a new SDK with a new field
// fails here instead of having the field ignored.
func TestFieldTablesCoverTheSDK(t *testing.T) {
	cases := []struct {
		table *fieldTable
		types []any
		extra []string // set by the SDK outside the params type
	}{
		{chatFields, []any{openai.ChatCompletionNewParams{}}, []string{"stream"}},
		{completionFields, []any{openai.CompletionNewParams{}}, []string{"stream"}},
		{messageFields, []any{
			openai.ChatCompletionSystemMessageParam{}, openai.ChatCompletionDeveloperMessageParam{},
			openai.ChatCompletionUserMessageParam{}, openai.ChatCompletionAssistantMessageParam{},
			openai.ChatCompletionToolMessageParam{},
		}, nil},
		{contentPartFields, []any{openai.ChatCompletionContentPartTextParam{}}, nil},
		{streamOptFields, []any{openai.ChatCompletionStreamOptionsParam{}}, nil},
	}
	for _, tc := range cases {
		var names []string
		for _, v := range tc.types {
			names = append(names, jsonNames(reflect.TypeOf(v))...)
		}
		if len(names) < 2 {
			t.Fatalf("%s: found only %v in the SDK's types: their tags changed", tc.table.where, names)
		}
		for _, name := range append(names, tc.extra...) {
			if tc.table.rules[name] == nil {
				t.Errorf("%s: the SDK sends %q, which no table names: say what it does in fields.go", tc.table.where, name)
			}
		}
	}
}

// TestREADMEListsEveryField: the README's table of request fields names
// every field of every table, with what it does.
func TestREADMEListsEveryField(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(readme), "\n### Request fields\n")
	if !ok {
		t.Fatal("the README has no section ### Request fields")
	}
	section, _, _ = strings.Cut(section, "\n## ")
	// The "in" column of each table's rows.
	in := map[*fieldTable][]string{
		chatFields: {"chat", "both"}, completionFields: {"completions", "both"}, messageFields: {"a message"},
		contentPartFields: {"a content part"}, streamOptFields: {"`stream_options`"},
		tokenizeFields: {"`/tokenize`"}, detokenizeFields: {"`/detokenize`"},
	}
	for table, labels := range in {
		for name, r := range table.rules {
			found := false
			for l := range strings.Lines(section) {
				for _, label := range labels {
					found = found || strings.Contains(l, "`"+name+"`") && strings.Contains(l, "| "+label+" | "+r.use.String()+" |")
				}
			}
			if !found {
				t.Errorf("the README's request fields do not list `%s` in %s as %s", name, labels[0], r.use)
			}
		}
	}
}

// TestScannerFindsEveryMember holds eachMember and eachElement to
// encoding/json on random documents: the same keys, in order, with values
// that decode to the same thing.
func TestScannerFindsEveryMember(t *testing.T) {
	scalar := rapid.OneOf(
		rapid.Just[any](nil), rapid.Bool().AsAny(), rapid.Float64().AsAny(), rapid.Int64().AsAny(),
		rapid.StringMatching(`[a-z"\\{}\[\],: \x{e9}\x{1f999}\t\n]{0,12}`).AsAny(),
	)
	value := rapid.OneOf(scalar,
		rapid.SliceOfN(scalar, 0, 4).AsAny(),
		rapid.MapOfN(rapid.StringMatching(`[a-z"\\]{0,6}`), scalar, 0, 4).AsAny())
	rapid.Check(t, func(t *rapid.T) {
		keys := rapid.SliceOfNDistinct(rapid.StringMatching(`[a-zA-Z_"\\\x{e9}]{1,10}`), 0, 8, rapid.ID).Draw(t, "keys")
		var doc bytes.Buffer
		doc.WriteString(rapid.SampledFrom([]string{"", " ", "\n\t"}).Draw(t, "lead") + "{")
		want := map[string][]byte{}
		elems := map[string][]any{}
		for i, k := range keys {
			if i > 0 {
				doc.WriteString(rapid.SampledFrom([]string{",", " , ", ",\n"}).Draw(t, "comma"))
			}
			v := value.Draw(t, "value")
			kb, _ := json.Marshal(k)
			vb, _ := json.Marshal(v)
			doc.Write(kb)
			doc.WriteString(rapid.SampledFrom([]string{":", " : "}).Draw(t, "colon"))
			doc.Write(vb)
			want[k] = vb
			if list, ok := v.([]any); ok {
				elems[k] = list
			}
		}
		doc.WriteString(" }")
		if !json.Valid(doc.Bytes()) {
			t.Fatalf("not JSON: %s", doc.Bytes())
		}
		var got []string
		eachMember(doc.Bytes(), func(key, val []byte) bool {
			k := string(key)
			got = append(got, k)
			if !bytes.Equal(val, want[k]) {
				t.Fatalf("%q: got %s, want %s", k, val, want[k])
			}
			if list, ok := elems[k]; ok {
				n := 0
				eachElement(val, func(e []byte) bool {
					if xb, _ := json.Marshal(list[n]); !bytes.Equal(e, xb) {
						t.Fatalf("element %d of %q: got %s, want %s", n, k, e, xb)
					}
					n++
					return true
				})
				if n != len(list) {
					t.Fatalf("%q: %d elements found, want %d", k, n, len(list))
				}
			}
			return true
		})
		if !slices.Equal(got, keys) {
			t.Fatalf("keys %q, want %q in %s", got, keys, doc.Bytes())
		}
	})
}

// refusedSamples are values that ask for what a refused field does; every
// refused field needs one, so that each refusal is tried.
var refusedSamples = map[string]string{
	"skip_special_tokens": `false`, "spaces_between_special_tokens": `false`,
	"prompt_logprobs": `1`, "use_beam_search": `true`, "length_penalty": `0.8`, "bad_words": `["x"]`,
	"allowed_token_ids": `[1,2]`, "truncate_prompt_tokens": `10`, "priority": `-5`,
	"response_format": `{"type":"json_object"}`, "structured_outputs": `{"json":{"type":"object"}}`,
	"guided_json": `{"type":"object"}`, "guided_regex": `"a+"`, "guided_choice": `["a","b"]`, "guided_grammar": `"root ::= \"a\""`,
	"logprobs": `true`, "top_logprobs": `3`, "tools": `[{"type":"function","function":{"name":"f"}}]`,
	"tool_choice": `"required"`, "functions": `[{"name":"f"}]`, "function_call": `{"name":"f"}`,
	"audio": `{"voice":"alloy","format":"mp3"}`, "modalities": `["text","audio"]`,
	"prediction": `{"type":"content","content":"x"}`, "web_search_options": `{}`, "verbosity": `"low"`,
	"moderation": `{}`, "echo": `true`, "add_generation_prompt": `false`, "continue_final_message": `true`,
	"add_special_tokens": `true`, "chat_template": `"{{ messages }}"`, "chat_template_kwargs": `{"enable_thinking":false}`,
	"documents": `[{"text":"x"}]`, "best_of": `2`, "suffix": `"tail"`,
	"tool_calls": `[{"id":"c","type":"function","function":{"name":"f","arguments":"{}"}}]`, "tool_call_id": `"c"`,
	"refusal": `"no"`, "continuous_usage_stats": `true`,
}

// sampleFor returns the value of a refused field that asks for something,
// in table.
func sampleFor(table *fieldTable, name string) (string, bool) {
	if v, ok := refusedSamples[table.where+":"+name]; ok {
		return v, true
	}
	v, ok := refusedSamples[name]
	return v, ok
}

func init() {
	// Where the endpoints differ.
	refusedSamples["completions:add_special_tokens"] = `false`
	refusedSamples["completions:logprobs"] = `1`
	refusedSamples["messages[]:function_call"] = `{"name":"f","arguments":"{}"}`
	neutralSamples["completions:logprobs"] = nil
	neutralSamples["completions:add_special_tokens"] = []string{`true`}
	neutralSamples["chat completions:add_special_tokens"] = []string{`false`}
}

// neutralSamples are values of refused fields that ask for nothing, which
// clients send by default; null is tried for every field. They are the
// top-level fields'; nestedNeutral the others'.
var neutralSamples = map[string][]string{
	"skip_special_tokens": {`true`}, "spaces_between_special_tokens": {`true`},
	"use_beam_search": {`false`}, "length_penalty": {`1`}, "bad_words": {`[]`}, "allowed_token_ids": {`[]`}, "priority": {`0`},
	"response_format": {`{"type":"text"}`}, "logprobs": {`false`}, "top_logprobs": {`0`}, "tools": {`[]`},
	"tool_choice": {`"none"`, `"auto"`}, "parallel_tool_calls": {`true`, `false`}, "functions": {`[]`},
	"function_call": {`"none"`}, "modalities": {`["text"]`}, "verbosity": {`"medium"`}, "echo": {`false`},
	"add_generation_prompt": {`true`}, "continue_final_message": {`false`}, "chat_template_kwargs": {`{}`},
	"documents": {`[]`}, "best_of": {`1`}, "suffix": {`""`},
}

var nestedNeutral = map[string][]string{"tool_calls": {`[]`}, "refusal": {`""`}, "continuous_usage_stats": {`false`}}

// newFieldServer is a Server over a simulated node, refusing as it does
// in front of llama.cpp engines unless simulated.
func newFieldServer(t *testing.T, simulated bool, log *slog.Logger) *Server {
	t.Helper()
	node, tok := actorstest.StartSimNode(t, actorstest.Config{Model: "m", Topology: dp.Topology{Size: 1, LocalSize: 1}, MaxModelLen: 256})
	t.Cleanup(node.Stop)
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s, err := New(Config{Backend: node, Tokenizer: tok, ChatTemplate: Llama3Template{}, MaxModelLen: 256,
		Gatherer: prometheus.NewRegistry(), Logger: log, SimulatedEngine: simulated})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func postField(s *Server, path, body string) *httptest.ResponseRecorder {
	rec := httptest.NewRecorder()
	s.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodPost, path, strings.NewReader(body)))
	return rec
}

// errorParam returns the param a 400 names.
func errorParam(t *testing.T, rec *httptest.ResponseRecorder) (string, string) {
	t.Helper()
	var e errorBody
	if err := json.Unmarshal(rec.Body.Bytes(), &e); err != nil || e.Error == nil {
		t.Fatalf("%d %s: not an OpenAI error", rec.Code, rec.Body)
	}
	if e.Error.Param == nil {
		return "", e.Error.Message
	}
	return *e.Error.Param, e.Error.Message
}

// fieldRequest is a request of the endpoint with one field set: at the
// top, in a message, or in stream_options.
func fieldRequest(table *fieldTable, name, value string) (path, body string) {
	switch table {
	case completionFields:
		return "/v1/completions", `{"prompt":"x","max_tokens":1,"` + name + `":` + value + `}`
	case chatFields:
		return "/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"max_tokens":1,"` + name + `":` + value + `}`
	case messageFields:
		return "/v1/chat/completions", `{"messages":[{"role":"user","content":"x"},{"role":"assistant","content":"y","` + name + `":` + value + `}],"max_tokens":1}`
	default: // stream_options
		return "/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"max_tokens":1,"stream":true,"stream_options":{"` + name + `":` + value + `}}`
	}
}

// TestEveryRefusedFieldIsRefusedByName: each refused field, set to what it
// asks for, is a 400 naming it; set to null or a neutral value, the request
// is served. Under the simulated engine the refusals name the engine.
func TestEveryRefusedFieldIsRefusedByName(t *testing.T) {
	for _, simulated := range []bool{false, true} {
		s := newFieldServer(t, simulated, nil)
		for _, table := range []*fieldTable{chatFields, completionFields, messageFields, streamOptFields} {
			for name, r := range table.rules {
				if r.use != fieldRefused && !(simulated && r.simRefuses) {
					continue
				}
				neutral, ok := neutralSamples[table.where+":"+name]
				if !ok {
					neutral = neutralSamples[name]
				}
				if table != chatFields && table != completionFields {
					neutral = nestedNeutral[name]
				}
				for _, v := range append([]string{`null`}, neutral...) {
					path, body := fieldRequest(table, name, v)
					if rec := postField(s, path, body); rec.Code != http.StatusOK {
						t.Errorf("simulated %v: %s %s: %d %s; want 200 for a neutral value", simulated, path, body, rec.Code, rec.Body)
					}
				}
				sample, ok := sampleFor(table, name)
				if !ok {
					t.Errorf("%s: no sample value that asks for something", name)
					continue
				}
				path, body := fieldRequest(table, name, sample)
				rec := postField(s, path, body)
				if rec.Code != http.StatusBadRequest {
					t.Errorf("simulated %v: %s: %d %s; want 400", simulated, body, rec.Code, rec.Body)
					continue
				}
				param, msg := errorParam(t, rec)
				if !strings.HasSuffix(param, name) || !strings.Contains(msg, r.why) {
					t.Errorf("simulated %v: %s: param %q, %q; want %s named with why", simulated, body, param, msg, name)
				}
				if simulated && !strings.Contains(msg, "--engine sim") {
					t.Errorf("simulated: %s: %q does not name the engine", body, msg)
				}
			}
		}
	}
}

// TestFieldValuesOutOfRange: sampling values outside what OpenAI allows are
// 400s under either engine, even where the field is accepted.
func TestFieldValuesOutOfRange(t *testing.T) {
	s := newFieldServer(t, true, nil)
	for _, tc := range []struct {
		table       *fieldTable
		name, value string
	}{
		{chatFields, "presence_penalty", `2.5`},
		{completionFields, "frequency_penalty", `-3`},
		{chatFields, "repetition_penalty", `0`},
		{chatFields, "min_p", `1.5`},
		{chatFields, "min_p", `"high"`},
		{chatFields, "top_logprobs", `21`},
		{completionFields, "logprobs", `-1`},
		{completionFields, "best_of", `0`},
	} {
		path, body := fieldRequest(tc.table, tc.name, tc.value)
		rec := postField(s, path, body)
		if rec.Code != http.StatusBadRequest {
			t.Errorf("%s: %d %s; want 400", body, rec.Code, rec.Body)
			continue
		}
		if param, msg := errorParam(t, rec); param != tc.name || !strings.Contains(msg, tc.name) {
			t.Errorf("%s: %q %q", body, param, msg)
		}
	}
}

// TestMessagePathsNameTheMessage: a refusal inside a message names the
// message; nested content parts and stream options are held to their tables.
func TestMessagePathsNameTheMessage(t *testing.T) {
	s := newFieldServer(t, true, nil)
	rec := postField(s, "/v1/chat/completions", `{"messages":[{"role":"user","content":"x"},{"role":"assistant","content":null,"tool_calls":[{"id":"1"}]}]}`)
	if param, _ := errorParam(t, rec); rec.Code != 400 || param != "messages[1].tool_calls" {
		t.Fatalf("%d %s", rec.Code, rec.Body)
	}
	// Top log-probabilities need logprobs set.
	for path, body := range map[string]string{
		"/v1/chat/completions": `{"messages":[{"role":"user","content":"x"}],"top_logprobs":2}`,
	} {
		rec := postField(s, path, body)
		if param, _ := errorParam(t, rec); rec.Code != 400 || !strings.Contains(param, "logprobs") {
			t.Fatalf("%s: %d %s", body, rec.Code, rec.Body)
		}
	}
	// Escaped and differently cased keys are the fields encoding/json
	// reads them as.
	for _, body := range []string{
		`{"messages":[{"role":"user","content":"x"}],"\u0074ools":[{"type":"function"}]}`,
		`{"messages":[{"role":"user","content":"x"}],"Tools":[{"type":"function"}]}`,
	} {
		rec := postField(s, "/v1/chat/completions", body)
		if param, _ := errorParam(t, rec); rec.Code != 400 || param != "tools" {
			t.Fatalf("%s: %d %s", body, rec.Code, rec.Body)
		}
	}
}

// syncBuffer is a log's destination that handlers on several goroutines
// may write.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// TestUnknownFieldsAreServedAndLoggedOnce: a field no table names is
// ignored, as vLLM ignores it, and logged once a minute per name,
// wherever it is.
func TestUnknownFieldsAreServedAndLoggedOnce(t *testing.T) {
	var logs syncBuffer
	s := newFieldServer(t, false, slog.New(slog.NewTextHandler(&logs, nil)))
	body := `{"messages":[{"role":"user","content":[{"type":"text","text":"x","cache_control":{"type":"ephemeral"}}],"x_mark":1}],"max_tokens":1,"x_trace":"a"}`
	for range 3 {
		if rec := postField(s, "/v1/chat/completions", body); rec.Code != http.StatusOK {
			t.Fatalf("%d %s", rec.Code, rec.Body)
		}
	}
	if rec := postField(s, "/v1/completions", `{"prompt":"x","max_tokens":1,"x_trace":"b"}`); rec.Code != http.StatusOK {
		t.Fatalf("%d %s", rec.Code, rec.Body)
	}
	out := logs.String()
	for _, name := range []string{"field=x_trace", "field=messages[0].x_mark", "field=messages[0].content[].cache_control"} {
		if n := strings.Count(out, name+" "); n != 1 {
			t.Errorf("%s logged %d times, want once:\n%s", name, n, out)
		}
	}
}
