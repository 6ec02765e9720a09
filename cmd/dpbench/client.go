package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"
)

// Target is an OpenAI-compatible endpoint.
type Target struct {
	// BaseURL is the server's root, without /v1.
	BaseURL string
	Model   string
	APIKey  string
	Client  *http.Client
	// NoStream asks for whole responses: only end-to-end latency is
	// measured, and the client's own cost is least.
	NoStream bool
	// Temperature, when set, is sent with every request (0: greedy);
	// otherwise the server's default applies.
	Temperature *float64
	// Logprobs, when set, asks every request for its tokens'
	// log-probabilities and this many top ones each.
	Logprobs *int
	// Schema, when set, constrains every request's output to this JSON
	// schema (vLLM's structured_outputs).
	Schema json.RawMessage
}

// NewHTTPClient returns a client for load: connections are reused and
// never capped below the load's concurrency.
func NewHTTPClient() *http.Client {
	return &http.Client{Transport: &http.Transport{
		Proxy:               nil,
		DialContext:         (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:        0,
		MaxIdleConnsPerHost: 4096,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
	}}
}

// Outcome is how one request went. Times are from the start of the run.
type Outcome struct {
	Start time.Duration `json:"start_ms"`
	// TTFT is the time to the first chunk with text, E2E to the end of
	// the stream.
	TTFT time.Duration `json:"-"`
	E2E  time.Duration `json:"-"`
	// Gaps are the times between chunks after the first.
	Gaps         []time.Duration `json:"-"`
	PromptTokens int             `json:"prompt_tokens"`
	// CachedTokens is the prompt's part the server found in its prefix
	// cache (usage.prompt_tokens_details.cached_tokens, where it says).
	CachedTokens int    `json:"cached_tokens"`
	OutputTokens int    `json:"output_tokens"`
	Err          string `json:"error,omitempty"`
}

// DiscoverModel asks the server which model it serves.
func (t *Target) DiscoverModel(ctx context.Context) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, t.BaseURL+"/v1/models", nil)
	if err != nil {
		return "", err
	}
	t.auth(req)
	resp, err := t.Client.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return "", fmt.Errorf("GET /v1/models: %s: %s", resp.Status, bytes.TrimSpace(b))
	}
	var models struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&models); err != nil {
		return "", fmt.Errorf("GET /v1/models: %w", err)
	}
	if len(models.Data) == 0 {
		return "", errors.New("GET /v1/models: the server lists no model")
	}
	return models.Data[0].ID, nil
}

func (t *Target) auth(req *http.Request) {
	if t.APIKey != "" {
		req.Header.Set("Authorization", "Bearer "+t.APIKey)
	}
}

type completionBody struct {
	Model       string   `json:"model"`
	Prompt      []uint32 `json:"prompt"`
	MaxTokens   int      `json:"max_tokens"`
	IgnoreEOS   bool     `json:"ignore_eos"`
	Temperature *float64 `json:"temperature,omitempty"`
	Logprobs    *int     `json:"logprobs,omitempty"`
	Structured  *struct {
		JSON json.RawMessage `json:"json"`
	} `json:"structured_outputs,omitempty"`
	Stream        bool `json:"stream"`
	StreamOptions *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options,omitempty"`
}

