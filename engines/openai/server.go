package openai

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// dialect is how a server takes a prompt of token ids and gives back the
// token ids it generates.
type dialect int

const (
	// dialectOpenAI is /v1/completions with a token-id prompt and vLLM's
	// return_token_ids: vLLM, and dpnode itself.
	dialectOpenAI dialect = iota
	// dialectLlamaServer is llama-server's own /completion with
	// return_tokens: its OpenAI routes give no token ids.
	dialectLlamaServer
)

func (d dialect) String() string {
	if d == dialectLlamaServer {
		return "llama-server"
	}
	return "openai"
}

// server is one OpenAI-compatible server, as a rank or a tokenizer sees it.
//
// Concurrency: safe for concurrent use.
type server struct {
	// base is the URL without a trailing slash.
	base string
	key  string
	// model is the model the node serves, which the server must list.
	model   string
	http    *http.Client
	dialect dialect
	// eos is the end-of-generation token of a llama-server, which its
	// streams end with; the token the node ends a stopped output with.
	eos []uint32
}

// statusError is a server's answer other than 200.
type statusError struct {
	url    string
	status int
	msg    string
}

func (e *statusError) Error() string {
	return fmt.Sprintf("%s answered %d: %s", e.url, e.status, e.msg)
}

// idleConnTimeout is how long a connection to a server may stay idle
// before it is closed: under the 5 s after which uvicorn (vLLM) and
// cpp-httplib (llama-server) close it themselves.
const idleConnTimeout = 4 * time.Second

// maxErrorBody bounds what is read of an error's body.
const maxErrorBody = 4 << 10

// request sends a request with the server's key; body, when not nil, is
// sent as JSON. A status other than 200 is a *statusError. A POST says it
// may be sent again (X-Idempotency-Key): Go's client then resends it on a
// fresh connection when the server closed the one it took before reading
// the request, instead of failing it as a dead server's.
func (s *server) request(ctx context.Context, method, path string, body any) (*http.Response, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, s.base+path, rd)
	if err != nil {
		return nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Idempotency-Key", idempotencyKey())
	}
	if s.key != "" {
		req.Header.Set("Authorization", "Bearer "+s.key)
	}
	resp, err := s.http.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		defer resp.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
		return nil, &statusError{url: s.base + path, status: resp.StatusCode, msg: errorMessage(b)}
	}
	return resp, nil
}

// call sends a request and decodes its JSON answer into out.
func (s *server) call(ctx context.Context, method, path string, body, out any) error {
	resp, err := s.request(ctx, method, path, body)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(io.LimitReader(resp.Body, 64<<20)).Decode(out); err != nil {
		return fmt.Errorf("%s%s: %w", s.base, path, err)
	}
	return nil
}

// errorMessage is the message of an error body: OpenAI's error object,
// llama-server's, or the text itself.
func errorMessage(b []byte) string {
	var e struct {
		Error struct {
			Message string `json:"message"`
		} `json:"error"`
		Message string `json:"message"`
	}
	if json.Unmarshal(b, &e) == nil {
		if e.Error.Message != "" {
			return e.Error.Message
		}
		if e.Message != "" {
			return e.Message
		}
	}
	return strings.TrimSpace(string(b))
}

// health asks the server whether it serves: /health answers 200 once the
// model is loaded (vLLM, llama-server and dpnode alike).
func (s *server) health(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	resp, err := s.request(ctx, http.MethodGet, "/health", nil)
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxErrorBody))
	resp.Body.Close()
	return nil
}

// modelList is /v1/models.
type modelList struct {
	Data []struct {
		ID          string `json:"id"`
		MaxModelLen int    `json:"max_model_len"`
	} `json:"data"`
}

// serverInfo is what a server says of itself once it serves.
type serverInfo struct {
	dialect dialect
	// maxModelLen is the longest sequence it serves, 0 when it does not
	// say.
	maxModelLen int
	// eosText is a llama-server's end-of-generation token as text.
	eosText string
}

// probe checks that the server serves the node's model and learns its
// dialect and context length.
func (s *server) probe(ctx context.Context) (serverInfo, error) {
	var info serverInfo
	var models modelList
	if err := s.call(ctx, http.MethodGet, "/v1/models", nil, &models); err != nil {
		return info, err
	}
	var ids []string
	found := false
	for _, m := range models.Data {
		ids = append(ids, m.ID)
		if m.ID == s.model {
			found, info.maxModelLen = true, m.MaxModelLen
		}
	}
	if !found {
		return info, fmt.Errorf("%w: the server at %s serves %s, not %s (--model)", errWrongModel, s.base, strings.Join(ids, ", "), s.model)
	}
	// llama-server answers /props; vLLM and dpnode do not.
	var props struct {
		Settings *struct {
			NCtx int `json:"n_ctx"`
		} `json:"default_generation_settings"`
		EOSToken string `json:"eos_token"`
	}
	err := s.call(ctx, http.MethodGet, "/props", nil, &props)
	var se *statusError
	switch {
	case err == nil && props.Settings != nil:
		info.dialect, info.eosText = dialectLlamaServer, props.EOSToken
		if info.maxModelLen == 0 {
			info.maxModelLen = props.Settings.NCtx
		}
	case err == nil, errors.As(err, &se) && se.status == http.StatusNotFound:
		info.dialect = dialectOpenAI
	default:
		return info, err
	}
	return info, nil
}

// errWrongModel is a server that serves another model than the node's:
// starting again does not help.
var errWrongModel = errors.New("wrong model")

// keys numbers the requests of this process for X-Idempotency-Key.
var keys atomic.Uint64

func idempotencyKey() string { return "dpnode-" + strconv.FormatUint(keys.Add(1), 36) }
