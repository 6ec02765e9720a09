package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"mime"
	"net/http"
	"net/http/pprof"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/dpnode/dpnode/actors"
	"github.com/dpnode/dpnode/dp"
	"github.com/dpnode/dpnode/engine"
	"github.com/dpnode/dpnode/http/jsonlimit"
	"github.com/dpnode/dpnode/http/toolcall"
)

// Backend is the node the server hands requests to.
//
// Concurrency: safe for concurrent use; every handler calls it.
type Backend interface {
	Model() string
	Topology() dp.Topology
	Submit(*actors.Submission)
	Abort(id string)
	// Finished records how a request ended for its client.
	Finished(actors.Outcome)
	View(ctx context.Context) (*actors.ClusterView, error)
}

var _ Backend = (*actors.Node)(nil)

// Config sets up a Server.
type Config struct {
	Backend   Backend
	Tokenizer engine.Tokenizer
	// ChatTemplate renders chat requests; nil refuses them (a model
	// without a template).
	ChatTemplate ChatTemplate
	// MaxModelLen bounds prompt plus output, as the engines do; requests
	// beyond it are refused before they reach an engine.
	MaxModelLen int
	// APIKeys, when not nil, are required as a bearer token on /v1 routes.
	APIKeys *Keys
	// AdminKeys, when not nil, are required on the /admin routes and Go's
	// profiles (/debug/pprof); without them those routes are off. The API
	// keys never open them: a client of the API cannot drain a node.
	AdminKeys *Keys
	// MaxRequests bounds the requests (choices) in flight through this
	// server; past it new calls get 503 with Retry-After instead of
	// queueing without bound. 0 means no bound.
	MaxRequests int
	// Registerer receives the server's own metrics.
	Registerer prometheus.Registerer
	// MaxBodyBytes bounds a request body. 16 MiB holds a prompt of the
	// longest context lengths served today with room to spare.
	MaxBodyBytes int64
	// WriteTimeout bounds each write of a response (Timeouts.Write); 0
	// takes DefaultTimeouts'.
	WriteTimeout time.Duration
	// MaxBodyBytesInFlight bounds the bytes of all the request bodies
	// being read and decoded at once; past it a call gets 503 with
	// Retry-After, as past MaxRequests. 0 means 16 bodies of the largest
	// size.
	MaxBodyBytesInFlight int64
	// Gatherer is what /metrics exposes.
	Gatherer prometheus.Gatherer
	// OnDrain is called by POST /admin/drain: the node drains and exits.
	OnDrain func()
	// OnLeave is called by POST /admin/leave: the node drains, gives its
	// ranks back (an elastic deployment shrinks), and exits.
	OnLeave func()
	// MetricsOnly serves only /metrics, /health and /v1/cluster (and the
	// debug routes of a chaos build): a headless node's metrics port.
	MetricsOnly bool
	// SimulatedEngine says the ranks run the simulated executor, whose
	// text is deterministic: sampling fields the llama.cpp engine refuses
	// are accepted, and the refusals of the others name the engine.
	SimulatedEngine bool
	// Engine names the ranks' engine (--engine), and EngineLacks what it
	// cannot do: the fields that need it are refused, naming the engine.
	Engine      string
	EngineLacks Lacks
	// ToolCallParser reads tool calls from the output in a model family's
	// syntax (toolcall.Parsers: llama3_json, hermes, mistral), as vLLM's
	// --tool-call-parser; "" reads none, and tool_choice required or a
	// named function then use vLLM's own formats.
	ToolCallParser string
	// ContentAsText tokenizes the messages' content as text: the text of
	// a special token in it stays text (chat only; the template's own
	// special tokens are read as such). Off, as in vLLM, the whole
	// rendered prompt is read with its special tokens, the users' included.
	ContentAsText bool
	// AutoToolChoice lets the model choose to call tools (tool_choice
	// auto, the default with tools), as vLLM's --enable-auto-tool-choice:
	// it needs a ToolCallParser.
	AutoToolChoice bool
	// ModelAliases are more names a request may ask for the model by;
	// /v1/models lists them after the model's own.
	ModelAliases []string
	// LogRequests logs one line per finished request, at info
	// (--enable-log-requests): its id, rank, token counts, times, finish
	// reason and moves, never its text.
	LogRequests bool
	Version     string
	// Build adds what the build says of itself to /version (revision,
	// modified, go).
	Build  map[string]string
	Logger *slog.Logger
}

