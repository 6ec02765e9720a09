// Package openai registers the openai engine (--engine openai): each local
// rank is an OpenAI-compatible server that already runs (vLLM, SGLang,
// llama-server, or dpnode itself), one per GPU, in front of which dpnode
// balances, keeps membership and moves requests off a server that dies.
//
// A request goes to its rank's server as a prompt of token ids: the API
// server tokenized it (with the model's vocabulary, --tokenizer, or the
// servers' own /tokenize) and renders chats before it picks a rank, so
// prefix affinity and limits work as with dpnode's own engines. The
// tokens come back as the server generates them (vLLM's return_token_ids,
// llama-server's return_tokens), so that a request moved off a dead
// server continues on another from its prompt and its output so far.
package openai

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/dpnode/dpnode/engine"
	"github.com/dpnode/dpnode/engine/registry"
	"github.com/dpnode/dpnode/engines/llamaengine"
	"github.com/dpnode/dpnode/gpu"
)

// Engine is the openai engine.
var Engine = registry.Engine{
	Name:       "openai",
	Summary:    "OpenAI-compatible servers that already run, one per rank: vLLM, SGLang, llama-server, dpnode",
	NewOptions: func() registry.Options { return DefaultOptions() },
}

// Options are the openai engine's flags.
type Options struct {
	// URLs are the local ranks' servers, in rank order; one URL with
	// {local_rank} in it stands for --data-parallel-size-local of them.
	URLs []string
	// APIKey is sent to the servers as a bearer token.
	APIKey string
	// Tokenizer is a GGUF file whose vocabulary and chat template the API
	// server uses; empty: the servers' /tokenize.
	Tokenizer string
	// StallTimeout is how long a server may give no output at all while
	// requests are in flight before it counts as hung.
	StallTimeout time.Duration
	// HealthInterval is how often each server's /health is asked.
	HealthInterval time.Duration
	// StartTimeout bounds how long a rank waits for its server to serve:
	// a server started beside dpnode may still be loading its model.
	StartTimeout time.Duration
}

// DefaultOptions are the openai engine's defaults.
func DefaultOptions() *Options {
	return &Options{APIKey: os.Getenv("DPNODE_ENGINE_API_KEY"), StallTimeout: time.Minute, HealthInterval: time.Second, StartTimeout: 10 * time.Minute}
}

func (o *Options) AddFlags(fs *pflag.FlagSet) {
	fs.StringArrayVar(&o.URLs, "engine-url", nil, "openai: base URL of a local rank's server (http://host:port), once per local rank in rank order; or one URL with {local_rank} in it, for --data-parallel-size-local servers")
	fs.StringVar(&o.APIKey, "engine-api-key", o.APIKey, "openai: bearer token the servers take (default: $DPNODE_ENGINE_API_KEY)")
	fs.StringVar(&o.Tokenizer, "tokenizer", "", "openai: GGUF file of the model whose vocabulary and chat template the API server uses (default: the servers' /tokenize)")
	fs.DurationVar(&o.StallTimeout, "engine-stall-timeout", o.StallTimeout, "openai: a server that gives no output for this long while it has requests counts as hung: its requests move to other ranks")
	fs.DurationVar(&o.HealthInterval, "engine-health-interval", o.HealthInterval, "openai: how often each server's /health is asked; two failures in a row count as a dead server")
	fs.DurationVar(&o.StartTimeout, "engine-start-timeout", o.StartTimeout, "openai: how long a rank waits for its server to serve (it may be loading its model) before the node fails, naming it")
}

// Defaults of the scheduler's bounds where the servers do not say. The
// step's tokens are what the balancer counts a server's waiting prefill
// in: llama-server's default batch (and vLLM's on GPUs under 70 GiB) is
// 2,048 tokens. On Mooncake's trace in front of two llama-servers, 2,048
// took dpnode's TTFT p90 from 0.96x nginx's to 0.84x (docs/BENCHMARKS.md,
// section i); set --max-num-batched-tokens to the servers' own.
const (
	defaultMaxNumSeqs  = 256
	defaultStepTokens  = 2048
	defaultMaxModelLen = 8192
)

