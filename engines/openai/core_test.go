package openai

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/dpnode/dpnode/engine"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeServer is an OpenAI-compatible server in the test: it streams the
// tokens a test gives, and fails as a test tells it to.
type fakeServer struct {
	t *testing.T
	// llama makes it speak llama-server's dialect.
	llama bool
	// tokens is what every completion streams, one event each; eos ends
	// a llama-server's stream with its end token.
	tokens []uint32
	// status, when not 200, answers completions with it.
	status atomic.Int32
	// healthy is false for a server whose /health fails.
	healthy atomic.Bool
	// hold stops streams after their first token until released.
	hold chan struct{}
	// gone, when set, is closed when a held stream's client leaves.
	gone     chan struct{}
	goneOnce sync.Once
	// drop closes the connections of this many completions before any
	// answer, as a server does to a keep-alive connection it closes.
	drop atomic.Int32
	// endHold, when set, holds the end of an OpenAI stream's response
	// after its [DONE] until closed.
	endHold chan struct{}
	// conns counts the connections the server accepted.
	conns atomic.Int32
	// textNames names the alternatives of log-probabilities by their
	// text, as a server that ignores return_tokens_as_token_ids does.
	textNames bool
	// bodies are the completions asked for.
	mu     sync.Mutex
	bodies []map[string]any
	srv    *httptest.Server
}

func newFakeServer(t *testing.T, llama bool, tokens ...uint32) *fakeServer {
	f := &fakeServer{t: t, llama: llama, tokens: tokens}
	f.status.Store(http.StatusOK)
	f.healthy.Store(true)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) {
		if !f.healthy.Load() {
			http.Error(w, `{"error":{"message":"engine dead"}}`, http.StatusInternalServerError)
		}
	})
	mux.HandleFunc("GET /v1/models", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprint(w, `{"data":[{"id":"m","max_model_len":4096}]}`)
	})
	mux.HandleFunc("GET /props", func(w http.ResponseWriter, _ *http.Request) {
		if !f.llama {
			http.NotFound(w, nil)
			return
		}
		fmt.Fprint(w, `{"default_generation_settings":{"n_ctx":4096},"eos_token":"<eos>"}`)
	})
	mux.HandleFunc("POST /tokenize", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprint(w, `{"tokens":[2]}`)
	})
	stream := func(w http.ResponseWriter, r *http.Request) {
		var body map[string]any
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
			t.Error(err)
		}
		f.mu.Lock()
		f.bodies = append(f.bodies, body)
		f.mu.Unlock()
		if f.drop.Add(-1) >= 0 {
			conn, _, err := w.(http.Hijacker).Hijack()
			if err != nil {
				t.Error(err)
				return
			}
			conn.Close()
			return
		}
		if s := int(f.status.Load()); s != http.StatusOK {
			w.WriteHeader(s)
			fmt.Fprintf(w, `{"error":{"message":"refused with %d"}}`, s)
			return
		}
		fl := w.(http.Flusher)
		for i, tok := range f.tokens {
			// Asked for log-probabilities, each token's is -(its id)/10,
			// and the alternatives are the tokens 1 and 2 below it.
			own, alt1, alt2 := -float64(tok)/10, -float64(tok-1)/10-1, -float64(tok-2)/10-2
			var ev string
			switch {
			case f.llama && body["n_probs"] != nil:
				ev = fmt.Sprintf(`{"tokens":[%d],"stop":false,"completion_probabilities":[{"id":%d,"token":"x","bytes":[120],"logprob":%g,`+
					`"top_logprobs":[{"id":%d,"token":"y","bytes":[121],"logprob":%g},{"id":%d,"token":"z","bytes":[122],"logprob":%g}]}]}`,
					tok, tok, own, tok-1, alt1, tok-2, alt2)
			case f.llama && body["timings_per_token"] == true:
				ev = fmt.Sprintf(`{"tokens":[%d],"stop":false,"timings":{"cache_n":3}}`, tok)
			case f.llama:
				ev = fmt.Sprintf(`{"tokens":[%d],"stop":false}`, tok)
			case body["logprobs"] != nil:
				name := func(id uint32) string { return fmt.Sprintf("token_id:%d", id) }
				if f.textNames {
					name = func(id uint32) string { return fmt.Sprintf("t%d", id) }
				}
				ev = fmt.Sprintf(`{"choices":[{"index":0,"text":"x","token_ids":[%d],"finish_reason":null,"logprobs":{"tokens":[%q],"token_logprobs":[%g],`+
					`"top_logprobs":[{%q:%g,%q:%g,%q:%g}]}}]}`, tok, name(tok), own, name(tok-2), alt2, name(tok), own, name(tok-1), alt1)
			default:
				ev = fmt.Sprintf(`{"choices":[{"index":0,"text":"x","token_ids":[%d],"finish_reason":null}]}`, tok)
			}
			fmt.Fprintf(w, "data: %s\n\n", ev)
			fl.Flush()
			if i == 0 && f.hold != nil {
				select {
				case <-f.hold:
				case <-r.Context().Done():
					if f.gone != nil {
						f.goneOnce.Do(func() { close(f.gone) })
					}
					return
				}
			}
		}
		if f.llama {
			fmt.Fprint(w, "data: {\"tokens\":[],\"stop\":true,\"stop_type\":\"limit\",\"timings\":{\"cache_n\":3}}\n\n")
			return
		}
		fmt.Fprint(w, "data: {\"choices\":[{\"index\":0,\"text\":\"\",\"token_ids\":[],\"finish_reason\":\"length\"}]}\n\n")
		fmt.Fprint(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"prompt_tokens_details\":{\"cached_tokens\":2}}}\n\ndata: [DONE]\n\n")
		if f.endHold != nil {
			fl.Flush()
			select {
			case <-f.endHold:
			case <-r.Context().Done():
			}
		}
	}
	mux.HandleFunc("POST /v1/completions", stream)
	mux.HandleFunc("POST /completion", stream)
	f.srv = httptest.NewUnstartedServer(mux)
	f.srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			f.conns.Add(1)
		}
	}
	f.srv.Start()
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeServer) asked() []map[string]any {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]map[string]any(nil), f.bodies...)
}