// DefaultMaxBodyBytes is Config.MaxBodyBytes's default.
const DefaultMaxBodyBytes = 16 << 20

// Server serves the OpenAI API of one node.
type Server struct {
	cfg      Config
	created  int64
	router   chi.Router
	draining atomic.Bool
	// inFlight counts the requests admitted and not yet finished.
	inFlight atomic.Int64
	rejected *prometheus.CounterVec
	// authFailed counts calls refused for their key, by the routes they
	// called ("api" or "admin"); authLog keeps their log lines to a few a
	// second under a flood of guesses.
	authFailed *prometheus.CounterVec
	authLog    logLimiter
	// bodies holds the bytes of the request bodies being read; bodyLimits
	// bounds each body's lists.
	bodies        bodyBudget
	bodyLimits    *jsonlimit.Checker
	unknownFields unknownFields
	// checkedGrammars are grammars the engine has parsed.
	checkedGrammars grammarSet
}

// SetDraining makes the server refuse new requests (503) and report
// /health as draining, while the requests in flight finish.
func (s *Server) SetDraining() { s.draining.Store(true) }

// New checks cfg and builds the routes.
func New(cfg Config) (*Server, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, created: time.Now().Unix()}
	s.bodies.limit = cfg.MaxBodyBytesInFlight
	s.bodyLimits = jsonlimit.NewChecker(s.limitsOfBodies())
	if err := s.registerMetrics(); err != nil {
		return nil, err
	}
	s.router = s.routes()
	return s, nil
}

// withDefaults checks cfg and fills in what it leaves to the defaults.
func (cfg Config) withDefaults() (Config, error) {
	switch {
	case cfg.Backend == nil:
		return cfg, errors.New("httpapi: a backend is required")
	case cfg.Tokenizer == nil && !cfg.MetricsOnly:
		return cfg, errors.New("httpapi: a tokenizer is required")
	case cfg.MaxModelLen < 2:
		return cfg, fmt.Errorf("httpapi: max model length %d is too small", cfg.MaxModelLen)
	case cfg.Gatherer == nil:
		return cfg, errors.New("httpapi: a metrics gatherer is required")
	case cfg.MaxRequests < 0:
		return cfg, fmt.Errorf("httpapi: the most requests in flight must not be negative, got %d", cfg.MaxRequests)
	case cfg.ToolCallParser != "" && !slices.Contains(toolcall.Parsers(), cfg.ToolCallParser):
		return cfg, fmt.Errorf("httpapi: unknown tool-call parser %q: it must be one of %s", cfg.ToolCallParser, strings.Join(toolcall.Parsers(), ", "))
	case cfg.AutoToolChoice && cfg.ToolCallParser == "":
		return cfg, errors.New("httpapi: automatic tool choice needs a tool-call parser")
	}
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if cfg.MaxBodyBytesInFlight <= 0 {
		cfg.MaxBodyBytesInFlight = 16 * cfg.MaxBodyBytes
	}
	if cfg.WriteTimeout <= 0 {
		cfg.WriteTimeout = DefaultTimeouts().Write
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return cfg, nil
}

// registerMetrics makes the server's own series, with a zero for each
// label, and registers them.
func (s *Server) registerMetrics() error {
	cfg := s.cfg
	s.rejected = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "dpnode_http_requests_rejected_total",
		Help: "Calls refused before any work was done for them: overloaded (503, past --max-pending-requests) or draining (503).",
	}, []string{"reason"})
	s.authFailed = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "dpnode_http_auth_failures_total",
		Help: "Calls refused for a missing or wrong bearer token, by the routes called: api (/v1, /tokenize) or admin (/admin, /debug).",
	}, []string{"routes"})
	for _, l := range []string{"overloaded", "draining"} {
		s.rejected.WithLabelValues(l)
	}
	for _, l := range []string{"api", "admin"} {
		s.authFailed.WithLabelValues(l)
	}
	if cfg.Registerer != nil && !cfg.MetricsOnly {
		for _, c := range []prometheus.Collector{s.rejected, s.authFailed} {
			if err := cfg.Registerer.Register(c); err != nil {
				return fmt.Errorf("httpapi: registering metrics: %w", err)
			}
		}
		if err := cfg.APIKeys.Observe(cfg.Logger, cfg.Registerer); err != nil {
			return err
		}
	}
	return nil
}

