package httpapi_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dpnode/dpnode/cluster"
	httpapi "github.com/dpnode/dpnode/http"
)

// TestListsOverTheirLimitsAreRefused sends each list a hostile client
// could make unbounded, over its limit: 400, at once, and the server
// keeps serving.
func TestListsOverTheirLimitsAreRefused(t *testing.T) {
	ts := startServer(t, 0)
	ids := func(n, from int) string {
		var b strings.Builder
		for i := range n {
			if i > 0 {
				b.WriteByte(',')
			}
			fmt.Fprint(&b, from+i%1000)
		}
		return b.String()
	}
	strs := func(n int, s string) string {
		return strings.TrimSuffix(strings.Repeat(`"`+s+`",`, n), ",")
	}
	bias := func(n int) string {
		var b strings.Builder
		for i := range n {
			if i > 0 {
				b.WriteByte(',')
			}
			fmt.Fprintf(&b, `"%d":1`, i)
		}
		return b.String()
	}
	msgs := strings.TrimSuffix(strings.Repeat(`{"role":"user","content":"hi"},`, 2049), ",")
	cases := []struct{ name, path, body, param string }{
		// Three million ids fit in the 16 MiB body.
		{"3M stop token ids", "/v1/completions", `{"prompt":"x","max_tokens":1,"stop_token_ids":[` + ids(3_000_000, 1) + `]}`, "stop_token_ids"},
		{"1025 stop token ids", "/v1/completions", `{"prompt":"x","max_tokens":1,"stop_token_ids":[` + ids(1025, 1) + `]}`, "stop_token_ids"},
		{"33 stop strings", "/v1/completions", `{"prompt":"x","max_tokens":1,"stop":[` + strs(33, "s") + `]}`, "stop"},
		{"a stop string of 1025 bytes", "/v1/completions", `{"prompt":"x","max_tokens":1,"stop":"` + strings.Repeat("s", 1025) + `"}`, "stop"},
		{"2049 messages", "/v1/chat/completions", `{"max_tokens":1,"messages":[` + msgs + `]}`, "messages"},
		{"129 prompts", "/v1/completions", `{"max_tokens":1,"prompt":[` + strs(129, "p") + `]}`, "prompt"},
		{"1025 logit_bias entries", "/v1/completions", `{"prompt":"x","max_tokens":1,"logit_bias":{` + bias(1025) + `}}`, "logit_bias"},
		{"logit_bias out of the vocabulary", "/v1/completions", `{"prompt":"x","max_tokens":1,"logit_bias":{"128256":1}}`, "logit_bias"},
		{"logit_bias out of range", "/v1/completions", `{"prompt":"x","max_tokens":1,"logit_bias":{"1":101}}`, "logit_bias"},
		{"prompt token out of the vocabulary", "/v1/completions", `{"prompt":[1,2,128256],"max_tokens":1}`, "prompt"},
		{"stop token out of the vocabulary", "/v1/completions", `{"prompt":"x","max_tokens":1,"stop_token_ids":[4000000000]}`, "stop_token_ids"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			status, body := ts.post(t, tc.path, tc.body, nil)
			var e struct {
				Error struct {
					Message string  `json:"message"`
					Param   *string `json:"param"`
				} `json:"error"`
			}
			if status != 400 || json.Unmarshal(body, &e) != nil || e.Error.Param == nil || *e.Error.Param != tc.param {
				t.Fatalf("%d %.300s; want 400 naming %s", status, body, tc.param)
			}
		})
	}
	// At the limits, and with the neutral values clients send by default,
	// requests are served.
	for _, body := range []string{
		`{"prompt":"x","max_tokens":2,"stop_token_ids":[` + ids(1024, 1) + `],"stop":[` + strs(32, strings.Repeat("z", 1024)) + `],"logit_bias":{}}`,
		`{"prompt":"x","max_tokens":2,"logit_bias":null,"stop":null,"stop_token_ids":null}`,
		`{"prompt":"x","max_tokens":2,"logit_bias":{` + bias(1024) + `}}`,
	} {
		if status, resp := ts.post(t, "/v1/completions", body, nil); status != 200 {
			t.Fatalf("%d %.300s", status, resp)
		}
	}
}

