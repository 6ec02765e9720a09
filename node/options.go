package node

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"math"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/dpnode/dpnode/actors"
	"github.com/dpnode/dpnode/control"
	"github.com/dpnode/dpnode/dp"
	"github.com/dpnode/dpnode/engine"
	"github.com/dpnode/dpnode/engine/llamacpp"
	"github.com/dpnode/dpnode/engine/sim"
	httpapi "github.com/dpnode/dpnode/http"
	"github.com/dpnode/dpnode/http/toolcall"
)

// Options are a node's settings, as given on the command line. For the
// data-parallel sizes, -1 means "not given" (see dp.Flags); other zero
// values mean "use the default".
type Options struct {
	Host string
	// Port is the HTTP port; 0 picks a free one (tests).
	Port int
	// MetricsPort, when not -1, also serves /metrics, /health and
	// /v1/cluster on that port: what a headless node, which has no API
	// port, offers its operators.
	MetricsPort int
	// PortSet is true when --port was given explicitly.
	PortSet bool

	DataParallelSize      int
	DataParallelSizeLocal int
	DataParallelStartRank int
	// DataParallelRank selects external load balancing for one rank.
	DataParallelRank int
	LB               string
	HybridLB         bool
	ExternalLB       bool
	Headless         bool

	// Seeds are members to join (host:port; a host name seeds from every
	// address it resolves to); none starts a new cluster.
	Seeds []string
	// Founder says which node, among nodes with seeds, starts the cluster
	// when none of its seeds answers: FirstOrdinal, or a host name. The
	// others wait for a seed, up to JoinTimeout.
	Founder string
	// Hostname is this machine's host name (a pod's name in Kubernetes).
	Hostname string
	// NodeID is the node's identity in the roster, stable across restarts
	// at another address; empty makes it the gossip address. Unique per
	// node: two live nodes with one ID would serve the same ranks.
	NodeID string
	// Resolver looks up the seeds' host names; nil is the system's.
	Resolver control.Resolver
	// Bind is the gossip address (host:port); its host is also where the
	// actor transport listens.
	Bind string
	// Advertise is where other nodes reach this one (host[:port]).
	Advertise string
	// RPCPort is the actor transport's port (vLLM's
	// --data-parallel-rpc-port); 0 picks a free one.
	RPCPort int
	// GossipKey is the base64 gossip encryption key.
	GossipKey     string
	GossipProfile string
	TLS           control.TLSFiles
	// InsecureCluster lets gossip and the actor transport listen beyond
	// loopback without the gossip key and cluster TLS.
	InsecureCluster bool

	// Model is the model to serve; ServedModelName the name clients use
	// (Model when empty).
	Model           string
	ServedModelName string
	// Engine selects the executor: "sim" (the calibrated simulated
	// executor) or "llamacpp" (a GGUF model, Model, in a llama.cpp worker
	// process per rank).
	Engine       string
	SimProfile   string
	SimTimeScale float64
	// Threads is the CPU threads each llama.cpp rank computes with; 0
	// shares the machine's cores among the local ranks.
	Threads int
	// KVCacheMemory is each llama.cpp rank's KV cache budget, in bytes
	// with an optional unit (4GiB, 512MB); empty: from
	// GPUMemoryUtilization on a GPU, DefaultCPUKVCache on CPU.
	KVCacheMemory string
	// GPUMemoryUtilization is the share of a GPU's memory a llama.cpp rank
	// may use, weights and KV together (vLLM's --gpu-memory-utilization).
	GPUMemoryUtilization float64
	// ChatTemplate is a Jinja chat template file that replaces the
	// model's own.
	ChatTemplate string
	// ToolCallParser reads tool calls from the output in the model
	// family's syntax, as vLLM's --tool-call-parser: llama3_json, hermes
	// or mistral; empty reads none.
	ToolCallParser string
	// EnableAutoToolChoice lets the model choose to call tools (vLLM's
	// --enable-auto-tool-choice); it needs ToolCallParser.
	EnableAutoToolChoice bool
	// TokenizeContentAsText reads chat messages' content as text: a
	// special token's text typed in it stays text (httpapi.Config.ContentAsText).
	TokenizeContentAsText bool
	// KVCacheDtype is the llama.cpp KV cache's element type: auto (the
	// model's: float32 for an F32 model, else float16), float16 or
	// float32.
	KVCacheDtype string
	// GreedyInGraph says where llama.cpp ranks take greedy rows' argmax:
	// auto (in the graph when the model runs on a GPU), on or off.
	GreedyInGraph string
	// GPUs is the number of virtual GPUs when NVML is absent.
	GPUs int

	// BalancePolicy names the policy that picks a rank per request (see
	// dp.PolicyNames).
	BalancePolicy string

	// Migration moves requests mid-stream off a lost engine; MaxMigrations
	// bounds how often one request may move.
	Migration     bool
	MaxMigrations int
	// EngineMaxRestarts crashes within EngineRestartWindow stop a rank
	// for good.
	EngineMaxRestarts   int
	EngineRestartWindow time.Duration

	// ExpertParallel steps the ranks in lockstep waves (a MoE model);
	// CollectiveTimeout bounds a step's wait for the other ranks.
	ExpertParallel    bool
	CollectiveTimeout time.Duration

	// APIKeys are the bearer tokens the API accepts; APIKeyFile holds more,
	// one a line, read again when it changes (key rotation).
	APIKeys    []string
	APIKeyFile string
	// AdminAPIKeys open the /admin routes; without one they answer only
	// to callers on the machine itself.
	AdminAPIKeys []string
	// MaxPendingRequests bounds the requests an API server holds beyond
	// what its ranks run at once (ranks times --max-num-seqs): past it,
	// 503 with Retry-After. -1: as many again as the ranks run; 0: none
	// wait, every request beyond the ranks' capacity is refused.
	MaxPendingRequests  int
	MaxNumSeqs          int
	MaxNumBatchedTokens int
	MaxModelLen         int
	NoPrefixCaching     bool
	// HTTPTimeouts bound slow and idle clients; zero values take
	// httpapi.DefaultTimeouts.
	HTTPTimeouts httpapi.Timeouts
	// MaxConnections bounds the HTTP connections open at once (see
	// httpapi.ConnCap); 0 takes httpapi.DefaultMaxConnections.
	MaxConnections int
	// DrainTimeout bounds how long a stopping node waits for requests in
	// flight.
	DrainTimeout time.Duration
	// LeaveOnTerminate makes SIGTERM a leave (POST /admin/leave): the
	// node drains, then gives its ranks back, and an elastic deployment
	// shrinks. Without it SIGTERM drains and the ranks stay the node's,
	// to take back when it restarts (a rolling update).
	LeaveOnTerminate bool
	// JoinTimeout bounds how long a node waits for one of its seeds to
	// answer, and then, if its ranks are given out, for the coordinator to
	// give them.
	JoinTimeout time.Duration

	// Profiles holds the built-in simulated profiles.
	Profiles fs.FS
	Version  string
	Logger   *slog.Logger
}