// routes is the server's table of routes.
func (s *Server) routes() chi.Router {
	cfg := s.cfg
	r := chi.NewRouter()
	r.Use(s.recoverer)
	r.NotFound(func(w http.ResponseWriter, r *http.Request) {
		writeError(w, &apiError{Status: http.StatusNotFound, Message: fmt.Sprintf("no route for %s %s", r.Method, r.URL.Path), Type: "not_found_error"})
	})
	r.MethodNotAllowed(func(w http.ResponseWriter, r *http.Request) {
		writeError(w, &apiError{Status: http.StatusMethodNotAllowed, Message: fmt.Sprintf("method %s is not allowed on %s", r.Method, r.URL.Path), Type: "invalid_request_error"})
	})
	r.Get("/health", s.health)
	// vLLM's /ping, which some platforms probe: /health by another name.
	r.Get("/ping", s.health)
	r.Post("/ping", s.health)
	r.Get("/version", s.version)
	r.Handle("/metrics", promhttp.HandlerFor(cfg.Gatherer, promhttp.HandlerOpts{}))
	s.debugRoutes(r)
	// Go's profiles, for the admin: CPU, heap, allocations, goroutines.
	r.With(s.adminOnly).Route("/debug/pprof", func(r chi.Router) {
		r.Get("/cmdline", pprof.Cmdline)
		r.Get("/profile", pprof.Profile)
		r.Get("/symbol", pprof.Symbol)
		r.Get("/trace", pprof.Trace)
		r.Get("/*", pprof.Index)
	})
	// A headless node's operator drains it, or takes it out, on its
	// metrics port.
	r.With(s.adminOnly).Post("/admin/drain", s.drain)
	r.With(s.adminOnly).Post("/admin/leave", s.leave)
	// The cluster page carries no data: its requests for it carry the key.
	r.Get("/cluster", s.clusterPage)
	if cfg.MetricsOnly {
		r.With(s.authenticate).Get("/v1/cluster", s.cluster)
		return r
	}
	r.Group(func(r chi.Router) {
		r.Use(s.authenticate)
		r.Get("/v1/models", s.models)
		r.Get("/v1/models/*", s.model)
		r.Post("/tokenize", s.tokenize)
		r.Post("/detokenize", s.detokenize)
		r.Get("/v1/cluster", s.cluster)
		r.With(s.refuseWhileDraining, s.shedLoad).Post("/v1/completions", s.completions)
		r.With(s.refuseWhileDraining, s.shedLoad).Post("/v1/chat/completions", s.chatCompletions)
	})
	return r
}

// Handler returns the server's routes.
func (s *Server) Handler() http.Handler { return s.router }

// recoverer turns a handler panic into a 500 with an OpenAI error, logged,
// instead of a dropped connection.
func (s *Server) recoverer(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			if v := recover(); v != nil {
				if v == http.ErrAbortHandler {
					panic(v)
				}
				s.cfg.Logger.Error("handler panicked", "path", r.URL.Path, "panic", fmt.Sprint(v))
				writeError(w, &apiError{Status: http.StatusInternalServerError, Message: "internal server error", Type: "server_error"})
			}
		}()
		next.ServeHTTP(w, r)
	})
}

func (s *Server) authenticate(next http.Handler) http.Handler {
	return s.requireKey(s.cfg.APIKeys, "api", next)
}

