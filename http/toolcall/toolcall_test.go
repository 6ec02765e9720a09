package toolcall

import (
	"slices"
	"strings"
	"testing"
)

// outputCase is one output a model wrote, with what it says.
type outputCase struct {
	name    string
	format  Format
	opts    Options
	text    string
	content string
	calls   []Call
}

// mk builds a Call.
func mk(name, args string) Call { return Call{Name: name, Arguments: args} }

// A function with nested objects, arrays, strings holding braces, quotes,
// a closing tag and unicode, numbers and literals.
const nestedArgs = `{"title": "Team sync {weekly}", "attendees": [{"email": "ana@example.com", "optional": false}, {"email": "bo@example.com", "optional": true}], "notes": "Say \"hi\"; then type </tool_call> or [TOOL_CALLS] or }]} literally", "location": "Zürich 🇨🇭 \u00e9\ud83d\ude00", "reminders": {"minutes": [10, 30], "channel": null}, "budget": -1.5e3, "slots": [[1, 2], [], {}]}`

// outputs are outputs modelled on what Qwen 2.5, Hermes, Llama 3.1, Mistral
// Nemo and Mistral Small 3.2 write, and on vLLM's own formats.
var outputs = []outputCase{
	// Hermes: Qwen 2.5 and 3, Hermes 2 Pro.
	{
		name: "content only", format: Hermes,
		text:    "The capital of France is Paris. It has been since 508 AD.",
		content: "The capital of France is Paris. It has been since 508 AD.",
	},
	{
		name: "content with tag-like text", format: Hermes,
		text:    "Wrap each call in <tool_calls> or <tool_ and close it with </tool_call>. <tool",
		content: "Wrap each call in <tool_calls> or <tool_ and close it with </tool_call>. <tool",
	},
	{
		name: "one call", format: Hermes,
		text:  "<tool_call>\n{\"name\": \"get_current_weather\", \"arguments\": {\"location\": \"Boston, MA\", \"unit\": \"fahrenheit\"}}\n</tool_call>",
		calls: []Call{mk("get_current_weather", `{"location": "Boston, MA", "unit": "fahrenheit"}`)},
	},
	{
		name: "content then a call", format: Hermes,
		text:    "Let me check the weather for you.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
		content: "Let me check the weather for you.\n",
		calls:   []Call{mk("get_weather", `{"city": "Paris"}`)},
	},
	{
		name: "two calls", format: Hermes,
		text:    "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>",
		content: "Let me check.\n",
		calls:   []Call{mk("get_weather", `{"city": "Paris"}`), mk("get_time", `{}`)},
	},
	{
		name: "two calls, single", format: Hermes, opts: Options{Single: true},
		text:    "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>",
		content: "Let me check.\n",
		calls:   []Call{mk("get_weather", `{"city": "Paris"}`)},
	},
	{
		name: "nested arguments", format: Hermes,
		text:  "<tool_call>\n{\"name\": \"create_event\", \"arguments\": " + nestedArgs + "}\n</tool_call>",
		calls: []Call{mk("create_event", nestedArgs)},
	},
	{
		name: "keys in reverse order", format: Hermes,
		text:  "<tool_call>\n{\"arguments\": {\"query\": \"vLLM tool parsers\", \"top_k\": 5}, \"name\": \"web_search\"}\n</tool_call>",
		calls: []Call{mk("web_search", `{"query": "vLLM tool parsers", "top_k": 5}`)},
	},
	{
		name: "unknown keys and an escaped name", format: Hermes,
		text:  "<tool_call>\n{\"type\": \"function\", \"id\": {\"n\": [1]}, \"name\": \"get\\u005fweather\", \"arguments\": {\"city\": \"Lyon\"}, \"name\": \"other\"}\n</tool_call>",
		calls: []Call{mk("get_weather", `{"city": "Lyon"}`)},
	},
	{
		name: "arguments as a string", format: Hermes,
		text:  "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": \"{\\\"city\\\": \\\"Paris\\\"}\"}\n</tool_call>",
		calls: []Call{mk("get_weather", `{"city": "Paris"}`)},
	},
	{
		name: "truncated mid-arguments", format: Hermes,
		text:    "I'll write the file.\n<tool_call>\n{\"name\": \"write_file\", \"arguments\": {\"path\": \"main.go\", \"content\": \"package main\\n\\nfunc main() {\\n\\tprintln(\\\"hel",
		content: "I'll write the file.\n",
		calls:   []Call{mk("write_file", `{"path": "main.go", "content": "package main\n\nfunc main() {\n\tprintln(\"hel`)},
	},
	{
		name: "truncated inside a string argument", format: Hermes,
		text:  "<tool_call>\n{\"name\": \"f\", \"arguments\": \"{\\\"a\\\": \\\"b\\u00e",
		calls: []Call{mk("f", `{"a": "b`)},
	},
	{
		name: "truncated after the arguments key", format: Hermes,
		text:  "<tool_call>\n{\"name\": \"get_time\", \"arguments\"",
		calls: []Call{mk("get_time", ``)},
	},
	{
		name: "no closing tag", format: Hermes,
		text:  "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"tz\": \"UTC\"}}\n",
		calls: []Call{mk("get_time", `{"tz": "UTC"}`)},
	},
	{
		name: "missing closing brace", format: Hermes,
		text:  "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"tz\": \"UTC\"}\n</tool_call>\n<tool_call>\n{\"name\": \"get_date\", \"arguments\": {}}\n</tool_call>",
		calls: []Call{mk("get_time", `{"tz": "UTC"}`), mk("get_date", `{}`)},
	},
	{
		name: "garbage after the calls", format: Hermes,
		text:    "Sure.\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>\nI hope this helps! <tool_call> nothing",
		content: "Sure.\n",
		calls:   []Call{mk("get_time", `{}`)},
	},
	{
		name: "a block that is not a call", format: Hermes,
		text:    "<tool_call>\n{\"name\": \"get_time\"}\n</tool_call>",
		content: "<tool_call>\n{\"name\": \"get_time\"}\n</tool_call>",
	},
	{
		name: "a block that is not a call, then a call", format: Hermes,
		text:  "\n<tool_call>\n{\"name\": \"\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>",
		calls: []Call{mk("get_time", `{}`)},
	},
	{
		name: "thinking, then a call", format: Hermes,
		text:    "<think>\nThe user wants the time in Tokyo; {\"x\": 1} is not a call.\n</think>\n\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"city\": \"東京\"}}\n</tool_call>",
		content: "<think>\nThe user wants the time in Tokyo; {\"x\": 1} is not a call.\n</think>\n\n",
		calls:   []Call{mk("get_time", `{"city": "東京"}`)},
	},
	{
		name: "whitespace only", format: Hermes,
		text: "\n\n  ",
	},

	// Llama 3.1, 3.2, 3.3.
	{
		name: "content only", format: Llama3JSON,
		text:    "Paris is the capital of France.",
		content: "Paris is the capital of France.",
	},
	{
		name: "one call", format: Llama3JSON,
		text:  `{"name": "get_current_conditions", "parameters": {"location": "San Francisco, CA", "unit": "Fahrenheit"}}`,
		calls: []Call{mk("get_current_conditions", `{"location": "San Francisco, CA", "unit": "Fahrenheit"}`)},
	},
	{
		name: "python tag", format: Llama3JSON,
		text:  "<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}",
		calls: []Call{mk("get_weather", `{"city": "Paris"}`)},
	},
	{
		name: "two calls", format: Llama3JSON,
		text:  "\n\n{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}; {\"name\": \"get_time\", \"arguments\": {\"tz\": \"Europe/Paris\"}}",
		calls: []Call{mk("get_weather", `{"city": "Paris"}`), mk("get_time", `{"tz": "Europe/Paris"}`)},
	},
	{
		name: "two calls, single", format: Llama3JSON, opts: Options{Single: true},
		text:  "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}; {\"name\": \"get_time\", \"arguments\": {\"tz\": \"Europe/Paris\"}}",
		calls: []Call{mk("get_weather", `{"city": "Paris"}`)},
	},
	{
		name: "nested arguments, reversed keys", format: Llama3JSON,
		text:  `{"parameters": ` + nestedArgs + `, "name": "create_event"}`,
		calls: []Call{mk("create_event", nestedArgs)},
	},
	{
		name: "an answer in JSON", format: Llama3JSON,
		text:    `{"answer": 42}`,
		content: `{"answer": 42}`,
	},
	{
		name: "an answer in JSON, then text", format: Llama3JSON,
		text:    "{\"name\": \"Ada\", \"born\": 1815}\nShe wrote the first program.",
		content: "{\"name\": \"Ada\", \"born\": 1815}\nShe wrote the first program.",
	},
	{
		name: "built-in tool call", format: Llama3JSON,
		text:    `<|python_tag|>brave_search.call(query="weather in Paris")`,
		content: `<|python_tag|>brave_search.call(query="weather in Paris")`,
	},
	{
		name: "garbage after the calls", format: Llama3JSON,
		text:  "{\"name\": \"get_time\", \"parameters\": {}} I called the tool; {\"name\": \"x\", \"parameters\": {}}",
		calls: []Call{mk("get_time", `{}`)},
	},
	{
		name: "not a call after a call", format: Llama3JSON,
		text:  "{\"name\": \"get_time\", \"parameters\": {}}; {\"name\": \"x\"}; {\"name\": \"y\", \"parameters\": {}}",
		calls: []Call{mk("get_time", `{}`)},
	},
	{
		name: "truncated", format: Llama3JSON,
		text:  `{"name": "search", "parameters": {"query": "best pizza in Napl`,
		calls: []Call{mk("search", `{"query": "best pizza in Napl`)},
	},
	{
		name: "truncated before the arguments", format: Llama3JSON,
		text:    `{"name": "search", "param`,
		content: `{"name": "search", "param`,
	},
	{
		name: "broken JSON", format: Llama3JSON,
		text:    `{"name": "search" "parameters": {}}`,
		content: `{"name": "search" "parameters": {}}`,
	},

	// Mistral: Nemo's array, Small 3.2's name[ARGS]{...}.
	{
		name: "content only", format: Mistral,
		text:    "Bonjour ! Comment puis-je vous aider [aujourd'hui] ?",
		content: "Bonjour ! Comment puis-je vous aider [aujourd'hui] ?",
	},
	{
		name: "array", format: Mistral,
		text:  `[TOOL_CALLS][{"name": "get_current_weather", "arguments": {"location": "Paris, France", "format": "celsius"}, "id": "a1B2c3D4e"}]`,
		calls: []Call{mk("get_current_weather", `{"location": "Paris, France", "format": "celsius"}`)},
	},
	{
		name: "content then an array of two", format: Mistral,
		text:    "Let me look both up.[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}, {\"id\": \"x\", \"arguments\": " + nestedArgs + ", \"name\": \"create_event\"}]",
		content: "Let me look both up.",
		calls:   []Call{mk("get_weather", `{"city": "Paris"}`), mk("create_event", nestedArgs)},
	},
	{
		name: "array with an element that is not a call", format: Mistral,
		text:  `[TOOL_CALLS][1, {"name": "f"}, [{"name": "g", "arguments": {}}], {"name": "h", "arguments": {"a": [true]}}] trailing`,
		calls: []Call{mk("h", `{"a": [true]}`)},
	},
	{
		name: "name and args", format: Mistral,
		text:  `[TOOL_CALLS]get_weather[ARGS]{"city": "Paris", "unit": "celsius"}`,
		calls: []Call{mk("get_weather", `{"city": "Paris", "unit": "celsius"}`)},
	},
	{
		name: "two calls with name and args", format: Mistral,
		text:    "Je vérifie.[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}[TOOL_CALLS]get_time[ARGS]{}",
		content: "Je vérifie.",
		calls:   []Call{mk("get_weather", `{"city": "Paris"}`), mk("get_time", `{}`)},
	},
	{
		name: "two calls with name and args, single", format: Mistral, opts: Options{Single: true},
		text:  "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}[TOOL_CALLS]get_time[ARGS]{}",
		calls: []Call{mk("get_weather", `{"city": "Paris"}`)},
	},
	{
		name: "call id", format: Mistral,
		text:  `[TOOL_CALLS]get_time[CALL_ID]Ab3dE6gH9[ARGS]{"tz": "UTC"}`,
		calls: []Call{mk("get_time", `{"tz": "UTC"}`)},
	},
	{
		name: "nested args, then garbage", format: Mistral,
		text:  "[TOOL_CALLS]create_event[ARGS]" + nestedArgs + "\nDone!",
		calls: []Call{mk("create_event", nestedArgs)},
	},
	{
		name: "markers with no call", format: Mistral,
		text:  "[TOOL_CALLS][TOOL_CALLS] [ARGS]{}[TOOL_CALLS]get_time[ARGS]{}",
		calls: []Call{mk("get_time", `{}`)},
	},
	{
		name: "a marker where arguments should be", format: Mistral,
		text:  "[TOOL_CALLS]get_time[ARGS][TOOL_CALLS]get_date[ARGS]{}[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {\"a\": [TOOL_CALLS]g[ARGS]{}",
		calls: []Call{mk("get_time", `[`), mk("get_date", `{}`), mk("f", `{"a": [`), mk("g", `{}`)},
	},
	{
		name: "a marker with no name", format: Mistral,
		text:    "[TOOL_CALLS] [ARGS]{\"a\": 1}",
		content: "[TOOL_CALLS] [ARGS]{\"a\": 1}",
	},
	{
		name: "truncated name and args", format: Mistral,
		text:  `[TOOL_CALLS]get_weather[ARGS]{"city": "Par`,
		calls: []Call{mk("get_weather", `{"city": "Par`)},
	},
	{
		name: "truncated before args", format: Mistral,
		text:    `Checking.[TOOL_CALLS]get_weat`,
		content: `Checking.[TOOL_CALLS]get_weat`,
	},
	{
		name: "truncated array", format: Mistral,
		text:  `[TOOL_CALLS][{"name": "a", "arguments": {}}, {"name": "b", "arguments": {"x": [1, 2`,
		calls: []Call{mk("a", `{}`), mk("b", `{"x": [1, 2`)},
	},

	// vLLM's named function: the output is the arguments.
	{
		name: "object", format: Arguments, opts: Options{Named: "get_weather"},
		text:  "\n{\"city\": \"Paris\", \"days\": [1, 2]}",
		calls: []Call{mk("get_weather", `{"city": "Paris", "days": [1, 2]}`)},
	},
	{
		name: "object then text", format: Arguments, opts: Options{Named: "get_weather"},
		text:  `{"city": "Paris"} and more`,
		calls: []Call{mk("get_weather", `{"city": "Paris"}`)},
	},
	{
		name: "truncated", format: Arguments, opts: Options{Named: "f"},
		text:  `{"text": "Once upon a ti`,
		calls: []Call{mk("f", `{"text": "Once upon a ti`)},
	},
	{
		name: "not an object", format: Arguments, opts: Options{Named: "f"},
		text:    `I cannot call that.`,
		content: `I cannot call that.`,
	},
	{
		name: "only an open brace", format: Arguments, opts: Options{Named: "f"},
		text:  ` {`,
		calls: []Call{mk("f", `{`)},
	},

	// vLLM's required tool: the output is a list of calls.
	{
		name: "two calls", format: JSONList,
		text:  `[{"name": "get_weather", "parameters": {"city": "Paris"}}, {"name": "get_time", "parameters": {"tz": "Europe/Paris"}}]`,
		calls: []Call{mk("get_weather", `{"city": "Paris"}`), mk("get_time", `{"tz": "Europe/Paris"}`)},
	},
	{
		name: "arguments key, single", format: JSONList, opts: Options{Single: true},
		text:  `[{"arguments": {"a": 1}, "name": "f"}, {"name": "g", "parameters": {}}]`,
		calls: []Call{mk("f", `{"a": 1}`)},
	},
	{
		name: "not a list", format: JSONList,
		text:    `{"name": "f", "parameters": {}}`,
		content: `{"name": "f", "parameters": {}}`,
	},
	{
		name: "a list of no calls", format: JSONList,
		text:    `[{"name": "f"}] ok`,
		content: `[{"name": "f"}] ok`,
	},
	{
		name: "garbage after the list", format: JSONList,
		text:  `[{"name": "f", "parameters": {}}] ok`,
		calls: []Call{mk("f", `{}`)},
	},
}