// prefillWeight is what a step's worth of prefill waiting at a server
// weighs in the live policy, in requests: 32, so that 64 tokens of
// waiting prompt weigh as much as one request running there, where
// dpnode's own engines use dp.DefaultPrefillWeight (8, 256 tokens). A
// server that schedules its own steps puts the waiting prompts into its
// steps beside every running sequence's decode, so a new request's first
// token comes after all the prefill queued before it; one more running
// sequence adds far less to each step. On Mooncake's trace in front of
// two llama-servers at 5/s, 7 rounds side by side, 32 against 8 gave a
// lower TTFT p90 in 6 (median 0.92x), and a lower ITL p50 and E2E p99 in
// all 7; 16 and 64 did no better than 32. At 3/s, where requests seldom
// wait, TTFT p90 was level and E2E p99 1.03-1.17x (docs/BENCHMARKS.md,
// section i).
const prefillWeight = 32

// LocalRankPattern in an --engine-url stands for the local rank.
const LocalRankPattern = "{local_rank}"

// Plan checks the flags; it contacts no server.
func (o *Options) Plan(n registry.Node) (*registry.Plan, error) {
	switch {
	case n.Model == "":
		return nil, errors.New("--engine openai needs --model: the model the servers serve, as their /v1/models lists it")
	case n.ExpertParallel:
		return nil, errors.New("--enable-expert-parallel is not available with --engine openai: each server schedules its own steps, so dpnode cannot step them in lockstep waves; run expert parallelism inside each server")
	case n.ChatTemplate != "" && o.Tokenizer == "":
		return nil, errors.New("--chat-template needs --tokenizer with --engine openai: without it the servers render chats with their own templates")
	case o.StallTimeout <= 0:
		return nil, fmt.Errorf("--engine-stall-timeout must be positive, got %v", o.StallTimeout)
	case o.HealthInterval <= 0:
		return nil, fmt.Errorf("--engine-health-interval must be positive, got %v", o.HealthInterval)
	case o.StartTimeout <= 0:
		return nil, fmt.Errorf("--engine-start-timeout must be positive, got %v", o.StartTimeout)
	}
	urls, err := o.expand(n.LocalSize)
	if err != nil {
		return nil, err
	}
	if len(urls) == 0 && o.Tokenizer == "" {
		return nil, errors.New("--engine openai needs --engine-url, once per local rank (a node with no ranks of its own needs --tokenizer instead, to tokenize)")
	}
	if n.LocalSize >= 0 && n.LocalSize != len(urls) {
		return nil, fmt.Errorf("--data-parallel-size-local %d, but %d --engine-url: with --engine openai each local rank is one server", n.LocalSize, len(urls))
	}
	var tok *llamaengine.Vocabulary
	if o.Tokenizer != "" {
		if tok, err = llamaengine.InspectVocabulary("--tokenizer", o.Tokenizer, n.ChatTemplate); err != nil {
			return nil, err
		}
	}
	sc := engine.SchedulerConfig{
		MaxNumSeqs:          orDefault(n.MaxNumSeqs, defaultMaxNumSeqs),
		MaxNumBatchedTokens: orDefault(n.MaxNumBatchedTokens, defaultStepTokens),
		MaxModelLen:         n.MaxModelLen,
		BlockSize:           16,
		EnablePrefixCaching: n.PrefixCaching,
	}
	p := &registry.Plan{
		Served:        n.Model,
		Profile:       "openai: " + n.Model,
		Scheduler:     sc,
		Capabilities:  Capabilities,
		PrefillWeight: prefillWeight,
		Devices:       make([]gpu.Device, len(urls)),
	}
	for i, u := range urls {
		p.Devices[i] = gpu.Device{Index: i, UUID: u, Name: "openai server", Virtual: true}
	}
	opts := *o
	p.Open = func(ctx context.Context, s registry.Start) (*registry.Opened, error) {
		return opts.open(ctx, s, n, urls, tok, sc)
	}
	return p, nil
}