// requireKey admits the holders of keys; nil keys admit everyone. A
// refusal is counted and logged with its caller.
func (s *Server) requireKey(keys *Keys, routes string, next http.Handler) http.Handler {
	if keys == nil {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !keys.Allow(r.Header.Get("Authorization")) {
			s.authFailed.WithLabelValues(routes).Inc()
			if ok, skipped := s.authLog.allow(time.Now()); ok {
				s.cfg.Logger.Warn("refused a call with a missing or wrong key", "routes", routes, "method", r.Method, "path", r.URL.Path,
					"remote", r.RemoteAddr, "user_agent", r.UserAgent(), "refusals_not_logged", skipped)
			}
			writeError(w, &apiError{Status: http.StatusUnauthorized, Message: "invalid API key: send it as 'Authorization: Bearer <key>'",
				Type: "authentication_error", Code: strp("invalid_api_key")})
			return
		}
		next.ServeHTTP(w, r)
	})
}

func (s *Server) refuseWhileDraining(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s.draining.Load() {
			s.rejected.WithLabelValues("draining").Inc()
			w.Header().Set("Retry-After", "1")
			writeError(w, &apiError{Status: http.StatusServiceUnavailable, Type: "server_error", Code: strp("draining"),
				Message: "this node is draining: it finishes the requests it has and takes no new ones; send this one to another node"})
			return
		}
		next.ServeHTTP(w, r)
	})
}

// adminOnly admits the admin keys' holders, and no one when there are
// none. Being on this machine proves nothing: a same-host proxy or
// sidecar forwards from loopback, and so does a browser on the machine
// for any web page it shows. An admin call made in a browser's shapes (a
// cross-site Origin, a form or text body) is refused even with the key.
// Every admin call is logged with its caller.
func (s *Server) adminOnly(next http.Handler) http.Handler {
	if s.cfg.AdminKeys == nil {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			s.authFailed.WithLabelValues("admin").Inc()
			writeError(w, &apiError{Status: http.StatusForbidden, Type: "permission_error",
				Message: "admin routes are off: start the node with --admin-api-key (or $DPNODE_ADMIN_API_KEY) to use them"})
		})
	}
	return s.requireKey(s.cfg.AdminKeys, "admin", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if why := browserShape(r); why != "" {
			s.cfg.Logger.Warn("refused an admin call made as a browser makes it", "method", r.Method, "path", r.URL.Path, "remote", r.RemoteAddr, "why", why)
			writeError(w, &apiError{Status: http.StatusForbidden, Type: "permission_error", Message: "admin calls must not come from a web page: " + why})
			return
		}
		s.cfg.Logger.Info("admin call", "method", r.Method, "path", r.URL.Path, "remote", r.RemoteAddr, "user_agent", r.UserAgent())
		next.ServeHTTP(w, r)
	}))
}

// browserShape says why r looks sent by a web page rather than an admin's
// tool, or "": an Origin or Sec-Fetch-Site naming another site, or a body
// of a kind a page may send anywhere without asking (a form, plain text).
func browserShape(r *http.Request) string {
	if site := r.Header.Get("Sec-Fetch-Site"); site != "" && site != "same-origin" && site != "none" {
		return "Sec-Fetch-Site is " + site
	}
	if o := r.Header.Get("Origin"); o != "" {
		if u, err := url.Parse(o); err != nil || u.Host != r.Host {
			return "the Origin " + o + " is another site"
		}
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
		switch mt {
		case "application/x-www-form-urlencoded", "multipart/form-data", "text/plain":
			return "a " + mt + " body"
		}
	}
	return ""
}

// logLimiter lets through at most one log line a second, and counts the
// lines held back.
//
// Concurrency: safe for concurrent use.
type logLimiter struct {
	mu      sync.Mutex
	next    time.Time
	skipped int
}

// allow reports whether to log now, and how many lines were held back
// since the last one.
func (l *logLimiter) allow(now time.Time) (bool, int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if now.Before(l.next) {
		l.skipped++
		return false, 0
	}
	n := l.skipped
	l.next, l.skipped = now.Add(time.Second), 0
	return true, n
}

