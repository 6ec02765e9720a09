package httpapi

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dpnode/dpnode/actors"
	"github.com/dpnode/dpnode/engine"
	"github.com/dpnode/dpnode/engine/sim"
)

// boundedTokenizer is the simulated tokenizer with a bound on the text of
// a token, as a real vocabulary has, that counts its calls.
type boundedTokenizer struct {
	*sim.Tokenizer
	encodes atomic.Int64
}

func (b *boundedTokenizer) MaxTokenBytes() int { return 8 }

func (b *boundedTokenizer) Encode(text string, addSpecial bool) ([]uint32, error) {
	b.encodes.Add(1)
	return b.Tokenizer.Encode(text, addSpecial)
}

// TestTextTooLongForTheContextIsNotTokenized: a prompt with more bytes
// than the context's tokens can stand for is refused before the
// tokenizer, which every call shares, spends any time on it.
func TestTextTooLongForTheContextIsNotTokenized(t *testing.T) {
	tok := &boundedTokenizer{Tokenizer: sim.NewTokenizer(0)}
	s, err := New(Config{Backend: viewBackend{&actors.ClusterView{}}, Tokenizer: tok, ChatTemplate: Llama3Template{},
		MaxModelLen: 100, Gatherer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	long := strings.Repeat("a", 8*100+1)
	for path, body := range map[string]string{
		"/v1/completions":      `{"prompt":"` + long + `"}`,
		"/v1/chat/completions": `{"messages":[{"role":"user","content":"` + long[:500] + `"},{"role":"user","content":"` + long[500:] + `"}]}`,
	} {
		rec := httptest.NewRecorder()
		s.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodPost, path, strings.NewReader(body)))
		if rec.Code != http.StatusBadRequest || !strings.Contains(rec.Body.String(), "context") {
			t.Errorf("%s: %d %s; want 400", path, rec.Code, rec.Body)
		}
	}
	if n := tok.encodes.Load(); n != 0 {
		t.Fatalf("the tokenizer ran %d times on texts that cannot fit", n)
	}
}

// TestContentPartsTakeLinearWork: a message of many text parts is joined
// with memory linear in its text (once quadratic: each part copied the
// text so far), and a message of more parts than the cap is refused.
func TestContentPartsTakeLinearWork(t *testing.T) {
	part := `{"type":"text","text":"` + strings.Repeat("x", 100) + `"},`
	body := []byte("[" + strings.Repeat(part, maxContentParts-1) + part[:len(part)-1] + "]")
	var c contentField
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	if err := json.Unmarshal(body, &c); err != nil {
		t.Fatal(err)
	}
	runtime.ReadMemStats(&after)
	if len(c.text) != 100*maxContentParts {
		t.Fatalf("joined %d bytes, want %d", len(c.text), 100*maxContentParts)
	}
	// Decoding copies the body a few times; joining the quadratic way
	// copies the text so far once a part, 1,600 times the body here. The
	// margin leaves room for whatever else the process allocates meanwhile.
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 64*uint64(len(body)) {
		t.Fatalf("decoding %d bytes of content allocated %d bytes", len(body), alloc)
	}
	tooMany := []byte("[" + strings.Repeat(part, maxContentParts) + part[:len(part)-1] + "]")
	if err := json.Unmarshal(tooMany, &c); err == nil || !strings.Contains(err.Error(), "at most 4096") {
		t.Fatalf("%d parts: %v", maxContentParts+1, err)
	}
}

// busyTokenizer refuses every call as a tokenizer past its queue does.
type busyTokenizer struct{ *sim.Tokenizer }

func (busyTokenizer) Encode(string, bool) ([]uint32, error) {
	return nil, fmt.Errorf("%w: its queue is full", engine.ErrTokenizerBusy)
}

// TestABusyTokenizerIsOverload: a call the tokenizer has no room for is a
// 503 to retry shortly, as past the server's request limit, not a
// tokenizer that is down.
func TestABusyTokenizerIsOverload(t *testing.T) {
	s, err := New(Config{Backend: viewBackend{&actors.ClusterView{}}, Tokenizer: busyTokenizer{sim.NewTokenizer(0)}, ChatTemplate: Llama3Template{},
		MaxModelLen: 100, Gatherer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	for path, body := range map[string]string{
		"/v1/completions":      `{"prompt":"x"}`,
		"/v1/chat/completions": `{"messages":[{"role":"user","content":"x"}]}`,
		"/tokenize":            `{"prompt":"x"}`,
	} {
		rec := httptest.NewRecorder()
		s.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodPost, path, strings.NewReader(body)))
		if rec.Code != http.StatusServiceUnavailable || rec.Header().Get("Retry-After") != "1" || !strings.Contains(rec.Body.String(), `"code":"overloaded"`) {
			t.Errorf("%s: %d %s %q; want 503 overloaded with Retry-After", path, rec.Code, rec.Body, rec.Header().Get("Retry-After"))
		}
	}
}