// TestOverloadSheds503sAndStaysResponsive fills the server to its limit
// with requests that do not end on their own, then sends ten times its
// capacity at once: every one of those is refused with 503, Retry-After
// and an OpenAI error, counted in a metric, while /health and /metrics
// answer 200 throughout. Once the long requests go, new ones are served.
func TestOverloadSheds503sAndStaysResponsive(t *testing.T) {
	const ranks, seqs = 2, 2
	const capacity = ranks * seqs // --max-pending-requests 0: none wait
	ts := startServer(t, 1, func(o *cluster.Options) {
		o.GPUs, o.MaxNumSeqs, o.MaxNumBatchedTokens, o.MaxPendingRequests = ranks, seqs, 64, 0
	})
	long := `{"prompt":"a long story","max_tokens":20000,"ignore_eos":true,"stream":true}`
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var held []io.ReadCloser
	for range capacity {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, ts.base+"/v1/completions", strings.NewReader(long))
		req.Header.Set("Authorization", "Bearer "+apiKey)
		resp, err := ts.http.Do(req)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("a request within capacity: %v %v", err, resp)
		}
		held = append(held, resp.Body)
	}

	stop := make(chan struct{})
	probes := make(chan string, 1000)
	var probing sync.WaitGroup
	for _, path := range []string{"/health", "/metrics"} {
		probing.Add(1)
		go func() {
			defer probing.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				resp, err := ts.http.Get(ts.base + path)
				if err != nil {
					probes <- fmt.Sprintf("%s: %v", path, err)
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 {
					probes <- fmt.Sprintf("%s: %d", path, resp.StatusCode)
				}
				time.Sleep(5 * time.Millisecond)
			}
		}()
	}

	const burst = 10 * capacity
	type result struct {
		status     int
		retryAfter string
		body       []byte
	}
	results := make(chan result, burst)
	var wg sync.WaitGroup
	for range burst {
		wg.Go(func() {
			req, _ := http.NewRequest(http.MethodPost, ts.base+"/v1/completions", strings.NewReader(`{"prompt":"one more","max_tokens":5}`))
			req.Header.Set("Authorization", "Bearer "+apiKey)
			resp, err := ts.http.Do(req)
			if err != nil {
				results <- result{status: -1, body: []byte(err.Error())}
				return
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			results <- result{resp.StatusCode, resp.Header.Get("Retry-After"), b}
		})
	}
	wg.Wait()
	close(stop)
	probing.Wait()
	close(results)
	close(probes)
	for p := range probes {
		t.Errorf("a probe failed during the burst: %s", p)
	}
	for r := range results {
		var e struct {
			Error struct {
				Code string `json:"code"`
			} `json:"error"`
		}
		if r.status != 503 || r.retryAfter == "" || json.Unmarshal(r.body, &e) != nil || e.Error.Code != "overloaded" {
			t.Fatalf("a request past capacity: %d, Retry-After %q, %.200s; want 503 overloaded", r.status, r.retryAfter, r.body)
		}
	}
	if n := ts.metric(t, "dpnode_http_requests_rejected_total", map[string]string{"reason": "overloaded"}); n != burst {
		t.Fatalf("%v rejections counted, want %d", n, burst)
	}

	cancel()
	for _, b := range held {
		b.Close()
	}
	eventually(t, "the long requests end and new ones are served", func() bool {
		status, _ := ts.post(t, "/v1/completions", `{"prompt":"after","max_tokens":2}`, nil)
		return status == 200
	})
}

