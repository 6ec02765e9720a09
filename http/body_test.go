package httpapi

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dpnode/dpnode/actors"
	"github.com/dpnode/dpnode/engine/sim"
)

// endless serves head, then elem over and over, counting what it served.
type endless struct {
	head, elem string
	served     atomic.Int64
	pending    string
}

func (e *endless) Read(p []byte) (int, error) {
	if e.pending == "" {
		e.pending = e.elem
		if e.served.Load() == 0 {
			e.pending = e.head
		}
	}
	n := copy(p, e.pending)
	e.pending = e.pending[n:]
	e.served.Add(int64(n))
	return n, nil
}

func newBodyServer(t *testing.T, inFlight int64) *Server {
	t.Helper()
	s, err := New(Config{Backend: viewBackend{&actors.ClusterView{}}, Tokenizer: sim.NewTokenizer(0), ChatTemplate: Llama3Template{},
		MaxModelLen: 1000, Gatherer: prometheus.NewRegistry(), MaxBodyBytesInFlight: inFlight})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestHostileBodiesAreRefusedWhileRead: a body whose list passes its limit,
// or whose lists nest past what decoding may allocate, is refused having
// read little more than the list's limit, where before the whole 16 MiB
// was read and decoded (a struct for every one of millions of {}).
func TestHostileBodiesAreRefusedWhileRead(t *testing.T) {
	s := newBodyServer(t, 0)
	for _, tc := range []struct {
		name, head, elem, param string
		// most bounds the bytes read: the limit's worth of elements and a
		// read's chunk.
		most int64
	}{
		{"messages", `{"messages":[`, `{},`, "messages", 3*maxMessages + 64<<10},
		{"content parts", `{"messages":[{"role":"user","content":[`, `{"type":"text","text":"x"},`, "messages", 27*maxContentParts + 64<<10},
		{"stop token ids", `{"prompt":"x","stop_token_ids":[`, `1,`, "stop_token_ids", 2*maxStopTokenIDs + 64<<10},
		{"logit_bias", `{"prompt":"x","logit_bias":{`, `"1":1,`, "logit_bias", 6*maxLogitBias + 64<<10},
		{"nested lists", `{"messages":[{"role":"user","content":"x","extra":[`, `[{},{}],`, "", 7*maxBodyContainers/3 + 64<<10},
		{"deep nesting", `{"response_format":`, `[`, "response_format", maxBodyDepth + 64<<10},
		{"unknown field's list", `{"prompt":"x","whatever":[`, `0,`, "whatever", 2*maxBodyList + 64<<10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body := &endless{head: tc.head, elem: tc.elem}
			var v chatRequest
			r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", body)
			e := s.decode(httptest.NewRecorder(), r, &v, chatFields)
			if e == nil || e.Status != http.StatusBadRequest || (tc.param != "" && (e.Param == nil || *e.Param != tc.param)) {
				t.Fatalf("got %+v; want 400 naming %q", e, tc.param)
			}
			if n := body.served.Load(); n > tc.most {
				t.Fatalf("read %d bytes of the body before refusing it; want at most %d", n, tc.most)
			}
			if s.bodies.used.Load() != 0 {
				t.Fatalf("%d bytes of the refused body still count as in flight", s.bodies.used.Load())
			}
		})
	}
	// Within the limits, a body decodes as before.
	var v chatRequest
	ok := `{"messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}],"stop":["a"],"logit_bias":{"1":2}}`
	if e := s.decode(httptest.NewRecorder(), httptest.NewRequest(http.MethodPost, "/", strings.NewReader(ok)), &v, chatFields); e != nil {
		t.Fatalf("a plain body: %+v", e)
	}
	if len(v.Messages) != 1 || v.LogitBias["1"] != 2 {
		t.Fatalf("decoded %+v", v)
	}
}

// blockingBody serves its bytes, then waits for release before its end.
type blockingBody struct {
	data    *strings.Reader
	release chan struct{}
}

func (b *blockingBody) Read(p []byte) (int, error) {
	if b.data.Len() == 0 {
		<-b.release
		return 0, io.EOF
	}
	return b.data.Read(p)
}

// TestBodiesInFlightCountAgainstAdmission: while bodies being read hold
// the bytes the server allows, another is refused with 503 and
// Retry-After; once they are read, bodies are taken again.
func TestBodiesInFlightCountAgainstAdmission(t *testing.T) {
	s := newBodyServer(t, 1<<20)
	prompt := func(n int) string { return `{"prompt":"` + strings.Repeat("a", n) + `"}` }
	slow := &blockingBody{data: strings.NewReader(prompt(700 << 10)), release: make(chan struct{})}
	done := make(chan *apiError, 1)
	go func() {
		var v completionRequest
		done <- s.decode(httptest.NewRecorder(), httptest.NewRequest(http.MethodPost, "/", slow), &v, completionFields)
	}()
	deadline := time.Now().Add(10 * time.Second)
	for s.bodies.used.Load() < 700<<10 {
		if time.Now().After(deadline) {
			t.Fatal("the slow body was not read")
		}
		time.Sleep(time.Millisecond)
	}
	var v completionRequest
	rec := httptest.NewRecorder()
	e := s.decode(rec, httptest.NewRequest(http.MethodPost, "/", strings.NewReader(prompt(400<<10))), &v, completionFields)
	if e == nil || e.Status != http.StatusServiceUnavailable || rec.Header().Get("Retry-After") == "" {
		t.Fatalf("a body past the bytes in flight: %+v; want 503 with Retry-After", e)
	}
	close(slow.release)
	if e := <-done; e != nil {
		t.Fatalf("the slow body: %+v", e)
	}
	if e := s.decode(httptest.NewRecorder(), httptest.NewRequest(http.MethodPost, "/", strings.NewReader(prompt(400<<10))), &v, completionFields); e != nil {
		t.Fatalf("a body once the others were read: %+v", e)
	}
	if n := s.bodies.used.Load(); n != 0 {
		t.Fatalf("%d bytes still count as in flight", n)
	}
}
