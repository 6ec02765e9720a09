package openai

import (
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
)

// TestRemoteTokenizerDecodesSplitCharactersWhole decodes with a server
// whose /detokenize answers text, as llama-server's and vLLM's do: "字"
// is two tokens, each U+FFFD alone. Tokens are asked once and kept, but
// tokens among which one holds part of a character are asked together,
// and come back whole.
func TestRemoteTokenizerDecodesSplitCharactersWhole(t *testing.T) {
	vocab := map[uint32]string{1: "\xE5\xAD", 2: "\x97", 3: "ok"}
	var asked atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		asked.Add(1)
		var body struct {
			Tokens []uint32 `json:"tokens"`
		}
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
			t.Error(err)
		}
		var b strings.Builder
		for _, id := range body.Tokens {
			b.WriteString(vocab[id])
		}
		_ = json.NewEncoder(w).Encode(map[string]string{"content": strings.ToValidUTF8(b.String(), "\uFFFD")})
	}))
	defer srv.Close()
	s := &server{base: srv.URL, model: "m", http: srv.Client(), dialect: dialectLlamaServer}
	tok := newRemoteTokenizer(newPool([]*server{s}, 0), slog.New(slog.DiscardHandler))

	for _, c := range []struct {
		ids   []uint32
		want  string
		calls int32
	}{
		{[]uint32{3}, "ok", 1},
		{[]uint32{3}, "ok", 0},        // kept
		{[]uint32{1}, "\uFFFD", 1},    // part of a character, alone
		{[]uint32{2}, "\uFFFD", 1},    // the other part
		{[]uint32{3, 3}, "okok", 0},   // known and whole: from memory
		{[]uint32{3, 1, 2}, "ok字", 1}, // known, but partial: asked together
		{[]uint32{1, 2, 3}, "字ok", 1}, // every time
		{[]uint32{1}, "\uFFFD", 0},    // alone, it is what the server says
	} {
		before := asked.Load()
		if got := tok.Decode(c.ids); got != c.want {
			t.Errorf("Decode(%v) = %q, want %q", c.ids, got, c.want)
		}
		if n := asked.Load() - before; n != c.calls {
			t.Errorf("Decode(%v) asked the server %d times, want %d", c.ids, n, c.calls)
		}
	}
}