func TestOutputs(t *testing.T) {
	for i, tc := range outputs {
		t.Run(string(tc.format)+"/"+tc.name, func(t *testing.T) {
			got, err := sameEverywhere(tc.format, tc.opts, tc.text, uint64(i), 200)
			if err != nil {
				t.Fatal(err)
			}
			if got.content != tc.content || !slices.Equal(got.calls, tc.calls) {
				t.Errorf("got content %q, calls %q\nwant content %q, calls %q", got.content, got.calls, tc.content, tc.calls)
			}
		})
	}
}

// TestOutputsEveryFormat reads every output in every format: whatever it
// says, the invariants hold.
func TestOutputsEveryFormat(t *testing.T) {
	for i, tc := range outputs {
		for _, f := range formats {
			if _, err := sameEverywhere(f, Options{Named: "f", Single: i%2 == 0}, tc.text, uint64(i), 0); err != nil {
				t.Errorf("%s output %q read as %s: %v", tc.format, tc.name, f, err)
			}
		}
	}
}

// heldContent is the content that must have been given once prefix, a
// prefix of an output in format f with no call, has been read: all of it
// but a tail that may begin a marker, or a rune cut short; nothing if it is
// only whitespace.
func heldContent(f Format, prefix string) string {
	marker := map[Format]string{Hermes: hermesStart, Mistral: mistralStart}[f]
	end := len(prefix)
	for k := max(0, len(prefix)-len(marker)+1); k < len(prefix); k++ {
		if strings.HasPrefix(marker, prefix[k:]) {
			end = k
			break
		}
	}
	end = whole(prefix[:end])
	if strings.TrimLeft(prefix[:end], " \t\r\n") == "" {
		return ""
	}
	return prefix[:end]
}

