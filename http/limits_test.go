package httpapi

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dpnode/dpnode/actors"
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