// DefaultOptions are the defaults of `dpnode join`.
func DefaultOptions() Options {
	// What the node's actors default to is said once, in actors.
	node := actors.DefaultNodeConfig()
	return Options{
		Host:                  "0.0.0.0",
		Port:                  8000,
		MetricsPort:           -1,
		DataParallelSize:      -1,
		DataParallelSizeLocal: -1,
		DataParallelStartRank: -1,
		DataParallelRank:      -1,
		Bind:                  "127.0.0.1:7946",
		RPCPort:               29550,
		GossipProfile:         "lan",
		Engine:                "sim",
		SimProfile:            "llama-3.1-8b-h100",
		SimTimeScale:          1,
		GPUMemoryUtilization:  0.9,
		KVCacheDtype:          "auto",
		GreedyInGraph:         "auto",
		GPUs:                  2,
		CollectiveTimeout:     node.CollectiveTimeout,
		BalancePolicy:         dp.PolicyLive,
		Migration:             node.Migration,
		MaxMigrations:         node.MaxMigrations,
		EngineMaxRestarts:     node.Restart.MaxRestarts,
		EngineRestartWindow:   node.Restart.Window,
		DrainTimeout:          30 * time.Second,
		JoinTimeout:           time.Minute,
		MaxPendingRequests:    -1,
		HTTPTimeouts:          httpapi.DefaultTimeouts(),
	}
}