// expand checks the URLs and expands a {local_rank} pattern; localSize is
// -1 when not given.
func (o *Options) expand(localSize int) ([]string, error) {
	urls := o.URLs
	if len(urls) == 1 && strings.Contains(urls[0], LocalRankPattern) {
		if localSize < 0 {
			return nil, fmt.Errorf("--engine-url %s needs --data-parallel-size-local: how many local ranks, and so servers, there are", urls[0])
		}
		pattern := urls[0]
		urls = make([]string, localSize)
		for i := range urls {
			urls[i] = strings.ReplaceAll(pattern, LocalRankPattern, strconv.Itoa(i))
		}
	}
	seen := make(map[string]bool)
	for i, raw := range urls {
		u, err := url.Parse(raw)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || strings.Contains(raw, LocalRankPattern) {
			return nil, fmt.Errorf("--engine-url %q is not a server's base URL (http://host:port)", raw)
		}
		base := strings.TrimSuffix(strings.TrimSuffix(u.String(), "/"), "/v1")
		if seen[base] {
			return nil, fmt.Errorf("--engine-url %s is given twice: each local rank is a server of its own", base)
		}
		seen[base] = true
		urls[i] = base
	}
	return urls, nil
}

func (o Options) open(ctx context.Context, s registry.Start, n registry.Node, urls []string, tok *llamaengine.Vocabulary, sc engine.SchedulerConfig) (*registry.Opened, error) {
	client := &http.Client{Transport: &http.Transport{
		Proxy:               http.ProxyFromEnvironment,
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConnsPerHost: 1024,
		// Under the servers' own keep-alive (5 s in uvicorn, which vLLM
		// runs, and in llama-server's cpp-httplib): a connection the
		// server closed while idle must not be taken for a request.
		IdleConnTimeout: idleConnTimeout,
	}}
	newServer := func(base string) *server { return &server{base: base, key: o.APIKey, model: n.Model, http: client} }
	op := &registry.Opened{StartTimeout: o.StartTimeout}
	// The context length is as given, else the first server's; the API
	// tokenizes with the model's vocabulary, else with the first server.
	if len(urls) > 0 && (sc.MaxModelLen == 0 || (tok == nil && s.ServesAPI)) {
		first, info, err := o.firstServing(ctx, s, newServer, urls)
		if err != nil {
			return nil, err
		}
		if sc.MaxModelLen == 0 {
			sc.MaxModelLen = info.maxModelLen
		}
		if tok == nil && s.ServesAPI {
			// Every server tokenizes, the first to serve first; the
			// others speak its dialect (a node's servers are one kind).
			servers := make([]*server, len(urls))
			for i, u := range urls {
				servers[i] = newServer(u)
				servers[i].dialect = info.dialect
			}
			p := newPool(servers, first)
			op.Tokenizer, op.Template = newRemoteTokenizer(p, s.Logger), &remoteTemplate{servers: p}
		}
	}
	if sc.MaxModelLen == 0 && tok != nil {
		sc.MaxModelLen = tok.Info.ContextLength
	}
	if sc.MaxModelLen == 0 {
		sc.MaxModelLen = defaultMaxModelLen
	}
	// The servers' KV caches are their own: the node bounds what it
	// admits by sequences, each of up to the context length.
	sc.NumBlocks = sc.MaxNumSeqs * ((sc.MaxModelLen + sc.BlockSize - 1) / sc.BlockSize)
	op.Scheduler = &sc
	if tok != nil && s.ServesAPI {
		lt, err := tok.OpenTokenizer(ctx, s.Logger)
		if err != nil {
			return nil, err
		}
		op.Tokenizer, op.Close = lt, func() { _ = lt.Close() }
		if tok.Template != nil {
			op.Template = tok.Template
		}
	}
	cfg := coreConfig{HealthInterval: o.HealthInterval, HealthTimeout: max(o.HealthInterval, 2*time.Second),
		StallTimeout: o.StallTimeout, MetricsInterval: time.Second, MaxModelLen: sc.MaxModelLen}
	op.NewCore = func(ctx context.Context, rank int, dev gpu.Device) (engine.Core, error) {
		srv := newServer(dev.UUID)
		logger := s.Logger.With("rank", rank, "url", srv.base)
		cfg := cfg
		cfg.Logger = logger
		info, err := awaitServer(ctx, srv, logger)
		if err != nil {
			return nil, err
		}
		srv.dialect = info.dialect
		if info.dialect == dialectLlamaServer && info.eosText != "" {
			if srv.eos, err = srv.tokenize(ctx, info.eosText, false); err != nil {
				return nil, fmt.Errorf("the end-of-generation token of %s: %w", srv.base, err)
			}
		}
		if info.maxModelLen > 0 && info.maxModelLen < cfg.MaxModelLen {
			logger.Warn("the server's context is shorter than the node's --max-model-len: longer requests fail on this rank", "server_max_model_len", info.maxModelLen, "max_model_len", cfg.MaxModelLen)
		}
		logger.Info("the rank's server serves", "dialect", info.dialect, "max_model_len", info.maxModelLen)
		return newCore(cfg, srv), nil
	}
	op.Describe = []any{"servers", len(urls), "tokenizer", tokenizerSource(tok)}
	return op, nil
}