// openCore opens a rank's core on the fake server, as a node does.
func openCore(t *testing.T, f *fakeServer, cfg coreConfig) *core {
	t.Helper()
	srv := &server{base: f.srv.URL, model: "m", http: f.srv.Client()}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	info, err := awaitServer(ctx, srv, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	srv.dialect = info.dialect
	if info.dialect == dialectLlamaServer {
		if srv.eos, err = srv.tokenize(ctx, info.eosText, false); err != nil {
			t.Fatal(err)
		}
	}
	if cfg.HealthInterval == 0 {
		cfg.HealthInterval, cfg.HealthTimeout = time.Hour, time.Second
	}
	if cfg.StallTimeout == 0 {
		cfg.StallTimeout = time.Hour
	}
	cfg.MaxModelLen, cfg.Logger = info.maxModelLen, slog.New(slog.DiscardHandler)
	c := newCore(cfg, srv)
	t.Cleanup(func() { c.Close() })
	return c
}

// drive runs the core's steps as the engine actor does, until no request
// is left or a step fails, and returns the outputs.
func drive(t *testing.T, c *core) ([]engine.Output, error) {
	t.Helper()
	var outs []engine.Output
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for c.HasWork() {
		st := c.Next()
		if err := st.Run(ctx); err != nil {
			return outs, err
		}
		outs = st.Finish(outs)
	}
	return outs, nil
}

func add(t *testing.T, c *core, id string, sp engine.SamplingParams) {
	t.Helper()
	if err := c.Add(engine.NewRequest{ID: id, Prompt: []uint32{1, 2, 3}, Sampling: sp, Client: id}); err != nil {
		t.Fatal(err)
	}
}

// tokensOf gathers each request's tokens and last finish.
func tokensOf(outs []engine.Output) (map[string][]uint32, map[string]engine.FinishReason) {
	toks, fin := map[string][]uint32{}, map[string]engine.FinishReason{}
	for _, o := range outs {
		toks[o.ID] = append(toks[o.ID], o.NewTokens...)
		if o.Finish != engine.NotFinished {
			fin[o.ID] = o.Finish
		}
	}
	return toks, fin
}

func TestCoreStreamsBothDialects(t *testing.T) {
	for _, llama := range []bool{false, true} {
		t.Run(map[bool]string{false: "openai", true: "llama-server"}[llama], func(t *testing.T) {
			f := newFakeServer(t, llama, 10, 11, 12, 13)
			c := openCore(t, f, coreConfig{})
			add(t, c, "a", engine.SamplingParams{MaxTokens: 100})
			add(t, c, "b", engine.SamplingParams{MaxTokens: 2})
			// c's last token is the server's last: the node ends c
			// before the event that closes the stream.
			add(t, c, "c", engine.SamplingParams{MaxTokens: 4})
			outs, err := drive(t, c)
			if err != nil {
				t.Fatal(err)
			}
			toks, fin := tokensOf(outs)
			if fmt.Sprint(toks["a"]) != "[10 11 12 13]" || fin["a"] != engine.FinishedLength {
				t.Errorf("a: %v, finish %v; want the server's tokens, then its finish", toks["a"], fin["a"])
			}
			// max_tokens is the node's to keep, whatever the server does.
			if fmt.Sprint(toks["b"]) != "[10 11]" || fin["b"] != engine.FinishedLength {
				t.Errorf("b: %v, finish %v; want 2 tokens, then length", toks["b"], fin["b"])
			}
			// The cache hit, once a request: vLLM tells it after the
			// finish (a has it), llama-server with every token (all do).
			cached := map[string]int{}
			for _, o := range outs {
				if o.NumCachedTokens > 0 {
					cached[o.ID] += o.NumCachedTokens
				}
			}
			want := map[string]int{"a": 2}
			if llama {
				want = map[string]int{"a": 3, "b": 3, "c": 3}
			}
			if fmt.Sprint(cached) != fmt.Sprint(want) {
				t.Errorf("cached tokens %v, want the server's %v", cached, want)
			}
			if got := c.Stats().PrefixHits; got != uint64(want["a"]+want["b"]+want["c"]) {
				t.Errorf("the rank's prefix hits %d, want %d", got, want["a"]+want["b"]+want["c"])
			}
			body := f.asked()[0]
			if llama {
				if body["return_tokens"] != true || body["n_predict"] == nil {
					t.Errorf("llama-server body %v: want return_tokens and n_predict", body)
				}
			} else if body["return_token_ids"] != true || body["model"] != "m" || fmt.Sprint(body["prompt"]) != "[1 2 3]" {
				t.Errorf("openai body %v: want the model, a token-id prompt and return_token_ids", body)
			}
		})
	}
}

// TestCoreStopsOnStopTokens: a stop token ends the output with it, and a
// llama-server's end token ends it as dpnode's engines do.
func TestCoreStopsOnStopTokens(t *testing.T) {
	f := newFakeServer(t, true, 10, 2, 11)
	c := openCore(t, f, coreConfig{})
	add(t, c, "eos", engine.SamplingParams{MaxTokens: 100})
	add(t, c, "ignore", engine.SamplingParams{MaxTokens: 100, IgnoreEOS: true, StopTokenIDs: []uint32{11}})
	outs, err := drive(t, c)
	if err != nil {
		t.Fatal(err)
	}
	toks, fin := tokensOf(outs)
	if fmt.Sprint(toks["eos"]) != "[10 2]" || fin["eos"] != engine.FinishedStop {
		t.Errorf("eos: %v %v; want [10 2] and stop", toks["eos"], fin["eos"])
	}
	if fmt.Sprint(toks["ignore"]) != "[10 2 11]" || fin["ignore"] != engine.FinishedStop {
		t.Errorf("ignore: %v %v; want [10 2 11] and stop", toks["ignore"], fin["ignore"])
	}
}

// TestCoreContinuesAMovedRequest: a request that comes with output from
// another rank is sent as its prompt plus that output, for what is left.
func TestCoreContinuesAMovedRequest(t *testing.T) {
	f := newFakeServer(t, false, 10, 11, 12)
	c := openCore(t, f, coreConfig{})
	err := c.Add(engine.NewRequest{ID: "m", Prompt: []uint32{1, 2}, Output: []uint32{7, 8}, Sampling: engine.SamplingParams{MaxTokens: 4, MinTokens: 3}, Client: "x"})
	if err != nil {
		t.Fatal(err)
	}
	outs, err := drive(t, c)
	if err != nil {
		t.Fatal(err)
	}
	toks, fin := tokensOf(outs)
	if fmt.Sprint(toks["m"]) != "[10 11]" || fin["m"] != engine.FinishedLength {
		t.Errorf("got %v %v; want the two tokens left", toks["m"], fin["m"])
	}
	body := f.asked()[0]
	if fmt.Sprint(body["prompt"]) != "[1 2 7 8]" || body["max_tokens"] != 2.0 || body["min_tokens"] != 1.0 {
		t.Errorf("body %v: want prompt and output as the prompt, and the tokens left", body)
	}
}

// TestCoreRequestErrors: a refusal (4xx), or a 5xx from a server whose
// health is fine, fails the request alone with the server's message; a
// 5xx with failing health is the server's death.
func TestCoreRequestErrors(t *testing.T) {
	for _, status := range []int{http.StatusBadRequest, http.StatusInternalServerError} {
		f := newFakeServer(t, false, 10)
		c := openCore(t, f, coreConfig{})
		f.status.Store(int32(status))
		add(t, c, "r", engine.SamplingParams{MaxTokens: 5})
		outs, err := drive(t, c)
		if err != nil {
			t.Fatalf("%d: the rank failed: %v", status, err)
		}
		if len(outs) != 1 || outs[0].Finish != engine.FinishedError || !strings.Contains(outs[0].Error, fmt.Sprint("refused with ", status)) {
			t.Fatalf("%d: outputs %+v; want one error with the server's message", status, outs)
		}
		// A 4xx is the request's fault, the client's to fix; a 5xx from
		// a server whose health is fine is not.
		if outs[0].Refused != (status < 500) {
			t.Errorf("%d: refused %v", status, outs[0].Refused)
		}
	}
	f := newFakeServer(t, false, 10)
	c := openCore(t, f, coreConfig{})
	f.status.Store(http.StatusInternalServerError)
	f.healthy.Store(false)
	add(t, c, "r", engine.SamplingParams{MaxTokens: 5})
	_, err := drive(t, c)
	var ee *engineError
	if !errors.As(err, &ee) {
		t.Fatalf("a 5xx with failing health: %v; want the server's failure", err)
	}
}

// TestCoreDetectsADeadOrHungServer: failing health kills the rank, and so
// do streams that stall past the timeout.
func TestCoreDetectsADeadOrHungServer(t *testing.T) {
	t.Run("health", func(t *testing.T) {
		f := newFakeServer(t, false, 10, 11)
		f.hold = make(chan struct{})
		defer close(f.hold)
		c := openCore(t, f, coreConfig{HealthInterval: 20 * time.Millisecond, HealthTimeout: time.Second})
		add(t, c, "r", engine.SamplingParams{MaxTokens: 5})
		f.healthy.Store(false)
		if _, err := drive(t, c); err == nil || !strings.Contains(err.Error(), "stopped answering /health") {
			t.Fatalf("got %v; want the server dead by its health", err)
		}
		select {
		case <-c.Done():
		case <-time.After(5 * time.Second):
			t.Fatal("Done not closed")
		}
	})
	t.Run("stall", func(t *testing.T) {
		f := newFakeServer(t, false, 10, 11)
		f.hold = make(chan struct{})
		defer close(f.hold)
		c := openCore(t, f, coreConfig{StallTimeout: 300 * time.Millisecond})
		add(t, c, "r", engine.SamplingParams{MaxTokens: 5})
		if _, err := drive(t, c); err == nil || !strings.Contains(err.Error(), "gave no output") {
			t.Fatalf("got %v; want the server hung", err)
		}
	})
}

// TestCoreAbortEndsTheServersRequest: an aborted request's stream is
// closed, so that the server stops computing it.
func TestCoreAbortEndsTheServersRequest(t *testing.T) {
	f := newFakeServer(t, false, 10, 11)
	f.hold = make(chan struct{})
	defer close(f.hold)
	c := openCore(t, f, coreConfig{})
	add(t, c, "r", engine.SamplingParams{MaxTokens: 5})
	st := c.Next()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := st.Run(ctx); err != nil {
		t.Fatal(err)
	}
	outs := st.Finish(nil)
	if len(outs) != 1 || fmt.Sprint(outs[0].NewTokens) != "[10]" {
		t.Fatalf("outputs %+v; want the first token", outs)
	}
	c.Abort("r")
	if c.HasWork() || len(c.IDs(func(any) bool { return true })) != 0 {
		t.Fatal("the aborted request is still held")
	}
	// Close waits for every stream: it returns once the aborted one has
	// ended, which the server sees as its client gone.
	done := make(chan struct{})
	go func() { c.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the aborted stream did not end")
	}
}

// TestCoreCutsOffAStreamThatGoesOn: a request that the node ends itself
// at max_tokens, whose server holds its stream open past that token, is
// cut off drainTimeout later (its output is whole at once): the server
// sees its client leave while the core serves on.
func TestCoreCutsOffAStreamThatGoesOn(t *testing.T) {
	f := newFakeServer(t, false, 7, 8)
	f.hold, f.gone = make(chan struct{}), make(chan struct{})
	defer close(f.hold)
	c := openCore(t, f, coreConfig{})
	add(t, c, "r", engine.SamplingParams{MaxTokens: 1})
	outs, err := drive(t, c)
	if toks, fin := tokensOf(outs); err != nil || fmt.Sprint(toks["r"]) != "[7]" || fin["r"] != engine.FinishedLength {
		t.Fatalf("got %v %v %v; want [7] and length", toks, fin, err)
	}
	select {
	case <-f.gone:
	case <-time.After(10 * time.Second):
		t.Fatal("the server's stream was not cut off")
	}
}

// TestCoreRefusesWhatItCannotForward: the prompt's log-probabilities are
// not forwarded, nor a structured-output request that moved with output
// (the server's grammar would start again); saying so beats answering
// without them.
func TestCoreRefusesWhatItCannotForward(t *testing.T) {
	f := newFakeServer(t, false, 10)
	c := openCore(t, f, coreConfig{})
	for _, nr := range []engine.NewRequest{
		{Sampling: engine.SamplingParams{MaxTokens: 5, Logprobs: true, PromptLogprobs: true}},
		{Sampling: engine.SamplingParams{MaxTokens: 5, Grammar: "root ::= \"a\"+"}, Output: []uint32{64}},
	} {
		nr.ID, nr.Client, nr.Prompt = "x", "x", []uint32{1}
		if err := c.Add(nr); err == nil {
			t.Errorf("%+v accepted", nr)
		}
	}
}

// TestCoreForwardsGrammars: a structured-output request goes to the server
// with the API server's grammar, in either dialect.
func TestCoreForwardsGrammars(t *testing.T) {
	const gbnf = "root ::= \"a\"+"
	for _, llama := range []bool{false, true} {
		f := newFakeServer(t, llama, 10)
		c := openCore(t, f, coreConfig{})
		add(t, c, "g", engine.SamplingParams{MaxTokens: 5, Grammar: gbnf})
		if _, err := drive(t, c); err != nil {
			t.Fatal(err)
		}
		body := f.asked()[0]
		got := body["grammar"]
		if so, ok := body["structured_outputs"].(map[string]any); ok {
			got = so["grammar"]
		}
		if got != gbnf || (llama && body["structured_outputs"] != nil) || (!llama && body["grammar"] != nil) {
			t.Errorf("llama-server %v: body %v; want the grammar in the dialect's field", llama, body)
		}
	}
}

// TestCoreSendsAgainWhatAClosedConnectionLost: a connection closed before
// any answer, by a server whose health is fine, costs the request
// nothing; a server that keeps doing it is a failing server.
func TestCoreSendsAgainWhatAClosedConnectionLost(t *testing.T) {
	f := newFakeServer(t, false, 10, 11)
	c := openCore(t, f, coreConfig{})
	f.drop.Store(maxTries - 1)
	add(t, c, "r", engine.SamplingParams{MaxTokens: 5})
	outs, err := drive(t, c)
	if err != nil {
		t.Fatalf("the rank failed: %v", err)
	}
	if toks, fin := tokensOf(outs); fmt.Sprint(toks["r"]) != "[10 11]" || fin["r"] != engine.FinishedLength {
		t.Fatalf("got %v %v; want the whole output", toks["r"], fin["r"])
	}
	f.drop.Store(1000)
	before := len(f.asked())
	add(t, c, "s", engine.SamplingParams{MaxTokens: 5})
	var ee *engineError
	if _, err := drive(t, c); !errors.As(err, &ee) {
		t.Fatalf("got %v; want the server's failure", err)
	}
	// Each of the core's tries may be sent again once by Go's client, on
	// a fresh connection.
	if sent := len(f.asked()) - before; sent > 2*maxTries {
		t.Errorf("sent %d times; want at most %d", sent, 2*maxTries)
	}
}

// TestCoreKeepsItsConnectionsToTheServer: a server that sends the end of
// its response after the stream's last event, in a packet of its own (the
// first request), still gets the next request on the same connection: the
// core reads each response to its end. (Closed before its end, Go's client
// would close the connection, and every request would take a new one.)
func TestCoreKeepsItsConnectionsToTheServer(t *testing.T) {
	f := newFakeServer(t, false, 7, 8)
	f.endHold = make(chan struct{})
	c := openCore(t, f, coreConfig{})
	// The end is sent once the core has read [DONE].
	var once sync.Once
	c.srv.http = &http.Client{Transport: roundTripper(func(req *http.Request) (*http.Response, error) {
		resp, err := f.srv.Client().Transport.RoundTrip(req)
		if err == nil && req.URL.Path == "/v1/completions" {
			resp.Body = &watchBody{ReadCloser: resp.Body, saw: "[DONE]", then: func() { once.Do(func() { close(f.endHold) }) }}
		}
		return resp, err
	})}
	var conns []int32
	for i := range 3 {
		// The server ends the output, not max_tokens: the finish comes
		// after the stream's end.
		add(t, c, fmt.Sprint("r", i), engine.SamplingParams{MaxTokens: 3})
		outs, err := drive(t, c)
		if toks, fin := tokensOf(outs); err != nil || fmt.Sprint(toks[fmt.Sprint("r", i)]) != "[7 8]" || fin[fmt.Sprint("r", i)] != engine.FinishedLength {
			t.Fatalf("request %d: %v %v %v", i, toks, fin, err)
		}
		conns = append(conns, f.conns.Load())
	}
	if conns[1] != conns[0] || conns[2] != conns[0] {
		t.Fatalf("the server accepted connections %v after each request: the next requests took new ones", conns)
	}
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// watchBody calls then once a read has returned saw.
type watchBody struct {
	io.ReadCloser
	saw  string
	then func()
}

func (b *watchBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if strings.Contains(string(p[:n]), b.saw) {
		b.then()
	}
	return n, err
}

// TestCoreForwardsLogprobs asks both dialects for log-probabilities: the
// drawn tokens' come back with their alternatives, most likely first
// (vLLM's are a map, named by token id: the node asks for the names), and
// a server that names its alternatives by text fails the request, which
// the node could not read.
func TestCoreForwardsLogprobs(t *testing.T) {
	for _, llama := range []bool{false, true} {
		t.Run(map[bool]string{false: "openai", true: "llama-server"}[llama], func(t *testing.T) {
			f := newFakeServer(t, llama, 10, 11, 12)
			c := openCore(t, f, coreConfig{})
			add(t, c, "a", engine.SamplingParams{MaxTokens: 2, Logprobs: true, TopLogprobs: 2})
			outs, err := drive(t, c)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, o := range outs {
				if len(o.Logprobs) != len(o.NewTokens) {
					t.Fatalf("output %+v: %d log-probabilities for %d tokens", o, len(o.Logprobs), len(o.NewTokens))
				}
				for i, lp := range o.Logprobs {
					got = append(got, fmt.Sprintf("%d:%g %v %v", o.NewTokens[i], lp.Logprob, lp.TopTokenIds, lp.TopLogprobs))
				}
			}
			// vLLM's alternatives hold the drawn token; llama-server's
			// are the ones asked for.
			want := "[10:-1 [10 9 8] [-1 -1.9 -2.8] 11:-1.1 [11 10 9] [-1.1 -2 -2.9]]"
			if llama {
				want = "[10:-1 [9 8] [-1.9 -2.8] 11:-1.1 [10 9] [-2 -2.9]]"
			}
			if fmt.Sprint(got) != want {
				t.Errorf("log-probabilities %v\nwant %v", got, want)
			}
			body := f.asked()[0]
			if llama && fmt.Sprint(body["n_probs"]) != "2" {
				t.Errorf("llama-server body %v: want n_probs 2", body)
			}
			if !llama && (fmt.Sprint(body["logprobs"]) != "2" || body["return_tokens_as_token_ids"] != true) {
				t.Errorf("openai body %v: want logprobs 2, named by token id", body)
			}
		})
	}
	t.Run("names by text", func(t *testing.T) {
		f := newFakeServer(t, false, 10, 11)
		f.textNames = true
		c := openCore(t, f, coreConfig{})
		add(t, c, "a", engine.SamplingParams{MaxTokens: 2, Logprobs: true, TopLogprobs: 1})
		outs, err := drive(t, c)
		if err != nil || len(outs) != 1 || outs[0].Finish != engine.FinishedError || !strings.Contains(outs[0].Error, "return_tokens_as_token_ids") {
			t.Fatalf("%+v %v; want the request failed, saying why", outs, err)
		}
	})
}