// TestContentIsGivenAtOnce checks that content is held only while it may
// begin a marker, and that text that cannot be a call is given at once.
func TestContentIsGivenAtOnce(t *testing.T) {
	cases := []struct {
		f    Format
		text string
	}{
		{Hermes, "Use <tool_calls>, <tool_ or < tool_call>: all are text. Even <tool_call"},
		{Hermes, "  \n Le café coûte 3 €, <tool_c"},
		{Mistral, "Use [TOOL_CALL], [TOOL or [[TOOL_CALL] x [TOOL_CALLS"},
		{Llama3JSON, "  Paris, or <|python is not a tag. 🗼"},
		{Llama3JSON, "<|python_tag|>print(1)"},
		{Arguments, "No {object} here"},
		{JSONList, "\n{\"not\": \"a list\"}"},
	}
	for _, tc := range cases {
		p, err := New(tc.f, Options{Named: "f"})
		if err != nil {
			t.Fatal(err)
		}
		var got string
		for n := 1; n <= len(tc.text); n++ {
			got += p.Update(tc.text[:n], false).Content
			want := heldContent(tc.f, tc.text[:n])
			if tc.f == Llama3JSON && strings.HasPrefix(pythonTag, strings.TrimLeft(tc.text[:n], " ")) {
				want = "" // It may still be the tag.
			}
			if got != want {
				t.Fatalf("%s: after %q, content %q; want %q", tc.f, tc.text[:n], got, want)
			}
		}
	}
}