// drain starts the node's drain and answers at once: 202.
func (s *Server) drain(w http.ResponseWriter, _ *http.Request) {
	s.stopServing(w, s.cfg.OnDrain, "drain", "draining")
}

// leave starts the node's leave and answers at once: 202.
func (s *Server) leave(w http.ResponseWriter, _ *http.Request) {
	s.stopServing(w, s.cfg.OnLeave, "leave", "leaving")
}

// stopServing refuses new requests, then calls start (the node's drain
// or leave). Refusing starts here, not when the node gets round to it: a
// caller that drains and then sends expects the refusal.
func (s *Server) stopServing(w http.ResponseWriter, start func(), verb, status string) {
	if start == nil {
		writeError(w, &apiError{Status: http.StatusNotImplemented, Type: "server_error", Message: "this server cannot " + verb})
		return
	}
	s.SetDraining()
	start()
	writeJSON(w, http.StatusAccepted, map[string]string{"status": status})
}

// decode reads a request body into v, then holds its fields to table
// (fields.go). The body is read as a stream and refused as soon as a list
// in it passes its limit (bodyLimits), or the bytes that bodies hold at
// once pass MaxBodyBytesInFlight, before anything is decoded: what a
// body costs to decode grows with its elements, not only its bytes.
func (s *Server) decode(w http.ResponseWriter, r *http.Request, v any, table *fieldTable) *apiError {
	r.Body = http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes)
	// The whole body, while the server's read timeout holds: a client that
	// declared more than it sends must not hold the connection. At the
	// body's end net/http lifts the read deadline, so what follows (a
	// generation, streamed) may take as long as it takes.
	body := &budgetReader{r: r.Body, budget: &s.bodies}
	defer body.release()
	raw, err := s.bodyLimits.Read(body)
	if err == nil {
		err = json.Unmarshal(raw, v)
	}
	var tooBig *http.MaxBytesError
	var limit *jsonlimit.LimitError
	var typeErr *json.UnmarshalTypeError
	switch {
	case err == nil:
		return s.checkFields(raw, table)
	case errors.Is(err, errBodyBudget):
		s.rejected.WithLabelValues("overloaded").Inc()
		w.Header().Set("Retry-After", "1")
		return &apiError{Status: http.StatusServiceUnavailable, Type: "server_error", Code: strp("overloaded"),
			Message: fmt.Sprintf("the server is overloaded: the request bodies it is reading hold more than %d bytes; try again shortly", s.bodies.limit)}
	case errors.As(err, &tooBig):
		return &apiError{Status: http.StatusRequestEntityTooLarge, Type: "invalid_request_error",
			Message: fmt.Sprintf("request body larger than the limit of %d bytes", tooBig.Limit)}
	case errors.As(err, &limit) && limit.Kind == "bytes":
		return &apiError{Status: http.StatusRequestEntityTooLarge, Type: "invalid_request_error",
			Message: fmt.Sprintf("request body larger than the limit of %d bytes", limit.Limit)}
	case errors.As(err, &limit):
		// The field is the path's first name: "messages[].content" is in
		// messages.
		param, _, _ := strings.Cut(limit.Path, "[")
		param, _, _ = strings.Cut(param, ".")
		return badRequest(limit.Error(), param)
	case errors.As(err, &typeErr):
		// Fields of an embedded struct are named by its Go name too.
		field := strings.TrimPrefix(typeErr.Field, "commonParams.")
		return badRequest(fmt.Sprintf("invalid type for %q: expected %s", field, typeErr.Type), field)
	default:
		return badRequest("invalid JSON body: "+err.Error(), "")
	}
}