func tokenizerSource(tok *llamaengine.Vocabulary) string {
	if tok != nil {
		return tok.Path
	}
	return "the servers' /tokenize"
}

// firstServing waits for the first of the servers to serve, as a model's
// load is waited for, and returns it probed.
func (o Options) firstServing(ctx context.Context, s registry.Start, newServer func(string) *server, urls []string) (int, serverInfo, error) {
	ctx, cancel := context.WithTimeout(ctx, o.StartTimeout)
	defer cancel()
	type found struct {
		i    int
		info serverInfo
		err  error
	}
	ch := make(chan found, len(urls))
	for i, u := range urls {
		go func() {
			info, err := awaitServer(ctx, newServer(u), s.Logger.With("url", u))
			ch <- found{i, info, err}
		}()
	}
	var errs []error
	for range urls {
		f := <-ch
		if f.err == nil {
			return f.i, f.info, nil
		}
		errs = append(errs, f.err)
		if errors.Is(f.err, errWrongModel) {
			return 0, serverInfo{}, f.err
		}
	}
	return 0, serverInfo{}, errors.Join(errs...)
}

// awaitServer waits until the server serves the node's model, and probes
// it: a server that does not answer is waited for (it may be loading its
// model) until ctx ends; one that serves another model, or refuses the
// key, fails at once.
func awaitServer(ctx context.Context, srv *server, logger interface{ Info(string, ...any) }) (serverInfo, error) {
	start := time.Now()
	next := time.Duration(0)
	var last error
	for {
		err := srv.health(ctx, 5*time.Second)
		if err == nil {
			info, err := srv.probe(ctx)
			var se *statusError
			switch {
			case err == nil:
				return info, nil
			case errors.Is(err, errWrongModel):
				return info, err
			case errors.As(err, &se) && (se.status == http.StatusUnauthorized || se.status == http.StatusForbidden):
				return info, fmt.Errorf("%s refused the key (--engine-api-key): %s", srv.base, se.msg)
			}
			last = err
		} else {
			last = err
		}
		if waited := time.Since(start); waited >= next && ctx.Err() == nil {
			logger.Info("waiting for the server", "waited", waited.Round(time.Second), "last_error", last)
			next = max(2*next, 5*time.Second)
		}
		select {
		case <-ctx.Done():
			return serverInfo{}, fmt.Errorf("the server at %s did not serve within %s: %w", srv.base, time.Since(start).Round(time.Second), last)
		case <-time.After(500 * time.Millisecond):
		}
	}
}

func orDefault(v, d int) int {
	if v > 0 {
		return v
	}
	return d
}

// Of returns the openai engine's options among a node's (node.Options'
// Engines).
func Of(all map[string]registry.Options) *Options { return all[Engine.Name].(*Options) }
