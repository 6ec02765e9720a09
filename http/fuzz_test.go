package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dpnode/dpnode/actors"
	"github.com/dpnode/dpnode/actors/actorstest"
	"github.com/dpnode/dpnode/dp"
)

// fuzzMaxModelLen is the context length of the fuzzed server: small, so
// that every request the fuzzer makes valid (n up to 128, max_tokens up to
// the context) finishes in milliseconds on the zero-cost executor.
const fuzzMaxModelLen = 128

// fuzzRequestBound is how long one fuzzed request may take. Far above what
// the largest valid request costs here; a request past it is a hang.
const fuzzRequestBound = 20 * time.Second

// newFuzzServer starts one in-process node, two ranks of the simulated 8B
// profile on the zero-cost executor, and a Server in front of it, as
// node.Start wires them (the engines' context length is the server's).
// It lives until the fuzz target ends: starting a node per input would
// cost more than the input.
func newFuzzServer(f *testing.F) (*Server, *actors.Node) {
	f.Helper()
	node, tok := actorstest.StartSimNode(f, actorstest.Config{Model: "fuzz-model", Topology: dp.Topology{Size: 2, LocalSize: 2}, MaxModelLen: fuzzMaxModelLen})
	f.Cleanup(node.Stop)
	s, err := New(Config{Backend: node, Tokenizer: tok, ChatTemplate: Llama3Template{}, MaxModelLen: fuzzMaxModelLen,
		Gatherer: prometheus.NewRegistry(), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		f.Fatal(err)
	}
	return s, node
}

// fuzzPost sends body to path and returns the response, failing the test
// when the handler outlives fuzzRequestBound (a handler that ignores its
// request's context), or when the request needed its context's deadline
// to end (a generation that would not finish).
func fuzzPost(t *testing.T, s *Server, path string, body []byte) *httptest.ResponseRecorder {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), fuzzRequestBound)
	defer cancel()
	req := httptest.NewRequest(http.MethodPost, path, bytes.NewReader(body)).WithContext(ctx)
	req.Header.Set("Content-Type", "application/json")
	rec := httptest.NewRecorder()
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.Handler().ServeHTTP(rec, req)
	}()
	select {
	case <-done:
	case <-time.After(fuzzRequestBound + 10*time.Second):
		buf := make([]byte, 1<<20)
		t.Fatalf("the handler did not return %v after the request's deadline; body %q\n%s",
			10*time.Second, body, buf[:runtime.Stack(buf, true)])
	}
	if ctx.Err() != nil {
		t.Fatalf("the request did not finish within %v; body %q; status %d", fuzzRequestBound, body, rec.Code)
	}
	return rec
}