// TestSlowClientsAreCutOff: a client that trickles its headers or its body,
// or keeps a connection idle, loses it within the timeouts; a generation
// that streams for longer than the read timeout is not cut.
func TestSlowClientsAreCutOff(t *testing.T) {
	timeouts := httpapi.Timeouts{ReadHeader: 300 * time.Millisecond, Read: 600 * time.Millisecond, Idle: 300 * time.Millisecond}
	ts := startServer(t, 1, func(o *cluster.Options) { o.HTTPTimeouts = timeouts })
	// closedWithin sends what, then reads until the server closes the
	// connection, which must happen within limit.
	closedWithin := func(t *testing.T, what string, limit time.Duration) {
		t.Helper()
		c, err := net.Dial("tcp", ts.run.Addr())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		start := time.Now()
		if _, err := io.WriteString(c, what); err != nil {
			t.Fatal(err)
		}
		_ = c.SetReadDeadline(start.Add(limit + 5*time.Second))
		_, err = io.Copy(io.Discard, c)
		if took := time.Since(start); err != nil || took > limit+5*time.Second {
			t.Fatalf("the server held the connection for %v (read: %v)", took, err)
		}
	}
	t.Run("slow headers", func(t *testing.T) {
		closedWithin(t, "POST /v1/completions HTTP/1.1\r\nHost: x\r\n", timeouts.ReadHeader)
	})
	t.Run("slow body", func(t *testing.T) {
		closedWithin(t, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "+apiKey+
			"\r\nContent-Length: 1000\r\n\r\n{\"prompt\":", timeouts.Read)
	})
	t.Run("a body shorter than declared", func(t *testing.T) {
		body := `{"prompt":"x","max_tokens":1}`
		closedWithin(t, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "+apiKey+
			fmt.Sprintf("\r\nContent-Length: %d\r\n\r\n", len(body)+10)+body, timeouts.Read)
	})
	t.Run("idle connection", func(t *testing.T) {
		closedWithin(t, "GET /version HTTP/1.1\r\nHost: x\r\n\r\n", timeouts.Idle)
	})
	t.Run("long stream", func(t *testing.T) {
		// 200 decode steps of the 8B profile, slept in real time: longer
		// than the read timeout.
		req, _ := http.NewRequest(http.MethodPost, ts.base+"/v1/completions",
			strings.NewReader(`{"prompt":"a story","max_tokens":200,"ignore_eos":true,"stream":true}`))
		req.Header.Set("Authorization", "Bearer "+apiKey)
		start := time.Now()
		resp, err := ts.http.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		last := ""
		for sc.Scan() {
			if sc.Text() != "" {
				last = sc.Text()
			}
		}
		if last != "data: [DONE]" {
			t.Fatalf("the stream ended after %v with %q, not [DONE] (%v)", time.Since(start), last, sc.Err())
		}
		if took := time.Since(start); took < timeouts.Read {
			t.Fatalf("the stream took %v, less than the read timeout: lengthen it", took)
		}
	})
}

// TestCacheSaltKeepsTenantsApart: cached_tokens tells a client only of
// prefixes sent under its own cache_salt. On one rank, a tenant's prompt
// is a miss for another salt and for none, and a hit for its own, found by
// the block hashes the balancer computed and handed to the engine.
func TestCacheSaltKeepsTenantsApart(t *testing.T) {
	ts := startServer(t, 0, func(o *cluster.Options) { o.GPUs = 1 })
	prompt := strings.Repeat("a system prompt only tenant a has sent ", 20)
	cached := func(salt string) int {
		t.Helper()
		body := fmt.Sprintf(`{"prompt":%q,"max_tokens":1`, prompt)
		if salt != "" {
			body += fmt.Sprintf(`,"cache_salt":%q`, salt)
		}
		status, resp := ts.post(t, "/v1/completions", body+"}", nil)
		var r struct {
			Usage struct {
				PromptTokensDetails struct {
					CachedTokens int `json:"cached_tokens"`
				} `json:"prompt_tokens_details"`
			} `json:"usage"`
		}
		if status != 200 || json.Unmarshal(resp, &r) != nil {
			t.Fatalf("%d %s", status, resp)
		}
		return r.Usage.PromptTokensDetails.CachedTokens
	}
	if n := cached("tenant-a"); n != 0 {
		t.Fatalf("the first request hit %d cached tokens", n)
	}
	if n := cached("tenant-b"); n != 0 {
		t.Fatalf("tenant b hit %d tokens of tenant a's prompt", n)
	}
	if n := cached(""); n != 0 {
		t.Fatalf("a request without a salt hit %d tokens of tenant a's prompt", n)
	}
	if n := cached("tenant-a"); n < 100 {
		t.Fatalf("tenant a's own prompt hit %d cached tokens; want its blocks", n)
	}
	if status, body := ts.post(t, "/v1/completions", `{"prompt":"x","cache_salt":""}`, nil); status != 400 {
		t.Fatalf("an empty cache_salt: %d %s", status, body)
	}
}