// CheckOptions checks o as Start would, starting nothing.
func CheckOptions(o Options) error {
	_, err := o.check()
	return err
}

// errFlags prefixes every error about the command line.
var errFlags = errors.New("invalid flags")

func flagError(format string, args ...any) error {
	return fmt.Errorf("%w: %s", errFlags, fmt.Sprintf(format, args...))
}

// IsFlagError reports whether err is about the command line.
func IsFlagError(err error) bool { return errors.Is(err, errFlags) }

// plan is a checked Options, with defaults resolved except the ones that
// need the GPUs.
type plan struct {
	opts      Options
	flags     dp.Flags
	scheduler engine.SchedulerConfig
	served    string
	gossipKey []byte
	// apiKeys and adminKeys are nil when not set.
	apiKeys, adminKeys *httpapi.Keys
	// profile is the simulated engine's; nil for llama.cpp.
	profile *sim.Profile
	// experts is the model's expert count under expert parallelism: an
	// elastic deployment's size must divide it. 0 otherwise.
	experts int
	// model, template and kvBytes are the llama.cpp engine's.
	model    *llamacpp.ModelInfo
	template *httpapi.JinjaTemplate
	kvBytes  uint64
	kvDtype  string
	// maxConnections is MaxConnections resolved.
	maxConnections int
}

// servingProfile is what the engine serves, as other nodes compare it
// (NodeMeta.profile): the simulated profile's name, or what identifies a
// GGUF model wherever its file lies.
func (p *plan) servingProfile() string {
	if m := p.model; m != nil {
		return fmt.Sprintf("%s, %d-token vocabulary, %d bytes", m.Architecture, m.VocabSize, m.Bytes)
	}
	if p.profile != nil {
		return p.profile.Name
	}
	return ""
}

func (o Options) dpFlags() dp.Flags {
	return dp.Flags{
		Size: o.DataParallelSize, LocalSize: o.DataParallelSizeLocal, StartRank: o.DataParallelStartRank,
		Rank: o.DataParallelRank, LB: o.LB, HybridLB: o.HybridLB, Headless: o.Headless, ExternalLB: o.ExternalLB,
		PortSet: o.PortSet,
	}
}

// check rejects contradictory or impossible flags, all before anything
// starts, and resolves the defaults that do not depend on the GPUs.
func (o Options) check() (*plan, error) {
	if err := o.checkValues(); err != nil {
		return nil, err
	}
	bind, err := resolveBind(o.Resolver, o.Bind)
	if err != nil {
		return nil, flagError("--bind %q: %v", o.Bind, err)
	}
	// From here on, the address itself: every check below and every
	// listener is on what the name resolved to.
	o.Bind = bind
	if err := o.TLS.Check(); err != nil {
		return nil, flagError("%v", err)
	}
	if err := o.checkClusterSecurity(); err != nil {
		return nil, err
	}
	p := &plan{opts: o, flags: o.dpFlags(), maxConnections: o.MaxConnections}
	if p.maxConnections == 0 {
		p.maxConnections = httpapi.DefaultMaxConnections()
	}
	if p.apiKeys, err = httpapi.NewKeys(o.APIKeys, o.APIKeyFile); err != nil {
		return nil, flagError("--api-key: %v", err)
	}
	if p.adminKeys, err = httpapi.NewKeys(o.AdminAPIKeys, ""); err != nil {
		return nil, flagError("--admin-api-key: %v", err)
	}
	if _, err := dp.NewPolicy(o.BalancePolicy, dp.PolicyConfig{}); err != nil {
		return nil, flagError("--balance-policy: %v", err)
	}
	if o.GossipKey != "" {
		key, err := base64.StdEncoding.DecodeString(o.GossipKey)
		if err != nil || (len(key) != 16 && len(key) != 24 && len(key) != 32) {
			return nil, flagError("--gossip-key must be 16, 24 or 32 bytes in base64 (for example: head -c 32 /dev/urandom | base64)")
		}
		p.gossipKey = key
	}
	// The GPU count is not known yet; every rule between flags can be
	// checked with any count that the flags themselves allow.
	if _, err := dp.Resolve(p.flags, max(o.GPUs, 1)); err != nil {
		return nil, fmt.Errorf("%w: %w", errFlags, err)
	}
	switch {
	case o.ToolCallParser != "" && !slices.Contains(toolcall.Parsers(), o.ToolCallParser):
		return nil, flagError("--tool-call-parser must be one of %s, got %q", strings.Join(toolcall.Parsers(), ", "), o.ToolCallParser)
	case o.EnableAutoToolChoice && o.ToolCallParser == "":
		return nil, flagError("--enable-auto-tool-choice needs --tool-call-parser (%s), which reads the calls in the model's syntax", strings.Join(toolcall.Parsers(), ", "))
	case o.Engine != "llamacpp" && (o.ToolCallParser != "" || o.EnableAutoToolChoice):
		return nil, flagError("--tool-call-parser and --enable-auto-tool-choice need --engine llamacpp: the simulated engine's text cannot hold tool calls")
	}
	if o.Engine == "llamacpp" {
		if err := p.checkLlamaCpp(); err != nil {
			return nil, err
		}
		return p, nil
	}
	if err := p.checkSim(); err != nil {
		return nil, err
	}
	return p, nil
}

