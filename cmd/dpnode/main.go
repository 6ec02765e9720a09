// Command dpnode serves a large language model with data parallelism
// across GPUs and nodes, behind the OpenAI HTTP API.
package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/dpnode/dpnode/control"
	"github.com/dpnode/dpnode/dp"
	"github.com/dpnode/dpnode/engine/llamacpp"
	"github.com/dpnode/dpnode/engine/registry"
	"github.com/dpnode/dpnode/engines"
	"github.com/dpnode/dpnode/node"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

// gcPercent is the garbage collector's target unless GOGC says otherwise:
// a serving node's live heap is small (the model's weights and KV cache
// live on the GPU or in the worker process), and at Go's default of 100 the
// collector took a sixth of the CPU under load. At 400 the heap may grow to
// five times what is live before a collection; GOMEMLIMIT caps it where
// memory is tight.
const gcPercent = 400

func main() {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(gcPercent)
	}
	root := newRootCommand()
	root.SetArgs(spreadNames(os.Args[1:]))
	if err := root.Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "dpnode:", err)
		os.Exit(1)
	}
}

func newRootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:           "dpnode",
		Short:         "Serve an LLM with data parallelism across GPUs and nodes",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.Version, _ = buildVersion()
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return fmt.Errorf("invalid flags: %w", err) })
	root.AddCommand(newJoinCommand(), newServeCommand(), newCertsCommand(), newTestModelCommand())
	return root
}

// buildVersion is dpnode's version, and what the build says of itself: the
// version set at build time, else the module's version in the build info
// (a release's tag, or Go's pseudo-version of the checkout's revision,
// +dirty when it had changes), else "dev" with the revision.
func buildVersion() (string, map[string]string) {
	v, build := version, map[string]string{}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return v, build
	}
	build["go"] = bi.GoVersion
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			build["revision"] = s.Value
		case "vcs.time":
			build["revision_time"] = s.Value
		case "vcs.modified":
			build["modified"] = s.Value
		}
	}
	if v != "dev" {
		return v, build
	}
	if mv := bi.Main.Version; mv != "" && mv != "(devel)" {
		return mv, build
	}
	if rev := build["revision"]; rev != "" {
		v += "+" + rev[:min(12, len(rev))]
		if build["modified"] == "true" {
			v += "-dirty"
		}
	}
	return v, build
}

func newCertsCommand() *cobra.Command {
	dir := "dpnode-certs"
	cmd := &cobra.Command{
		Use:   "certs NODE...",
		Short: "Write a cluster CA, a gossip key, and a certificate for each node named",
		Long: `Write what a cluster needs so that only its members can join and speak: a CA
whose certificates admit nodes to the actor transport (mutual TLS), a gossip
key, and a certificate and key for each node named. The first run creates the
CA and the gossip key in --dir; later runs reuse them to add nodes. Keys are
readable by their owner only; copy each node its own files, the CA
certificate and the gossip key.`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, nodes []string) error {
			ca, created, err := control.OpenCA(dir)
			if err != nil {
				return fmt.Errorf("the CA in %s: %w", dir, err)
			}
			out := cmd.OutOrStdout()
			if created {
				fmt.Fprintf(out, "created a cluster CA and a gossip key in %s\n", dir)
			}
			for _, name := range nodes {
				f, err := ca.Issue(name)
				if err != nil {
					return fmt.Errorf("node %s: %w", name, err)
				}
				fmt.Fprintf(out, "%s: --cluster-tls-cert %s --cluster-tls-key %s --cluster-tls-ca %s\n", name, f.Cert, f.Key, f.CA)
			}
			fmt.Fprintf(out, "every node: DPNODE_GOSSIP_KEY=$(cat %s)\n", filepath.Join(dir, control.GossipKeyFile))
			return nil
		},
	}
	cmd.Flags().StringVar(&dir, "dir", dir, "directory of the CA, the gossip key and the node certificates")
	return cmd
}

