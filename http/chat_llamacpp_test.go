//go:build llamacpp

package httpapi

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dpnode/dpnode/engine/llamacpp/llamacpptest"
)

// referenceRenderer renders chat templates as Hugging Face's
// apply_chat_template does, with Python's jinja2: a sandbox with
// trim_blocks and lstrip_blocks, loop controls, transformers' no-op
// {% generation %} tag, its tojson (no ASCII escaping), raise_exception
// and strftime_now.
const referenceRenderer = `
import json, sys
from datetime import datetime
import jinja2, jinja2.ext, jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

class Generation(jinja2.ext.Extension):
    tags = {"generation"}
    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.Scope(body).set_lineno(lineno)

def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)

def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols, Generation])
env.filters["tojson"] = tojson
env.globals["raise_exception"] = raise_exception
env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)

job = json.load(sys.stdin)
out = {}
for name, src in job["templates"].items():
    for case, c in job["cases"].items():
        key = name + "/" + case
        try:
            out[key] = {"ok": True, "text": env.from_string(src).render(messages=c["messages"], add_generation_prompt=True,
                bos_token=job["bos"], eos_token=job["eos"], tools=c["tools"])}
        except Exception as e:
            out[key] = {"ok": False, "text": type(e).__name__ + ": " + str(e)}
json.dump(out, sys.stdout)
`

// python finds a Python with jinja2: $DPNODE_PYTHON, python3, or Debian's.
func python(t *testing.T) string {
	t.Helper()
	for _, p := range []string{os.Getenv("DPNODE_PYTHON"), "python3", "/usr/bin/python3"} {
		if p != "" && exec.Command(p, "-c", "import jinja2").Run() == nil {
			return p
		}
	}
	t.Fatal("no Python with jinja2, the reference renderer of chat templates (Debian: apt-get install python3-jinja2)")
	return ""
}