// checkFuzzResponse checks what any body may get: never a server error,
// an OpenAI error object with every 4xx, and a well-formed completion or
// event stream with every 200.
func checkFuzzResponse(t *testing.T, body []byte, rec *httptest.ResponseRecorder, object string) {
	t.Helper()
	out := rec.Body.Bytes()
	if rec.Code >= 500 {
		t.Fatalf("status %d for body %q: %s", rec.Code, body, out)
	}
	if rec.Code >= 400 {
		var e struct {
			Error *struct {
				Message *string `json:"message"`
				Type    *string `json:"type"`
			} `json:"error"`
		}
		if err := json.Unmarshal(out, &e); err != nil || e.Error == nil || e.Error.Message == nil || *e.Error.Message == "" || e.Error.Type == nil {
			t.Fatalf("status %d without an OpenAI error object (%v) for body %q: %s", rec.Code, err, body, out)
		}
		if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
			t.Fatalf("status %d with content type %q", rec.Code, ct)
		}
		return
	}
	if rec.Code != http.StatusOK {
		t.Fatalf("status %d for body %q: %s", rec.Code, body, out)
	}
	if rec.Header().Get("Content-Type") == "text/event-stream" {
		events, err := parseSSE(out)
		if err != nil {
			t.Fatalf("a malformed event stream for body %q: %v\n%s", body, err, out)
		}
		for _, ev := range events {
			var chunk struct {
				Object  string          `json:"object"`
				Choices json.RawMessage `json:"choices"`
				Error   json.RawMessage `json:"error"`
			}
			if err := json.Unmarshal(ev, &chunk); err != nil {
				t.Fatalf("event %s does not decode: %v", ev, err)
			}
			if chunk.Error != nil {
				// An error after the stream started: only a server error
				// can come so late, and none is expected here.
				t.Fatalf("the stream for body %q ended with an error: %s", body, ev)
			}
			if chunk.Object != object+".chunk" && !(object == "text_completion" && chunk.Object == object) {
				t.Fatalf("event of object %q in a %s stream: %s", chunk.Object, object, ev)
			}
		}
		return
	}
	var resp struct {
		Object  string            `json:"object"`
		Choices []json.RawMessage `json:"choices"`
		Usage   *struct {
			TotalTokens int `json:"total_tokens"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(out, &resp); err != nil || resp.Object != object || len(resp.Choices) == 0 || resp.Usage == nil {
		t.Fatalf("a 200 that is not a %s (%v) for body %q: %s", object, err, body, out)
	}
}

// parseSSE splits an event stream into the JSON of its data events,
// checking the framing: every event is one "data: " line and a blank
// line, and the last is [DONE].
func parseSSE(out []byte) ([][]byte, error) {
	if !bytes.HasSuffix(out, []byte("data: [DONE]\n\n")) {
		return nil, fmt.Errorf("the stream does not end with data: [DONE]")
	}
	var events [][]byte
	rest := out
	for len(rest) > 0 {
		i := bytes.Index(rest, []byte("\n\n"))
		if i < 0 {
			return nil, fmt.Errorf("an event without its blank line: %q", rest)
		}
		ev := rest[:i]
		rest = rest[i+2:]
		data, ok := bytes.CutPrefix(ev, []byte("data: "))
		if !ok {
			return nil, fmt.Errorf("an event that is not a data line: %q", ev)
		}
		if bytes.ContainsAny(data, "\r\n") {
			return nil, fmt.Errorf("an event of more than one line: %q", ev)
		}
		if string(data) == "[DONE]" {
			if len(rest) > 0 {
				return nil, fmt.Errorf("events after [DONE]: %q", rest)
			}
			break
		}
		if !json.Valid(data) {
			return nil, fmt.Errorf("an event that is not JSON: %q", data)
		}
		events = append(events, data)
	}
	return events, nil
}

// commonFuzzSeeds are bodies both endpoints get: broken JSON and wrong
// types, which are refused the same way by either.
var commonFuzzSeeds = []string{
	``,
	`{`,
	`null`,
	`[]`,
	`"x"`,
	`123`,
	`{}`,
	`{"model":null}`,
	`{"model":7}`,
	`{"n":"two"}`,
	`{"max_tokens":1e400}`,
	`{"max_tokens":9223372036854775808}`,
	`{"temperature":"hot"}`,
	`{"seed":-9223372036854775808}`,
	`{"stream_options":{"include_usage":true}}`,
	"{\"model\":\"\xff\xfe\"}",
	`{"stop":[1,2]}`,
	`{"stop_token_ids":[-1]}`,
	`{"stop_token_ids":[4294967296]}`,
	`{} {}`,
	`{"a":` + strings.Repeat(`[`, 10000) + strings.Repeat(`]`, 10000) + `}`,
}

func FuzzChatCompletions(f *testing.F) {
	seeds := []string{
		`{"model":"fuzz-model","messages":[{"role":"user","content":"Explain data parallelism."}],"max_tokens":8}`,
		`{"messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"hi"}],"max_completion_tokens":3,"temperature":0}`,
		`{"messages":[{"role":"user","content":[{"type":"text","text":"part one "},{"type":"text","text":"part two"}]}],"max_tokens":4}`,
		`{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"http://x"}}]}]}`,
		`{"messages":[{"role":"user","content":null}],"max_tokens":2}`,
		`{"messages":[{"role":"user","content":"hi"}],"stream":true,"stream_options":{"include_usage":true},"max_tokens":5}`,
		`{"messages":[{"role":"user","content":"hi"}],"stream":true,"n":3,"max_tokens":4,"return_token_ids":true}`,
		`{"messages":[{"role":"user","content":"tell me about the cluster"}],"stop":["the","."],"max_tokens":30,"stream":true}`,
		`{"messages":[{"role":"user","content":"tell me about the cluster"}],"stop":"the","include_stop_str_in_output":true,"max_tokens":30}`,
		`{"messages":[{"role":"user","content":"a"}],"stop_token_ids":[16,17,18],"ignore_eos":true,"max_tokens":20}`,
		`{"messages":[{"role":"user","content":"a"}],"n":128,"max_tokens":1}`,
		`{"messages":[{"role":"user","content":"a"}],"n":129}`,
		`{"messages":[{"role":"user","content":"a"}],"n":0}`,
		`{"messages":[{"role":"user","content":"a"}],"n":-1}`,
		`{"messages":[{"role":"user","content":"a"}],"max_tokens":0}`,
		`{"messages":[{"role":"user","content":"a"}],"max_tokens":2147483647}`,
		`{"messages":[{"role":"user","content":"a"}],"max_tokens":-9223372036854775808}`,
		`{"messages":[{"role":"user","content":"a"}],"min_tokens":5,"max_tokens":2}`,
		`{"messages":[{"role":"user","content":"a"}],"min_tokens":9223372036854775807}`,
		`{"messages":[{"role":"user","content":"a"}],"top_p":0,"top_k":-2,"temperature":-1}`,
		`{"messages":[{"role":"user","content":"a"}],"top_k":1,"top_p":1,"temperature":2,"seed":42,"max_tokens":3}`,
		`{"messages":[{"role":"user","content":"a"}],"logprobs":true}`,
		`{"messages":[{"role":"user","content":"a"}],"stop":[""]}`,
		`{"messages":[{"role":"wizard","content":"a"}]}`,
		`{"messages":[]}`,
		`{"messages":{}}`,
		`{"messages":[{"role":"user","content":"` + strings.Repeat("word ", 200) + `"}]}`,
		`{"messages":[{"role":"user","content":"\u0000\ud800\uffff<|eot_id|><|start_header_id|>"}],"max_tokens":2}`,
		`{"messages":[{"role":"assistant","content":"é🦙"},{"role":"tool","content":"x","name":"n"}],"max_tokens":2,"stream":true}`,
		`{"model":"gpt-4o","messages":[{"role":"user","content":"a"}]}`,
		`{"messages":[{"role":"user","content":"a"}],"stream":false,"stream_options":null,"max_tokens":1,"user":"u","logit_bias":{"1":2}}`,
	}
	for _, s := range append(seeds, commonFuzzSeeds...) {
		f.Add([]byte(s))
	}
	s, _ := newFuzzServer(f)
	f.Fuzz(func(t *testing.T, body []byte) {
		rec := fuzzPost(t, s, "/v1/chat/completions", body)
		checkFuzzResponse(t, body, rec, "chat.completion")
	})
}

func FuzzCompletions(f *testing.F) {
	seeds := []string{
		`{"model":"fuzz-model","prompt":"The cluster has four ranks and","max_tokens":12}`,
		`{"prompt":["a","b","c"],"max_tokens":3,"n":2}`,
		`{"prompt":[16,17,18,19],"max_tokens":3,"return_token_ids":true}`,
		`{"prompt":[[16,17],[18,19,20]],"max_tokens":2,"echo":true}`,
		`{"prompt":[4294967295,128256,0,1,2],"max_tokens":2}`,
		`{"prompt":[4294967296],"max_tokens":2}`,
		`{"prompt":[-1],"max_tokens":2}`,
		`{"prompt":[[]],"max_tokens":2}`,
		`{"prompt":[],"max_tokens":2}`,
		`{"prompt":[""],"max_tokens":2}`,
		`{"prompt":"","max_tokens":2}`,
		`{"prompt":null}`,
		`{"prompt":{}}`,
		`{"prompt":[1.5]}`,
		`{"prompt":["a",1]}`,
		`{"prompt":[[1],"a"]}`,
		`{"prompt":[null]}`,
		`{"prompt":"x","stream":true,"stream_options":{"include_usage":true},"max_tokens":4,"echo":true}`,
		`{"prompt":"tell me a story","stop":["the","and"],"max_tokens":40,"stream":true,"n":2}`,
		`{"prompt":"tell me a story","stop":"\n","max_tokens":40,"include_stop_str_in_output":true}`,
		`{"prompt":"x","stop_token_ids":[16,17,18],"ignore_eos":true,"max_tokens":30,"return_token_ids":true,"stream":true}`,
		`{"prompt":"x","logprobs":1}`,
		`{"prompt":"x","logprobs":0,"suffix":"","max_tokens":1}`,
		`{"prompt":"x","suffix":"y"}`,
		`{"prompt":"x","max_tokens":0}`,
		`{"prompt":"x","max_tokens":127}`,
		`{"prompt":"x","max_tokens":128}`,
		`{"prompt":"x","min_tokens":3,"max_tokens":3,"ignore_eos":false}`,
		`{"prompt":["a","b"],"n":6917529027641081856}`,
		`{"prompt":["a","b","c","d"],"n":4611686018427387904}`,
		`{"prompt":"x","n":128,"max_tokens":1}`,
		`{"prompt":"` + strings.Repeat("a ", 127) + `","max_tokens":1}`,
		`{"prompt":"\ud83e\udd99 and \u00e9","max_tokens":3,"stream":true}`,
		"{\"prompt\":\"\xf0\x9f\xa6\",\"max_tokens\":2}",
	}
	for _, s := range append(seeds, commonFuzzSeeds...) {
		f.Add([]byte(s))
	}
	s, _ := newFuzzServer(f)
	f.Fuzz(func(t *testing.T, body []byte) {
		rec := fuzzPost(t, s, "/v1/completions", body)
		checkFuzzResponse(t, body, rec, "text_completion")
	})
}

// jsonText is what a JSON string encoded by encoding/json decodes to:
// the text itself, with every byte that is not part of a valid UTF-8
// sequence replaced by U+FFFD (one per byte, not one per run as
// strings.ToValidUTF8 does).
func jsonText(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	var b strings.Builder
	for len(s) > 0 {
		r, n := utf8.DecodeRuneInString(s)
		if r == utf8.RuneError && n == 1 {
			b.WriteRune(utf8.RuneError)
		} else {
			b.WriteString(s[:n])
		}
		s = s[n:]
	}
	return b.String()
}

// FuzzSSEWriter writes arbitrary text through the SSE writer, as chat
// chunks carry it: each event must stay one data line whatever the text
// holds, decode back to the text, and the stream must end with [DONE].
// The same text is then streamed as a choice's output, cut where cuts
// say, with stop as a stop string: what the client reassembles from the
// events is the text up to the stop string, and no event of valid text
// carries part of a character.
func FuzzSSEWriter(f *testing.F) {
	f.Add("hello", []byte{2}, "")
	f.Add("", []byte{}, "")
	f.Add("line one\nline two\r\n\r\ndata: [DONE]\n\n", []byte{3, 9}, "\n\n")
	f.Add("data: {\"x\":1}\n\ndata: [DONE]", []byte{1}, "DONE")
	f.Add(" 🦙 and é!", []byte{1, 1, 1, 4, 1, 1}, "")
	f.Add("ok \xf0\x9f", []byte{3}, "")
	f.Add("\xff\xfe\x80 \xc3", []byte{1, 1}, "\xc3")
	f.Add("\u2028\u2029<script>&amp;\"\\\x00\x1f\x7f", []byte{5}, "&")
	f.Add("é€ then END more", []byte{1, 2, 3}, "END")
	f.Add("éé", []byte{1}, "\xa9")
	f.Fuzz(func(t *testing.T, text string, cuts []byte, stop string) {
		// Every piece on its own, straight through the writer.
		pieces := cutText(text, cuts)
		rec := httptest.NewRecorder()
		out := newSSEWriter(rec, time.Second)
		for _, p := range pieces {
			out.data(chatChunk{ID: "chatcmpl-fuzz", Object: "chat.completion.chunk", Model: "m",
				Choices: []chatChunkChoice{{Delta: chatDelta{Content: &p}}}})
		}
		out.done()
		got := decodeChunks(t, rec)
		if len(got) != len(pieces) {
			t.Fatalf("%d events for %d pieces", len(got), len(pieces))
		}
		for i, p := range pieces {
			if got[i] != jsonText(p) {
				t.Fatalf("event %d decodes to %q, want %q", i, got[i], jsonText(p))
			}
		}

		// The same pieces as a choice's output.
		var stops []string
		if stop != "" {
			stops = []string{stop}
		}
		rec = httptest.NewRecorder()
		out = newSSEWriter(rec, time.Second)
		c := &choice{}
		var sent []string
		for _, p := range pieces {
			c.done = c.addText(p, stops, false)
			if s := c.pending(stops); s != "" || c.done {
				sent = append(sent, s)
				out.data(chatChunk{Choices: []chatChunkChoice{{Delta: chatDelta{Content: &s}}}})
			}
			if c.done {
				break
			}
		}
		if !c.done {
			c.done = true
			s := c.pending(stops)
			sent = append(sent, s)
			out.data(chatChunk{Choices: []chatChunkChoice{{Delta: chatDelta{Content: &s}}}})
		}
		out.done()
		want := text
		if i := strings.Index(text, stop); stop != "" && i >= 0 {
			want = text[:i]
		}
		if joined := strings.Join(sent, ""); joined != want {
			t.Fatalf("the choice sent %q, want %q", joined, want)
		}
		got = decodeChunks(t, rec)
		if joined := strings.Join(got, ""); joined != jsonText(want) {
			t.Fatalf("the client reassembles %q, want %q", joined, jsonText(want))
		}
		if utf8.ValidString(text) {
			for i, s := range sent[:len(sent)-1] {
				if !utf8.ValidString(s) {
					t.Fatalf("event %d carries part of a character: %q", i, s)
				}
			}
		}
	})
}

// cutText cuts text into pieces of the lengths cuts give (each taken
// modulo 8, 0 meaning the rest), the last piece being what is left.
func cutText(text string, cuts []byte) []string {
	var pieces []string
	for _, c := range cuts {
		n := int(c % 8)
		if n == 0 || n >= len(text) {
			break
		}
		pieces = append(pieces, text[:n])
		text = text[n:]
	}
	return append(pieces, text)
}

// decodeChunks parses an event stream of chat chunks and returns the
// content of each.
func decodeChunks(t *testing.T, rec *httptest.ResponseRecorder) []string {
	t.Helper()
	if ct := rec.Header().Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("content type %q", ct)
	}
	raw, _ := io.ReadAll(rec.Body)
	events, err := parseSSE(raw)
	if err != nil {
		t.Fatalf("%v\n%q", err, raw)
	}
	var contents []string
	for _, ev := range events {
		var chunk chatChunk
		if err := json.Unmarshal(ev, &chunk); err != nil {
			t.Fatalf("event %s: %v", ev, err)
		}
		if len(chunk.Choices) != 1 || chunk.Choices[0].Delta.Content == nil {
			t.Fatalf("event %s has no content", ev)
		}
		contents = append(contents, *chunk.Choices[0].Delta.Content)
	}
	return contents
}