// TestHeldWhileUnclear checks that text that may be a call is held.
func TestHeldWhileUnclear(t *testing.T) {
	cases := []struct {
		f          Format
		text, more string
		content    string // given once text and more are read
	}{
		{Hermes, "Checking. <tool_", "call>\n{\"name\": \"f\", \"arguments\": {}}", "Checking. "},
		{Hermes, "Checking. <tool_", "kit>", "Checking. <tool_kit>"},
		{Mistral, "Checking. [TOOL_CA", "LLS]f[ARGS]{}", "Checking. "},
		{Llama3JSON, "{\"name\": \"f\", \"x\": 1", "}", "{\"name\": \"f\", \"x\": 1}"},
		{Llama3JSON, "<|python_", "tag|>{\"a\": 1}", "<|python_tag|>{\"a\": 1}"},
		{JSONList, "[{\"name\": \"f\"}", "]", "[{\"name\": \"f\"}]"},
	}
	for _, tc := range cases {
		p, err := New(tc.f, Options{})
		if err != nil {
			t.Fatal(err)
		}
		first := p.Update(tc.text, false).Content
		if want := heldContent(tc.f, tc.text); (tc.f == Hermes || tc.f == Mistral) && first != want {
			t.Errorf("%s %q: content %q; want %q", tc.f, tc.text, first, want)
		}
		if tc.f != Hermes && tc.f != Mistral && first != "" {
			t.Errorf("%s %q: content %q given before it is clear", tc.f, tc.text, first)
		}
		if got := first + p.Update(tc.text+tc.more, false).Content; got != tc.content {
			t.Errorf("%s %q + %q: content %q; want %q", tc.f, tc.text, tc.more, got, tc.content)
		}
	}
}