// TestChatTemplatesRenderLikeHuggingFace renders every chat template of
// llama.cpp's collection (Llama 3.x, Qwen, DeepSeek, Mistral, Gemma and
// more) with five conversations, two with tools, a call and its result,
// and holds dpnode's rendering to
// Python's jinja2 configured as Hugging Face configures it. Where the
// reference refuses a conversation (roles out of order, a system message
// the model has no place for), dpnode may refuse too or render: the
// template library is lenient with undefined names and None, where Python
// raises.
func TestChatTemplatesRenderLikeHuggingFace(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(llamacpptest.Src(t), "models", "templates", "*.jinja"))
	if err != nil || len(files) < 40 {
		t.Fatalf("%d templates found (%v)", len(files), err)
	}
	type conversation struct {
		msgs  []ChatMessage
		tools []json.RawMessage
	}
	tools := []json.RawMessage{
		json.RawMessage(`{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city, <now> & later", "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "The city, e.g. Zürich"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}, "days": {"type": "integer", "minimum": 1, "maximum": 1e1}, "scale": {"type": "number", "default": 1.0, "minimum": 0.25}}, "required": ["city"]}}}`),
		json.RawMessage(`{"type": "function", "function": {"name": "get_time", "description": "The time now", "parameters": {"type": "object", "properties": {}}}}`),
	}
	cases := map[string]conversation{
		"one user message": {msgs: []ChatMessage{{Role: "user", Content: "Hello"}}},
		"a conversation": {msgs: []ChatMessage{{Role: "system", Content: "You are terse."}, {Role: "user", Content: "Hi"},
			{Role: "assistant", Content: "Hello there."}, {Role: "user", Content: "What is 2+2?"}}},
		"unicode and markup": {msgs: []ChatMessage{{Role: "user", Content: "Ünïcödé \"quotes\" <tags> & stuff\nnew line 🦙"}}},
		"tools offered":      {msgs: []ChatMessage{{Role: "system", Content: "You are helpful."}, {Role: "user", Content: "Weather in Paris?"}}, tools: tools},
		"a call and its result": {msgs: []ChatMessage{{Role: "user", Content: "Weather in Paris?"},
			{Role: "assistant", ToolCalls: []ChatToolCall{{ID: "call00001", Name: "get_weather", Arguments: `{"city": "Paris", "days": 2}`}}},
			{Role: "tool", ToolCallID: "call00001", Content: `{"temperature": 18}`}}, tools: tools},
	}
	const bos, eos = "<|begin_of_text|>", "<|end_of_text|>"
	job := map[string]any{"bos": bos, "eos": eos, "templates": map[string]string{}, "cases": map[string]any{}}
	sources := map[string]string{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		name := strings.TrimSuffix(filepath.Base(f), ".jinja")
		sources[name] = string(b)
		job["templates"].(map[string]string)[name] = string(b)
	}
	for name, c := range cases {
		// The messages as Render gives them to the template: arguments
		// that are an object as a mapping, keys in the order given.
		type wireFunction struct {
			Name      string          `json:"name"`
			Arguments json.RawMessage `json:"arguments"`
		}
		type wireCall struct {
			ID       string       `json:"id"`
			Type     string       `json:"type"`
			Function wireFunction `json:"function"`
		}
		type wireMessage struct {
			Role       string     `json:"role"`
			Content    string     `json:"content"`
			ToolCalls  []wireCall `json:"tool_calls,omitempty"`
			ToolCallID string     `json:"tool_call_id,omitempty"`
		}
		var wire []wireMessage
		for _, m := range c.msgs {
			msg := wireMessage{Role: m.Role, Content: m.Content, ToolCallID: m.ToolCallID}
			for _, tc := range m.ToolCalls {
				msg.ToolCalls = append(msg.ToolCalls, wireCall{ID: tc.ID, Type: "function", Function: wireFunction{Name: tc.Name, Arguments: json.RawMessage(tc.Arguments)}})
			}
			wire = append(wire, msg)
		}
		job["cases"].(map[string]any)[name] = map[string]any{"messages": wire, "tools": c.tools}
	}
	in, _ := json.Marshal(job)
	cmd := exec.Command(python(t), "-c", referenceRenderer)
	cmd.Stdin = bytes.NewReader(in)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("the reference renderer: %v\n%s", err, stderr.String())
	}
	var ref map[string]struct {
		OK   bool   `json:"ok"`
		Text string `json:"text"`
	}
	if err := json.Unmarshal(out, &ref); err != nil {
		t.Fatal(err)
	}
	// knownDifferences are renderings that differ for a reason of the
	// reference's, not of dpnode's rendering.
	knownDifferences := map[string]string{
		// "text"|safe + description: markupsafe escapes a plain string
		// added to a safe one, so Python writes &lt; for < in the tools'
		// descriptions; the template means the text as it is.
		"meetkai-functionary-medium-v3.1/tools offered":         "markupsafe's Markup + str",
		"meetkai-functionary-medium-v3.1/a call and its result": "markupsafe's Markup + str",
	}
	same, refused, lenient, known := 0, 0, 0, 0
	for name, src := range sources {
		tmpl, err := NewJinjaTemplate(src, bos, eos)
		if err != nil {
			t.Errorf("%s does not compile: %v", name, err)
			continue
		}
		for c, conv := range cases {
			want := ref[name+"/"+c]
			got, err := tmpl.Render(conv.msgs, conv.tools)
			switch {
			case !want.OK && err != nil:
				refused++
			case !want.OK:
				lenient++
			case err != nil:
				t.Errorf("%s, %s: dpnode refuses (%v); the reference renders %q", name, c, err, want.Text)
			case got != want.Text && knownDifferences[name+"/"+c] != "":
				known++
			case got != want.Text:
				t.Errorf("%s, %s:\n dpnode %q\nreference %q", name, c, got, want.Text)
			default:
				same++
			}
		}
	}
	t.Logf("%d templates × %d conversations: %d the same, %d refused by both, %d refused by the reference only, %d known differences", len(sources), len(cases), same, refused, lenient, known)
	if same < len(sources)*len(cases)*9/10 {
		t.Fatalf("only %d renderings were compared", same)
	}
}