// bodyLimits are the limits of a request body as it is read (limits.go).
func (s *Server) limitsOfBodies() jsonlimit.Limits {
	// A prompt of token ids, one list or several, holds at most a
	// context's worth.
	tokens := max(s.cfg.MaxModelLen, maxChoices)
	return jsonlimit.Limits{
		MaxBytes:      s.cfg.MaxBodyBytes,
		MaxDepth:      maxBodyDepth,
		MaxContainers: maxBodyContainers,
		Default:       maxBodyList,
		Paths: map[string]int{
			"messages": maxMessages, "messages[].content": maxContentParts,
			"stop": maxStops, "stop_token_ids": maxStopTokenIDs, "logit_bias": maxLogitBias,
			"tools": maxTools, "prompt": tokens, "prompt[]": tokens, "tokens": tokens,
		},
	}
}

func (s *Server) checkModel(model string) *apiError {
	if model == "" || model == s.cfg.Backend.Model() || slices.Contains(s.cfg.ModelAliases, model) {
		return nil
	}
	return &apiError{Status: http.StatusNotFound, Type: "invalid_request_error", Param: strp("model"), Code: strp("model_not_found"),
		Message: fmt.Sprintf("The model `%s` does not exist. This server serves `%s`.", model, s.cfg.Backend.Model())}
}

// pinnedRank reads X-data-parallel-rank.
func (s *Server) pinnedRank(r *http.Request) (int, *apiError) {
	h := r.Header.Get("X-data-parallel-rank")
	if h == "" {
		return actors.AnyRank, nil
	}
	topo := s.cfg.Backend.Topology()
	rank, err := strconv.Atoi(strings.TrimSpace(h))
	if err != nil || rank < 0 || rank >= topo.Size {
		return 0, badRequest(fmt.Sprintf("X-data-parallel-rank must be a rank from 0 to %d, got %q", topo.Size-1, h), "X-data-parallel-rank")
	}
	if !topo.Hosts(rank) && !topo.BalancesRemote() {
		return 0, badRequest(fmt.Sprintf("rank %d is not served by this node, which serves ranks %d to %d", rank, topo.StartRank, topo.StartRank+topo.LocalSize-1), "X-data-parallel-rank")
	}
	return rank, nil
}

func (s *Server) models(w http.ResponseWriter, _ *http.Request) {
	cards := []modelCard{s.modelCard()}
	for _, alias := range s.cfg.ModelAliases {
		c := s.modelCard()
		c.ID = alias
		cards = append(cards, c)
	}
	writeJSON(w, http.StatusOK, modelList{Object: "list", Data: cards})
}

func (s *Server) modelCard() modelCard {
	m := s.cfg.Backend.Model()
	return modelCard{ID: m, Object: "model", Created: s.created, OwnedBy: "dpnode", Root: m, MaxModelLen: s.cfg.MaxModelLen}
}

func (s *Server) version(w http.ResponseWriter, _ *http.Request) {
	v := map[string]string{"version": s.cfg.Version}
	for k, x := range s.cfg.Build {
		if k != "version" {
			v[k] = x
		}
	}
	writeJSON(w, http.StatusOK, v)
}

// health is 200 while at least one rank this node balances over takes
// requests ("ok" when all do, "degraded" otherwise: some restart or
// failed) and 503 when none does.
func (s *Server) health(w http.ResponseWriter, r *http.Request) {
	if s.draining.Load() {
		writeJSON(w, http.StatusServiceUnavailable, map[string]any{"status": "draining"})
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	v, err := s.cfg.Backend.View(ctx)
	if err != nil {
		writeJSON(w, http.StatusServiceUnavailable, map[string]any{"status": "unavailable", "error": err.Error()})
		return
	}
	ready, balanced, failed := 0, 0, []int{}
	for _, rk := range v.Ranks {
		if rk.Balanced {
			balanced++
			if rk.Ready {
				ready++
			}
			if rk.Failed {
				failed = append(failed, rk.Rank)
			}
		}
	}
	status, code := "ok", http.StatusOK
	switch {
	case ready == 0:
		status, code = "unavailable", http.StatusServiceUnavailable
	case ready < balanced:
		status = "degraded"
	}
	writeJSON(w, code, map[string]any{"status": status, "ranks_ready": ready, "ranks": balanced, "ranks_failed": failed})
}