// TestAnnounceAndStream checks when a call is announced, and that an
// object's arguments stream as they arrive while other values wait.
func TestAnnounceAndStream(t *testing.T) {
	cases := []struct {
		f        Format
		text     string
		announce string // the call is announced once the text ends with this
		args     string // the arguments' first byte, or "" if they are not an object
		final    string
	}{
		{Hermes, `<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>`, `"arguments"`, `{"city"`, `{"city": "Paris"}`},
		{Hermes, `<tool_call>{"arguments": {"city": "Paris"}, "name": "get_weather"}</tool_call>`, `"get_weather"`, ``, `{"city": "Paris"}`},
		{Hermes, `<tool_call>{"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}`, `"arguments"`, ``, `{"city": "Paris"}`},
		{Llama3JSON, `{"name": "get_weather", "parameters": {"city": "Paris"}}`, `"parameters"`, `{"city"`, `{"city": "Paris"}`},
		{Mistral, `[TOOL_CALLS]get_weather[ARGS] {"city": "Paris"}`, `[ARGS]`, `{"city"`, `{"city": "Paris"}`},
		{Mistral, `[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}]`, `"arguments"`, `{"city"`, `{"city": "Paris"}`},
		{Arguments, ` {"city": "Paris"}`, ` {`, `{"city"`, `{"city": "Paris"}`},
		{JSONList, `[{"name": "get_weather", "parameters": {"city": "Paris"}}]`, `"parameters"`, `{"city"`, `{"city": "Paris"}`},
	}
	for _, tc := range cases {
		p, err := New(tc.f, Options{Named: "get_weather"})
		if err != nil {
			t.Fatal(err)
		}
		at := strings.Index(tc.text, tc.announce) + len(tc.announce)
		argsAt := strings.Index(tc.text, tc.args)
		var args string
		for n := 1; n <= len(tc.text); n++ {
			d := p.Update(tc.text[:n], false)
			named := len(d.Calls) > 0 && d.Calls[0].Name != ""
			if named != (n == at) {
				t.Fatalf("%s %q: named %v after %d bytes; want it after %d", tc.f, tc.text, named, n, at)
			}
			for _, cd := range d.Calls {
				args += cd.Arguments
			}
			switch {
			case tc.args != "" && n > argsAt && args != tc.final[:min(len(tc.final), n-argsAt)]:
				t.Fatalf("%s %q: after %d bytes, arguments %q", tc.f, tc.text, n, args)
			case tc.args == "" && args != "" && args != tc.final:
				t.Fatalf("%s %q: after %d bytes, arguments %q before they are whole", tc.f, tc.text, n, args)
			}
		}
		if args != tc.final {
			t.Errorf("%s %q: arguments %q; want %q", tc.f, tc.text, args, tc.final)
		}
	}
}