// checkValues rejects flags whose value is out of range on its own: one
// table of rules, which reads best in one place.
func (o Options) checkValues() error {
	switch {
	case o.Engine != "sim" && o.Engine != "llamacpp":
		return flagError("--engine %q is not available; the engines are: sim (simulated), llamacpp (a GGUF model)", o.Engine)
	case o.SimTimeScale < 0 || math.IsNaN(o.SimTimeScale) || math.IsInf(o.SimTimeScale, 0):
		return flagError("--sim-time-scale must be a finite number at least 0, got %v", o.SimTimeScale)
	case o.Port < 0 || o.Port > 65535:
		return flagError("--port must be between 0 and 65535, got %d", o.Port)
	case o.MetricsPort < -1 || o.MetricsPort > 65535:
		return flagError("--metrics-port must be between 0 and 65535, got %d", o.MetricsPort)
	case o.RPCPort < 0 || o.RPCPort > 65535:
		return flagError("--data-parallel-rpc-port must be between 0 and 65535, got %d", o.RPCPort)
	case o.Host != "" && net.ParseIP(o.Host) == nil && o.Host != "localhost":
		return flagError("--host must be an IP address or localhost, got %q", o.Host)
	case o.GPUs < 1:
		return flagError("--gpus must be at least 1, got %d", o.GPUs)
	case o.MaxNumSeqs < 0, o.MaxNumBatchedTokens < 0, o.MaxModelLen < 0:
		return flagError("--max-num-seqs, --max-num-batched-tokens and --max-model-len must not be negative")
	case o.MaxMigrations < 0 || o.EngineMaxRestarts < 0:
		return flagError("--max-migrations and --engine-max-restarts must not be negative")
	case o.EngineRestartWindow <= 0:
		return flagError("--engine-restart-window must be positive, got %v", o.EngineRestartWindow)
	case o.CollectiveTimeout <= 0:
		return flagError("--ep-collective-timeout must be positive, got %v", o.CollectiveTimeout)
	case o.JoinTimeout <= 0:
		return flagError("--join-timeout must be positive, got %v", o.JoinTimeout)
	case o.MaxConnections < 0:
		return flagError("--max-connections must not be negative, got %d", o.MaxConnections)
	case o.HTTPTimeouts.Write < 0:
		return flagError("--client-write-timeout must not be negative, got %v", o.HTTPTimeouts.Write)
	case o.DrainTimeout < 0:
		return flagError("--drain-timeout must not be negative, got %v", o.DrainTimeout)
	case o.Headless && (len(o.APIKeys) > 0 || o.APIKeyFile != ""):
		return flagError("--headless serves no API, so --api-key has no effect there")
	case o.MaxPendingRequests < -1:
		return flagError("--max-pending-requests must be at least 0 (or -1 for the default), got %d", o.MaxPendingRequests)
	case o.GossipProfile != "lan" && o.GossipProfile != "local":
		return flagError("--gossip-profile must be lan or local, got %q", o.GossipProfile)
	case o.Threads < 0:
		return flagError("--threads must not be negative, got %d", o.Threads)
	case !(o.GPUMemoryUtilization > 0 && o.GPUMemoryUtilization <= 1):
		return flagError("--gpu-memory-utilization must be in (0, 1], got %v", o.GPUMemoryUtilization)
	case len(o.NodeID) > maxNodeID || strings.ContainsFunc(o.NodeID, func(r rune) bool { return r <= ' ' || r > '~' }):
		// It travels in the gossiped metadata, which memberlist bounds.
		return flagError("--node-id must be at most %d printable ASCII characters without spaces, got %q", maxNodeID, o.NodeID)
	}
	return nil
}