type chunk struct {
	Choices []struct {
		Text string `json:"text"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens        int `json:"prompt_tokens"`
		CompletionTokens    int `json:"completion_tokens"`
		PromptTokensDetails *struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	} `json:"usage"`
	Error *struct {
		Message string `json:"message"`
	} `json:"error"`
}

// cached is the usage's cached prompt tokens, 0 where it does not say.
func (c *chunk) cached() int {
	if c.Usage == nil || c.Usage.PromptTokensDetails == nil {
		return 0
	}
	return c.Usage.PromptTokensDetails.CachedTokens
}

// Send streams one completion and times it; start is the run's start.
// A request that fails still reports what it measured before the failure,
// with E2E up to the failure.
func (t *Target) Send(ctx context.Context, it *Item, start time.Time) Outcome {
	sent := time.Now()
	o := Outcome{Start: sent.Sub(start), PromptTokens: len(it.Prompt)}
	req, err := t.completionRequest(ctx, it)
	if err != nil {
		return o.fail(sent, err)
	}
	resp, err := t.Client.Do(req)
	if err != nil {
		return o.fail(sent, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return o.fail(sent, statusError(resp))
	}
	if t.NoStream {
		err = o.readWhole(resp.Body, sent)
	} else {
		err = o.readStream(resp.Body, sent)
	}
	if err != nil {
		return o.fail(sent, err)
	}
	return o
}

// completionRequest is the POST of it to /v1/completions, with the
// target's options.
func (t *Target) completionRequest(ctx context.Context, it *Item) (*http.Request, error) {
	body := completionBody{Model: t.Model, Prompt: it.Prompt, MaxTokens: it.MaxTokens, IgnoreEOS: true, Temperature: t.Temperature, Logprobs: t.Logprobs, Stream: !t.NoStream}
	if t.Schema != nil {
		body.Structured = &struct {
			JSON json.RawMessage `json:"json"`
		}{t.Schema}
	}
	if body.Stream {
		body.StreamOptions = &struct {
			IncludeUsage bool `json:"include_usage"`
		}{true}
	}
	b, err := json.Marshal(body)
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, t.BaseURL+"/v1/completions", bytes.NewReader(b))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	t.auth(req)
	return req, nil
}

// statusError is the error of a response other than 200 OK: the server's
// own message where its body is an OpenAI error, else the start of the
// body.
func statusError(resp *http.Response) error {
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
	var c chunk
	if json.Unmarshal(msg, &c) == nil && c.Error != nil {
		return fmt.Errorf("%d: %s", resp.StatusCode, c.Error.Message)
	}
	return fmt.Errorf("%s: %s", resp.Status, bytes.TrimSpace(msg))
}

// fail records err as the outcome's error, ending it now, and returns the
// outcome.
func (o *Outcome) fail(sent time.Time, err error) Outcome {
	o.Err = err.Error()
	o.E2E = time.Since(sent)
	return *o
}

// readWhole reads a whole (not streamed) response into o. With no stream
// there is no first token to time apart, so TTFT is E2E.
func (o *Outcome) readWhole(body io.Reader, sent time.Time) error {
	var c chunk
	if err := json.NewDecoder(body).Decode(&c); err != nil {
		return fmt.Errorf("unreadable response: %w", err)
	}
	if c.Usage == nil || c.Usage.CompletionTokens < 1 {
		return errors.New("a response without usage or output")
	}
	o.E2E = time.Since(sent)
	o.TTFT, o.OutputTokens = o.E2E, c.Usage.CompletionTokens
	o.CachedTokens = c.cached()
	return nil
}

// readStream reads a stream of server-sent chunks into o, timing the first
// chunk with text (TTFT), the gaps between the later ones, and the end.
// A chunk without text (the usage at the end) counts in no gap.
func (o *Outcome) readStream(body io.Reader, sent time.Time) error {
	var last time.Time
	chunks := 0
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 0, 64<<10), 4<<20)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if data == "[DONE]" {
			o.E2E = time.Since(sent)
			if o.OutputTokens == 0 {
				o.OutputTokens = chunks
			}
			if chunks == 0 {
				return errors.New("the stream ended without output")
			}
			return nil
		}
		now := time.Now()
		var c chunk
		if err := json.Unmarshal([]byte(data), &c); err != nil {
			return fmt.Errorf("unreadable chunk %q: %w", data, err)
		}
		if c.Error != nil {
			return errors.New(c.Error.Message)
		}
		if c.Usage != nil {
			o.OutputTokens = c.Usage.CompletionTokens
			if c.Usage.PromptTokens > 0 {
				o.PromptTokens = c.Usage.PromptTokens
			}
			o.CachedTokens = c.cached()
		}
		if len(c.Choices) == 0 || c.Choices[0].Text == "" {
			continue
		}
		if chunks == 0 {
			o.TTFT = now.Sub(sent)
		} else {
			o.Gaps = append(o.Gaps, now.Sub(last))
		}
		last = now
		chunks++
	}
	if err := sc.Err(); err != nil {
		return err
	}
	return errors.New("the stream ended without [DONE]")
}
