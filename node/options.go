package node

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/dpnode/dpnode/actors"
	"github.com/dpnode/dpnode/control"
	"github.com/dpnode/dpnode/dp"
	"github.com/dpnode/dpnode/engine"
	"github.com/dpnode/dpnode/engine/registry"
	"github.com/dpnode/dpnode/engines"
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
	// (the engine's default when empty: Model, or the profile's).
	Model           string
	ServedModelName string
	// ServedModelAliases are more names clients may use; answers and
	// metrics carry ServedModelName.
	ServedModelAliases []string
	// LogRequests logs each finished request (--enable-log-requests);
	// DisableLogStats stops the stats line (--disable-log-stats).
	LogRequests     bool
	DisableLogStats bool
	// Engine names the engine the ranks run (see engines.All): "sim", the
	// calibrated simulated executor, by default.
	Engine string
	// Engines are each engine's own options, by name; only Engine's are
	// read. DefaultOptions holds every engine's defaults.
	Engines map[string]registry.Options
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

	Version string
	// Build is what the build says of itself (revision, Go version), for
	// /version.
	Build  map[string]string
	Logger *slog.Logger
}

// DefaultOptions are the defaults of `dpnode join`.
func DefaultOptions() Options {
	// What the node's actors default to is said once, in actors.
	node := actors.DefaultNodeConfig()
	engineOpts := make(map[string]registry.Options)
	for _, e := range engines.All() {
		engineOpts[e.Name] = e.NewOptions()
	}
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
		Engine:                engines.All()[0].Name,
		Engines:               engineOpts,
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
	opts  Options
	flags dp.Flags
	// engine is the engine's checked plan.
	engine *registry.Plan
	// scheduler is the engine's, and served the model name clients use.
	scheduler engine.SchedulerConfig
	served    string
	gossipKey []byte
	// apiKeys and adminKeys are nil when not set.
	apiKeys, adminKeys *httpapi.Keys
	// maxConnections is MaxConnections resolved.
	maxConnections int
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
	size, err := dp.Resolve(p.flags, max(o.GPUs, 1))
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errFlags, err)
	}
	switch {
	case o.ToolCallParser != "" && !slices.Contains(toolcall.Parsers(), o.ToolCallParser):
		return nil, flagError("--tool-call-parser must be one of %s, got %q", strings.Join(toolcall.Parsers(), ", "), o.ToolCallParser)
	case o.EnableAutoToolChoice && o.ToolCallParser == "":
		return nil, flagError("--enable-auto-tool-choice needs --tool-call-parser (%s), which reads the calls in the model's syntax", strings.Join(toolcall.Parsers(), ", "))
	}
	if err := p.checkEngine(size); err != nil {
		return nil, err
	}
	return p, nil
}

// checkEngine checks the engine's own flags, and the node's that it reads,
// and resolves its defaults.
func (p *plan) checkEngine(size dp.Topology) error {
	o := p.opts
	e, err := engines.Lookup(o.Engine)
	if err != nil {
		return flagError("%v", err)
	}
	opts := o.Engines[e.Name]
	if opts == nil {
		opts = e.NewOptions()
	}
	n := registry.Node{
		Model:               o.Model,
		ChatTemplate:        o.ChatTemplate,
		MaxNumSeqs:          o.MaxNumSeqs,
		MaxNumBatchedTokens: o.MaxNumBatchedTokens,
		MaxModelLen:         o.MaxModelLen,
		PrefixCaching:       !o.NoPrefixCaching,
		ExpertParallel:      o.ExpertParallel,
		LocalSize:           o.DataParallelSizeLocal,
		Logger:              o.Logger,
	}
	if !size.Elastic {
		n.Size = size.Size
	}
	if p.engine, err = opts.Plan(n); err != nil {
		return flagError("%v", err)
	}
	if p.engine.Simulated && (o.ToolCallParser != "" || o.EnableAutoToolChoice) {
		return flagError("--tool-call-parser and --enable-auto-tool-choice are not used by --engine %s: the simulated engine's text cannot hold tool calls", e.Name)
	}
	if o.ExpertParallel && !p.engine.Capabilities.ExpertParallel {
		return flagError("--enable-expert-parallel is not available with --engine %s", e.Name)
	}
	p.scheduler, p.served = p.engine.Scheduler, o.ServedModelName
	if p.served == "" {
		p.served = p.engine.Served
	}
	return nil
}

// checkValues rejects flags whose value is out of range on its own: one
// table of rules, which reads best in one place.
func (o Options) checkValues() error {
	switch {
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
	case len(o.NodeID) > maxNodeID || strings.ContainsFunc(o.NodeID, func(r rune) bool { return r <= ' ' || r > '~' }):
		// It travels in the gossiped metadata, which memberlist bounds.
		return flagError("--node-id must be at most %d printable ASCII characters without spaces, got %q", maxNodeID, o.NodeID)
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