// checkSim resolves the simulated engine's profile and the scheduler
// flags against it.
func (p *plan) checkSim() error {
	o := p.opts
	profile, err := sim.LoadProfile(o.Profiles, o.SimProfile)
	if err != nil {
		return fmt.Errorf("%w: --sim-profile: %w", errFlags, err)
	}
	p.profile = profile
	if o.ExpertParallel {
		if profile.Kind != sim.KindMoE {
			return flagError("--enable-expert-parallel needs a mixture-of-experts model; the profile %s is %s (try --sim-profile qwen3-30b-a3b-h200)", profile.Name, profile.Kind)
		}
		// The group is every rank of the deployment. An elastic one is
		// checked at each join, by the coordinator (control.Claim.Experts).
		size, _ := dp.Resolve(p.flags, max(o.GPUs, 1))
		if !size.Elastic {
			if err := profile.CheckExpertParallel(size.Size); err != nil {
				return fmt.Errorf("%w: --enable-expert-parallel: %w", errFlags, err)
			}
		}
		p.experts = profile.MoE.NumExperts
	}
	p.served = o.ServedModelName
	if p.served == "" {
		p.served = o.Model
	}
	if p.served == "" {
		p.served = profile.Model
	}
	p.scheduler = profile.SchedulerConfig()
	p.scheduler.MaxNumSeqs = orDefault(o.MaxNumSeqs, profile.MaxNumSeqs)
	p.scheduler.MaxNumBatchedTokens = orDefault(o.MaxNumBatchedTokens, profile.MaxNumBatchedTokens)
	p.scheduler.MaxModelLen = orDefault(o.MaxModelLen, profile.MaxModelLen)
	p.scheduler.EnablePrefixCaching = !o.NoPrefixCaching
	if err := p.scheduler.Validate(); err != nil {
		return fmt.Errorf("%w: %w", errFlags, err)
	}
	return nil
}

// topology resolves the data-parallel flags given the local GPU count:
// with no sizes, one rank per GPU.
func (p *plan) topology(gpus int) (dp.Topology, error) {
	t, err := dp.Resolve(p.flags, gpus)
	if err != nil {
		return t, fmt.Errorf("%w: %w", errFlags, err)
	}
	return t, nil
}

func (o Options) address() string {
	return net.JoinHostPort(o.Host, strconv.Itoa(o.Port))
}

// DefaultCPUKVCache is a llama.cpp rank's KV cache on CPU when
// --kv-cache-memory-bytes is not given: vLLM's CPU backend's default.
const DefaultCPUKVCache = 4 << 30

// llamaCppDefaults are the scheduler's defaults for the llama.cpp engine:
// vLLM's sequences per step, and a step budget of 2,048 tokens, which
// keeps a long prefill chunk from stalling decodes for long on a CPU.
var llamaCppDefaults = engine.SchedulerConfig{MaxNumSeqs: 256, MaxNumBatchedTokens: 2048, BlockSize: 16}

