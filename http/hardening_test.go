package httpapi_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/dpnode/dpnode/actors"
	httpapi "github.com/dpnode/dpnode/http"
	"github.com/dpnode/dpnode/node"
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
	ts := startServer(t, 1, func(o *node.Options) {
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
	ts := startServer(t, 1, func(o *node.Options) { o.HTTPTimeouts = timeouts })
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
	ts := startServer(t, 0, func(o *node.Options) { o.GPUs = 1 })
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

// TestClientThatReadsNothingIsDropped: one socket with a small receive
// buffer asks for every slot of the server, streamed or whole, and reads
// nothing. Within the write timeout its request is aborted and its
// connection closed, and other clients are served again.
func TestClientThatReadsNothingIsDropped(t *testing.T) {
	ts := startServer(t, 0, func(o *node.Options) {
		o.GPUs, o.MaxNumSeqs, o.MaxPendingRequests = 1, 128, 0
		o.HTTPTimeouts.Write = 3 * time.Second
	})
	for _, tc := range []struct{ name, body string }{
		{"stream", `{"prompt":"x","n":128,"max_tokens":4000,"ignore_eos":true,"stream":true}`},
		{"whole", `{"prompt":"x","n":128,"max_tokens":8000,"ignore_eos":true,"return_token_ids":true}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
				var serr error
				err := c.Control(func(fd uintptr) { serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) })
				return errors.Join(err, serr)
			}}
			hog, err := d.Dial("tcp", ts.run.Addr())
			if err != nil {
				t.Fatal(err)
			}
			defer hog.Close()
			if _, err := fmt.Fprintf(hog, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
				apiKey, len(tc.body), tc.body); err != nil {
				t.Fatal(err)
			}
			// The hog holds all 128 slots until it is dropped: before the
			// write timeout, every other call got 503 for as long as the
			// socket stayed open. Its requests are seen at the ranks before
			// any other call is sent, which would take a slot from it.
			eventually(t, "the hog's 128 requests are in flight", func() bool {
				var view actors.ClusterView
				if ts.getJSON(t, "/v1/cluster", &view) != http.StatusOK {
					return false
				}
				n := 0
				for _, r := range view.Ranks {
					n += r.InFlight
				}
				return n == 128
			})
			within(t, time.Minute, "another client is served", func() bool {
				status, _ := ts.post(t, "/v1/completions", `{"prompt":"y","max_tokens":1}`, nil)
				return status == http.StatusOK
			})
			// Its connection was closed without the response's end.
			_ = hog.SetReadDeadline(time.Now().Add(10 * time.Second))
			got, err := io.ReadAll(hog)
			if err != nil && !errors.Is(err, syscall.ECONNRESET) {
				t.Fatalf("reading what the hog was sent: %v", err)
			}
			if strings.Contains(string(got), "data: [DONE]") || strings.HasSuffix(string(got), "}") {
				t.Fatalf("the hog was sent its whole response (%d bytes): it was not dropped", len(got))
			}
		})
	}
}

// TestConnectionCap: with --max-connections 8, silent connections past
// the cap are closed to make room (a client that connects sends its
// request at once) and /health answers; with every connection busy in a
// request, /health and /metrics answer on the reserve, other routes get
// 503, and no more than the cap and the reserve stay open.
func TestConnectionCap(t *testing.T) {
	const capped = 8
	ts := startServer(t, 1, func(o *node.Options) { o.MaxConnections = capped })
	dial := func() net.Conn {
		c, err := net.Dial("tcp", ts.run.Addr())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	// closed reports whether the server closed c: a read ends at once.
	closed := func(c net.Conn) bool {
		_ = c.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
		_, err := c.Read(make([]byte, 1))
		return err != nil && !errors.Is(err, os.ErrDeadlineExceeded)
	}
	silent := make([]net.Conn, 100)
	for i := range silent {
		silent[i] = dial()
	}
	// A fresh client still gets /health.
	fresh := &http.Client{Transport: &http.Transport{}}
	defer fresh.CloseIdleConnections()
	getStatus := func(c *http.Client, path string) int {
		t.Helper()
		resp, err := c.Get(ts.base + path)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp.StatusCode
	}
	if code := getStatus(fresh, "/health"); code != http.StatusOK {
		t.Fatalf("/health past the cap: %d", code)
	}
	open := 0
	for _, c := range silent {
		if !closed(c) {
			open++
		}
	}
	if open > capped {
		t.Fatalf("%d silent connections of 100 stay open; the cap is %d", open, capped)
	}

	// Every connection busy: 8 streams in progress.
	for i := range capped {
		c := dial()
		body := `{"prompt":"x","max_tokens":2000,"ignore_eos":true,"stream":true}`
		fmt.Fprintf(c, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", apiKey, len(body), body)
		r := bufio.NewReader(c)
		if line, err := r.ReadString('\n'); err != nil || !strings.Contains(line, "200") {
			t.Fatalf("stream %d: %q %v", i, line, err)
		}
	}
	reserve := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	for _, path := range []string{"/health", "/metrics"} {
		if code := getStatus(reserve, path); code != http.StatusOK {
			t.Fatalf("%s with every connection busy: %d", path, code)
		}
	}
	if status, body := ts.post(t, "/v1/completions", `{"prompt":"y","max_tokens":1}`, nil); status != http.StatusServiceUnavailable {
		t.Fatalf("a completion with every connection busy: %d %s", status, body)
	}
	ts.http.CloseIdleConnections()
}