func newTestModelCommand() *cobra.Command {
	cfg := llamacpp.DefaultTestModel()
	var out, template string
	var whole bool
	cmd := &cobra.Command{
		Use:   "testmodel",
		Short: "Write a small random-weight model with a real tokenizer, for tests of the llama.cpp engine",
		Long: `Write a GGUF model of the Llama architecture with random weights and the
tokenizer of a vocabulary file (llama.cpp ships them as models/ggml-vocab-*.gguf;
make llamacpp puts them under .llamacpp/src/models). Its text is nonsense, but
llama.cpp computes it as it would a trained model's; the same seed always
writes the same file.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if out == "" {
				return fmt.Errorf("invalid flags: --out is required")
			}
			if template != "" {
				b, err := os.ReadFile(template)
				if err != nil {
					return fmt.Errorf("--chat-template: %w", err)
				}
				cfg.ChatTemplate = string(b)
			}
			if whole {
				worker, err := llamacpp.FindWorker()
				if err != nil {
					return fmt.Errorf("--whole-characters reads the vocabulary with llama.cpp: %w", err)
				}
				ctx, cancel := context.WithTimeout(cmd.Context(), time.Minute)
				defer cancel()
				if cfg.Silence, err = llamacpp.PartialCharacterTokens(ctx, llamacpp.WorkerConfig{Binary: worker}, cfg.Vocab); err != nil {
					return err
				}
			}
			f, err := os.Create(out)
			if err != nil {
				return err
			}
			if err := llamacpp.WriteTestModel(f, cfg); err != nil {
				f.Close()
				os.Remove(out)
				return err
			}
			if err := f.Close(); err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), "wrote", out)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.Vocab, "vocab", "", "GGUF file whose tokenizer the model takes (required)")
	f.StringVar(&template, "chat-template", "", "Jinja chat template file for tokenizer.chat_template (default: the vocabulary file's, if any)")
	f.StringVar(&out, "out", "", "file to write (required)")
	f.IntVar(&cfg.Layers, "layers", cfg.Layers, "transformer blocks")
	f.IntVar(&cfg.Embedding, "embedding", cfg.Embedding, "width of the residual stream")
	f.IntVar(&cfg.Heads, "heads", cfg.Heads, "attention heads")
	f.IntVar(&cfg.KVHeads, "kv-heads", cfg.KVHeads, "key-value heads")
	f.IntVar(&cfg.FeedForward, "feed-forward", cfg.FeedForward, "width of the feed-forward layers")
	f.IntVar(&cfg.ContextLength, "context-length", cfg.ContextLength, "context length the model claims")
	f.Uint64Var(&cfg.Seed, "seed", cfg.Seed, "seed of the weights")
	f.BoolVar(&whole, "whole-characters", false, "never write a token that is part of a UTF-8 character (for servers that fail on such output; needs make llamacpp)")
	_ = cmd.MarkFlagRequired("vocab")
	return cmd
}

// secretFlags are the flags that take a secret, with the environment
// variable that takes it unseen.
var secretFlags = []struct{ flag, env string }{
	{"api-key", "DPNODE_API_KEY"},
	{"admin-api-key", "DPNODE_ADMIN_API_KEY"},
	{"gossip-key", "DPNODE_GOSSIP_KEY"},
}

// warnSecretFlags warns of secrets given on the command line: every user
// of the machine reads them in ps and /proc, and so does anyone who can
// read the process's command line elsewhere.
func warnSecretFlags(cmd *cobra.Command, logger *slog.Logger) {
	for _, s := range secretFlags {
		if cmd.Flags().Changed(s.flag) {
			logger.Warn("a secret given as a flag is visible to every user of this machine (ps, /proc); set it in the environment instead",
				"flag", "--"+s.flag, "env", "$"+s.env)
		}
	}
	if cmd.Flags().Changed("api-key") {
		logger.Warn("or keep the API keys in a file only the node reads", "flag", "--api-key-file")
	}
}

// envList is an environment variable as a flag's default list: empty
// when unset.
func envList(name string) []string {
	if v := os.Getenv(name); v != "" {
		return []string{v}
	}
	return nil
}

const joinLong = `Start a node: one engine actor per data-parallel rank (one GPU each) and an
API server that balances requests over them and serves the OpenAI HTTP API.
With no seeds it starts a new cluster that others can join; with --seeds it
joins one by gossip. Where no GPU backend is configured the engines run the
calibrated simulated executor.`

// newJoinCommand is dpnode join.
func newJoinCommand() *cobra.Command {
	cmd := newNodeCommand(cobra.NoArgs)
	cmd.Use = "join"
	cmd.Short = "Start a node: one engine per local GPU, and an OpenAI-compatible API server"
	cmd.Long = joinLong
	return cmd
}

// newServeCommand is dpnode serve MODEL, vLLM's spelling of join --model
// MODEL, so that vllm serve command lines carry over.
func newServeCommand() *cobra.Command {
	cmd := newNodeCommand(cobra.MaximumNArgs(1))
	cmd.Use = "serve [MODEL]"
	cmd.Short = "Start a node serving MODEL (as vllm serve MODEL): dpnode join --model MODEL"
	cmd.Long = joinLong + `

dpnode serve MODEL is dpnode join --model MODEL. A MODEL that ends in .gguf
runs on the llama.cpp engine unless --engine says otherwise.`
	return cmd
}

// newNodeCommand is a command that starts a node (join, serve): the table
// of its flags, which reads best in one place, as --help lists them.
func newNodeCommand(args cobra.PositionalArgs) *cobra.Command {
	o := node.DefaultOptions()
	var logLevel string
	var vllm vllmFlags
	// Each engine's flags, to refuse those of an engine not chosen.
	engineFlags := make(map[string]*pflag.FlagSet)
	var servedNames []string
	cmd := &cobra.Command{
		Args: args,
		RunE: func(cmd *cobra.Command, args []string) error {
			var level slog.Level
			if err := level.UnmarshalText([]byte(logLevel)); err != nil {
				return fmt.Errorf("invalid flags: --log-level: %w", err)
			}
			o.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
			warnSecretFlags(cmd, o.Logger)
			if len(args) == 1 {
				if o.Model != "" && o.Model != args[0] {
					return fmt.Errorf("invalid flags: the model is %s, and --model says %s", args[0], o.Model)
				}
				o.Model = args[0]
			}
			if e, ok := registry.ForModel(engines.All(), o.Model); ok && !cmd.Flags().Changed("engine") {
				o.Engine = e.Name
			}
			if err := vllm.check(cmd.Flags(), &o); err != nil {
				return err
			}
			if len(servedNames) > 0 {
				o.ServedModelName, o.ServedModelAliases = servedNames[0], servedNames[1:]
			}
			if err := checkEngineFlags(o.Engine, engineFlags); err != nil {
				return err
			}
			o.Version, o.Build = buildVersion()
			o.PortSet = cmd.Flags().Changed("port")
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGTERM, syscall.SIGINT)
			defer stop()
			return node.Run(ctx, o)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.Host, "host", o.Host, "address the HTTP server listens on")
	f.IntVar(&o.Port, "port", o.Port, "HTTP port")
	f.IntVar(&o.MetricsPort, "metrics-port", o.MetricsPort, "also serve /metrics, /health and /v1/cluster on this port (a headless node has no other; -1: off)")
	f.Var((*autoInt)(&o.DataParallelSize), "data-parallel-size", "ranks in the whole deployment, or auto: the size follows the nodes that join and leave (default: the local ranks)")
	f.IntVar(&o.DataParallelSizeLocal, "data-parallel-size-local", o.DataParallelSizeLocal, "ranks on this node, one GPU each (default: one per GPU found)")
	f.Var((*autoInt)(&o.DataParallelStartRank), "data-parallel-start-rank", "first rank on this node, or auto: the lowest free ranks, given out by the coordinator when the node joins (default 0; auto with --data-parallel-size auto)")
	f.Var((*autoInt)(&o.DataParallelRank), "data-parallel-rank", "serve only this rank behind an outside load balancer (external mode), or auto: the lowest free rank, given out by the coordinator")
	f.StringVar(&o.LB, "data-parallel-lb", "", "who balances: hybrid (each node over its own ranks; the default), internal, or external")
	f.BoolVar(&o.HybridLB, "data-parallel-hybrid-lb", false, "same as --data-parallel-lb hybrid")
	f.BoolVar(&o.ExternalLB, "data-parallel-external-lb", false, "same as --data-parallel-lb external")
	f.BoolVar(&o.Headless, "headless", false, "host ranks without an API server (internal mode)")
	f.StringSliceVar(&o.Seeds, "seeds", nil, "gossip addresses (host:port) of cluster members to join; a host name seeds from every address it resolves to (a headless Service); none starts a new cluster")
	f.StringVar(&o.NodeID, "node-id", "", "this node's identity in the roster, stable when it restarts at another address (Kubernetes: the pod's name); unique per node (default: its gossip address)")
	f.StringVar(&o.Founder, "founder", "", "with --seeds, the node that starts the cluster when none of its seeds answers: "+node.FirstOrdinal+" (the host whose name ends in -0, a StatefulSet's first pod) or a host name; the others keep trying until --join-timeout")
	f.StringVar(&o.Bind, "bind", o.Bind, "gossip address (host:port); the actor transport listens on the same host. Beyond loopback it needs --gossip-key and cluster TLS (dpnode certs)")
	f.StringVar(&o.Advertise, "advertise", "", "address (host[:port]) other nodes reach this one at (default: the bind host, or a private IP)")
	f.IntVar(&o.RPCPort, "data-parallel-rpc-port", o.RPCPort, "port of the actor transport between nodes")
	f.StringVar(&o.GossipKey, "gossip-key", os.Getenv("DPNODE_GOSSIP_KEY"), "base64 key (16, 24 or 32 bytes) that encrypts gossip (default: $DPNODE_GOSSIP_KEY)")
	f.StringVar(&o.GossipProfile, "gossip-profile", o.GossipProfile, "gossip timings: lan, or local for nodes on one machine (a full state sync every 2 s)")
	f.StringVar(&o.TLS.Cert, "cluster-tls-cert", "", "PEM certificate of this node for the actor transport (mutual TLS)")
	f.StringVar(&o.TLS.Key, "cluster-tls-key", "", "PEM private key of --cluster-tls-cert")
	f.StringVar(&o.TLS.CA, "cluster-tls-ca", "", "PEM certificate of the cluster CA that signs every node's certificate")
	f.BoolVar(&o.InsecureCluster, "insecure-cluster", false, "let gossip and the actor transport listen beyond loopback without --gossip-key and cluster TLS (a trusted network only)")
	f.BoolVar(&o.ExpertParallel, "enable-expert-parallel", false, "MoE with expert parallelism: ranks step in lockstep waves (needs a MoE profile)")
	f.DurationVar(&o.CollectiveTimeout, "ep-collective-timeout", o.CollectiveTimeout, "how long a step waits for a lost rank before the others go on without it")
	f.StringVar(&o.Model, "model", "", "model to serve: with --engine llamacpp a GGUF file (default: the simulated profile's model)")
	f.StringSliceVar(&servedNames, "served-model-name", nil, "model name clients use (default: --model); several names (a,b or a b) are each accepted, and the first is the one answers and metrics carry")
	f.StringVar(&o.Engine, "engine", o.Engine, "what the ranks run: "+engineHelp())
	f.StringVar(&o.ChatTemplate, "chat-template", "", "Jinja chat template file to use instead of the model's own")
	f.StringVar(&o.ToolCallParser, "tool-call-parser", "", "llamacpp: read tool calls from the output in the model family's syntax: llama3_json (Llama 3.x), hermes (Qwen 2.5 and 3, Hermes) or mistral")
	f.BoolVar(&o.EnableAutoToolChoice, "enable-auto-tool-choice", false, "llamacpp: let the model choose to call tools (tool_choice auto, the default when a request has tools); needs --tool-call-parser")
	f.BoolVar(&o.TokenizeContentAsText, "tokenize-content-as-text", false, "read chat messages' content as text: a special token's text a user types (<|eot_id|>) stays text and cannot end the turn or forge a system one (vLLM reads it as the token)")
	for _, e := range engines.All() {
		fs := registry.FlagSet(e, o.Engines[e.Name])
		f.AddFlagSet(fs)
		engineFlags[e.Name] = fs
	}
	f.IntVar(&o.GPUs, "gpus", o.GPUs, "virtual GPUs to use where NVML finds no driver")
	f.StringArrayVar(&o.APIKeys, "api-key", envList("DPNODE_API_KEY"), "require this bearer token on /v1 routes; repeat it to accept several (default: $DPNODE_API_KEY)")
	f.StringVar(&o.APIKeyFile, "api-key-file", "", "file of API keys, one a line, also accepted; read again when it changes, so keys rotate without a restart")
	f.StringArrayVar(&o.AdminAPIKeys, "admin-api-key", envList("DPNODE_ADMIN_API_KEY"), "bearer token of the /admin routes (default: $DPNODE_ADMIN_API_KEY; without one they answer only to this machine)")
	f.IntVar(&o.MaxPendingRequests, "max-pending-requests", o.MaxPendingRequests, "requests an API server holds beyond what its ranks run at once (ranks x --max-num-seqs); past it, 503 with Retry-After (-1: as many as the ranks run)")
	f.IntVar(&o.MaxNumSeqs, "max-num-seqs", 0, "most sequences in one engine step (default: the profile's, 256)")
	f.Var((*humanInt)(&o.MaxNumBatchedTokens), "max-num-batched-tokens", "token budget of one engine step; 8k is 8,000, 8K 8,192 (default: the profile's, 8192)")
	f.Var((*humanInt)(&o.MaxModelLen), "max-model-len", "context length, prompt plus output; 32k is 32,000, 32K 32,768 (default: the profile's)")
	f.BoolVar(&o.NoPrefixCaching, "no-enable-prefix-caching", false, "turn prefix caching off")
	addVLLMFlags(f, &o, &vllm)
	f.IntVar(&o.MaxConnections, "max-connections", 0, "HTTP connections open at once; at the cap a new one replaces the longest idle, and /health and /metrics answer on a small reserve (default: the file descriptors allowed less 1024, at most 65536)")
	f.DurationVar(&o.HTTPTimeouts.Write, "client-write-timeout", o.HTTPTimeouts.Write, "a client that takes no part of its response for this long has its request aborted and its connection closed")
	f.DurationVar(&o.DrainTimeout, "drain-timeout", o.DrainTimeout, "on SIGTERM, how long to let requests in flight finish")
	f.BoolVar(&o.LeaveOnTerminate, "leave-on-terminate", false, "on SIGTERM, leave the deployment: drain, then give the ranks back (an elastic deployment shrinks); without it the ranks wait for the node to come back")
	f.DurationVar(&o.JoinTimeout, "join-timeout", o.JoinTimeout, "how long to wait for one of the --seeds to answer, and then, with --data-parallel-start-rank auto, for the coordinator to give the node its ranks")
	f.StringVar(&o.BalancePolicy, "balance-policy", o.BalancePolicy, "how a rank is picked per request: "+strings.Join(dp.PolicyNames, ", ")+" (live: exact in-flight load with prefix-cache affinity; vllm: 4*waiting+running on 100 ms snapshots)")
	f.BoolVar(&o.Migration, "request-migration", o.Migration, "move a request mid-stream off a lost engine, to continue token-exactly on another rank")
	f.IntVar(&o.MaxMigrations, "max-migrations", o.MaxMigrations, "how many lost engines one request may ride through")
	f.IntVar(&o.EngineMaxRestarts, "engine-max-restarts", o.EngineMaxRestarts, "crashes within --engine-restart-window after which a rank is stopped and marked failed (0: never)")
	f.DurationVar(&o.EngineRestartWindow, "engine-restart-window", o.EngineRestartWindow, "window over which engine crashes count")
	f.StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	return cmd
}

// autoInt is a flag that takes a number, or "auto" (dp.Auto); unset, it
// keeps its default (-1).
type autoInt int

func (a *autoInt) String() string {
	switch {
	case a == nil:
		return ""
	case int(*a) == dp.Auto:
		return "auto"
	case *a < 0:
		return ""
	}
	return strconv.Itoa(int(*a))
}

func (a *autoInt) Set(s string) error {
	if strings.EqualFold(s, "auto") {
		*a = dp.Auto
		return nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 {
		return fmt.Errorf("want a number at least 0, or auto; got %q", s)
	}
	*a = autoInt(n)
	return nil
}

func (a *autoInt) Type() string { return "int|auto" }