// checkLlamaCpp checks the llama.cpp engine's flags against the model
// file, before any worker starts.
func (p *plan) checkLlamaCpp() error {
	o := p.opts
	switch {
	case o.Model == "":
		return flagError("--engine llamacpp needs --model, a GGUF file")
	case o.ExpertParallel:
		return flagError("--enable-expert-parallel is not available with --engine llamacpp: llama.cpp has no expert-parallel API (each rank holds the whole model)")
	case o.SimProfile != DefaultOptions().SimProfile:
		return flagError("--sim-profile is the simulated engine's; --engine llamacpp serves --model")
	}
	p.served = o.ServedModelName
	info, err := llamacpp.InspectModel(o.Model)
	if err != nil {
		return fmt.Errorf("%w: --model: %w", errFlags, err)
	}
	p.model = info
	if _, err := llamacpp.FindWorker(); err != nil {
		return fmt.Errorf("%w: --engine llamacpp: %w", errFlags, err)
	}
	if o.MaxModelLen > info.ContextLength {
		return flagError("--max-model-len %d is longer than the context of %s, %d tokens", o.MaxModelLen, o.Model, info.ContextLength)
	}
	src, from := info.ChatTemplate, o.Model
	if o.ChatTemplate != "" {
		b, err := os.ReadFile(o.ChatTemplate)
		if err != nil {
			return flagError("--chat-template: %v", err)
		}
		src, from = string(b), o.ChatTemplate
	}
	if src != "" {
		if p.template, err = httpapi.NewJinjaTemplate(src, info.BOSToken, info.EOSToken); err != nil {
			return flagError("the chat template of %s: %v", from, err)
		}
	}
	switch o.KVCacheDtype {
	case "auto":
		p.kvDtype = "f16"
		if info.F32 {
			p.kvDtype = "f32"
		}
	case "float16":
		p.kvDtype = "f16"
	case "float32":
		p.kvDtype = "f32"
	default:
		return flagError("--kv-cache-dtype must be auto, float16 or float32, got %q", o.KVCacheDtype)
	}
	switch o.GreedyInGraph {
	case "auto", "on", "off":
	default:
		return flagError("--greedy-in-graph must be auto, on or off, got %q", o.GreedyInGraph)
	}
	if o.KVCacheMemory != "" {
		if p.kvBytes, err = parseBytes(o.KVCacheMemory); err != nil {
			return flagError("--kv-cache-memory-bytes: %v", err)
		}
	}
	if p.served == "" {
		p.served = o.Model
	}
	sc := llamaCppDefaults
	sc.MaxNumSeqs = min(orDefault(o.MaxNumSeqs, sc.MaxNumSeqs), llamacpp.MaxSequences)
	if o.MaxNumSeqs > llamacpp.MaxSequences {
		return flagError("--max-num-seqs %d is more than llama.cpp's %d sequences", o.MaxNumSeqs, llamacpp.MaxSequences)
	}
	sc.MaxNumBatchedTokens = orDefault(o.MaxNumBatchedTokens, sc.MaxNumBatchedTokens)
	sc.MaxModelLen = orDefault(o.MaxModelLen, info.ContextLength)
	sc.EnablePrefixCaching = !o.NoPrefixCaching
	// Until a worker says how many streams its memory holds: one per
	// running sequence, each of the max model length.
	sc.SequenceSlots, sc.StreamCells = sc.MaxNumSeqs, sc.MaxModelLen
	sc.NumBlocks = sc.SequenceSlots * ((sc.MaxModelLen + sc.BlockSize - 1) / sc.BlockSize)
	if err := sc.Validate(); err != nil {
		return fmt.Errorf("%w: %w", errFlags, err)
	}
	p.scheduler = sc
	return nil
}