// TestRunesAreNotCut checks that no fragment ends inside a rune until the
// final Update.
func TestRunesAreNotCut(t *testing.T) {
	text := "Café 🇨🇭<tool_call>{\"name\": \"f\", \"arguments\": {\"q\": \"日本\"}}"
	p, _ := New(Hermes, Options{})
	var content, args string
	for n := 1; n <= len(text); n++ {
		d := p.Update(text[:n], false)
		content += d.Content
		for _, cd := range d.Calls {
			args += cd.Arguments
		}
		if whole(content) != len(content) || whole(args) != len(args) {
			t.Fatalf("after %d bytes, content %q and arguments %q", n, content, args)
		}
	}
	if content != "Café 🇨🇭" || args != `{"q": "日本"}` {
		t.Errorf("content %q, arguments %q", content, args)
	}
	// A rune cut short by the end of the output is given as it is.
	p, _ = New(Hermes, Options{})
	cut := "Caf\xc3"
	d := p.Update(cut, false)
	d2 := p.Update(cut, true)
	if d.Content+d2.Content != cut {
		t.Errorf("content %q then %q; want %q in all", d.Content, d2.Content, cut)
	}
}

func TestNew(t *testing.T) {
	for _, f := range formats {
		if _, err := New(f, Options{Named: "f"}); err != nil {
			t.Errorf("New(%s): %v", f, err)
		}
	}
	if _, err := New(Arguments, Options{}); err == nil || !strings.Contains(err.Error(), "Named") {
		t.Errorf("New(arguments) with no name: error %v", err)
	}
	if _, err := New("qwen3_xml", Options{}); err == nil || !strings.Contains(err.Error(), `"qwen3_xml"`) {
		t.Errorf("New(qwen3_xml): error %v", err)
	}
}