// parseBytes reads a size: a number of bytes with an optional unit, decimal
// (KB, MB, GB, or k, M, G as vLLM writes them) or binary (KiB, MiB, GiB).
func parseBytes(s string) (uint64, error) {
	units := []struct {
		suffix string
		mult   uint64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40},
		{"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12}, {"k", 1e3}, {"K", 1e3}, {"M", 1e6}, {"G", 1e9}, {"T", 1e12}, {"B", 1}}
	num, mult := strings.TrimSpace(s), uint64(1)
	for _, u := range units {
		if strings.HasSuffix(num, u.suffix) {
			num, mult = strings.TrimSpace(strings.TrimSuffix(num, u.suffix)), u.mult
			break
		}
	}
	v, err := strconv.ParseFloat(num, 64)
	if err != nil || v <= 0 || math.IsInf(v, 0) || v*float64(mult) >= 1<<62 {
		return 0, fmt.Errorf("%q is not a size in bytes (for example 4GiB, 512MB or 1073741824)", s)
	}
	return uint64(v * float64(mult)), nil
}

func orDefault(v, d int) int {
	if v > 0 {
		return v
	}
	return d
}

// maxRequests is the API server's bound on requests in flight: what the
// ranks it balances over run at once, plus --max-pending-requests.
func (p *plan) maxRequests(topo dp.Topology) int {
	ranks := topo.LocalSize
	if topo.BalancesRemote() {
		ranks = topo.Size
	}
	running := ranks * p.scheduler.MaxNumSeqs
	pending := p.opts.MaxPendingRequests
	if pending < 0 {
		pending = running
	}
	return running + pending
}

// checkClusterSecurity refuses cluster ports open beyond this machine
// without authentication. Whoever can reach the gossip port can join the
// cluster (and claim ranks, or be elected coordinator); whoever can reach
// the actor transport can send any node's actors any message. The gossip
// key admits only holders of the key to gossip, and mutual TLS only
// holders of a certificate of the cluster's CA to the transport.
func (o Options) checkClusterSecurity() error {
	if o.bindsLoopback() || o.InsecureCluster {
		return nil
	}
	var missing []string
	if o.GossipKey == "" {
		missing = append(missing, "--gossip-key (or $DPNODE_GOSSIP_KEY)")
	}
	if !o.TLS.Set() {
		missing = append(missing, "--cluster-tls-cert, --cluster-tls-key and --cluster-tls-ca")
	}
	if len(missing) == 0 {
		return nil
	}
	return flagError("--bind %s opens the cluster's gossip and actor ports beyond this machine, but anyone who reaches them could join the cluster and send its actors messages: set %s (dpnode certs --dir DIR NODE... writes them all), or accept the risk on a trusted network with --insecure-cluster",
		o.Bind, strings.Join(missing, " and "))
}

// bindsLoopback reports whether the cluster ports listen on this machine
// only.
func (o Options) bindsLoopback() bool {
	host, _, _ := control.SplitHostPort(o.Bind, 7946)
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// resolveBind returns bind with its host name, if any, resolved to the
// one address the cluster ports will listen on: the first IPv4 address
// it has, else its first. memberlist and gRPC take addresses, and a name
// they cannot use as one would have them listen on every interface,
// whatever the name says.
func resolveBind(r control.Resolver, bind string) (string, error) {
	host, port, err := control.SplitHostPort(bind, 7946)
	if err != nil {
		return "", err
	}
	if host == "" || net.ParseIP(host) != nil {
		return net.JoinHostPort(host, strconv.Itoa(port)), nil
	}
	if r == nil {
		r = net.DefaultResolver
	}
	ctx, cancel := context.WithTimeout(context.Background(), control.LookupTimeout)
	defer cancel()
	addrs, err := r.LookupHost(ctx, host)
	if err != nil {
		return "", fmt.Errorf("resolving %s: %w", host, err)
	}
	var ips []net.IP
	for _, a := range addrs {
		if ip := net.ParseIP(a); ip != nil {
			ips = append(ips, ip)
		}
	}
	if len(ips) == 0 {
		return "", fmt.Errorf("%s resolves to no address", host)
	}
	pick := ips[0]
	if i := slices.IndexFunc(ips, func(ip net.IP) bool { return ip.To4() != nil }); i >= 0 {
		pick = ips[i]
	}
	return net.JoinHostPort(pick.String(), strconv.Itoa(port)), nil
}

// maxNodeID bounds --node-id: a DNS name's length.
const maxNodeID = 253

// FirstOrdinal names a StatefulSet's first pod as the founder: the host
// whose name ends in -0.
const FirstOrdinal = "first-ordinal"

// founds reports whether this node starts the cluster when none of its
// seeds answers. A node without seeds always starts one.
func (o Options) founds() bool {
	switch {
	case len(o.Seeds) == 0:
		return true
	case o.Founder == FirstOrdinal:
		// The short name: a pod's host name may be fully qualified
		// (setHostnameAsFQDN).
		short, _, _ := strings.Cut(o.Hostname, ".")
		return strings.HasSuffix(short, "-0")
	case o.Founder == "":
		return false
	}
	// A pod's host name is short; a machine's may be fully qualified.
	short, _, _ := strings.Cut(o.Hostname, ".")
	return o.Founder == o.Hostname || o.Founder == short
}