func TestParsers(t *testing.T) {
	got := Parsers()
	if !slices.IsSorted(got) || !slices.Equal(got, []string{"hermes", "llama3_json", "mistral"}) {
		t.Errorf("Parsers() = %q", got)
	}
	for _, name := range got {
		if _, err := New(Format(name), Options{}); err != nil {
			t.Errorf("New(%s): %v", name, err)
		}
	}
}

func TestNewCallID(t *testing.T) {
	seen := map[string]bool{}
	for range 1000 {
		for _, f := range formats {
			id := NewCallID(f)
			ok := len(id) == 46 && strings.HasPrefix(id, "chatcmpl-tool-") && strings.Trim(id[14:], "0123456789abcdef") == ""
			if f == Mistral {
				ok = len(id) == 9 && strings.Trim(id, alphanumeric) == ""
			}
			if !ok || seen[id] {
				t.Fatalf("NewCallID(%s) = %q", f, id)
			}
			seen[id] = true
		}
	}
}

// TestMisuse checks that a shorter text and Updates after the final one
// change nothing.
func TestMisuse(t *testing.T) {
	p, _ := New(Hermes, Options{})
	p.Update("Hello <tool_call>{\"name\": \"f\", \"arguments\": {", false)
	p.Update("Hel", false)
	p.Update("Hello <tool_call>{\"name\": \"f\", \"arguments\": {}}", true)
	p.Update("Hello <tool_call>{\"name\": \"f\", \"arguments\": {}}, and more", true)
	content, calls := p.Result()
	if content != "Hello " || !slices.Equal(calls, []Call{mk("f", "{}")}) {
		t.Errorf("content %q, calls %q", content, calls)
	}
}
