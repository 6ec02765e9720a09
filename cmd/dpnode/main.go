// Command dpnode serves a large language model with data parallelism
// across GPUs and nodes, behind the OpenAI HTTP API.
package main

import (
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	dpnode "github.com/dpnode/dpnode"
	"github.com/dpnode/dpnode/cluster"
	"github.com/dpnode/dpnode/dp"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	if err := newRootCommand().Execute(); err != nil {
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
		Version:       version,
	}
	root.AddCommand(newJoinCommand())
	return root
}

func newJoinCommand() *cobra.Command {
	o := cluster.DefaultOptions()
	var logLevel string
	cmd := &cobra.Command{
		Use:   "join",
		Short: "Start a node: one engine per local GPU, and an OpenAI-compatible API server",
		Long: `Start a node: one engine actor per data-parallel rank (one GPU each) and an
API server that balances requests over them and serves the OpenAI HTTP API.
With no seeds it starts a new cluster that others can join; with --seeds it
joins one by gossip. Where no GPU backend is configured the engines run the
calibrated simulated executor.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var level slog.Level
			if err := level.UnmarshalText([]byte(logLevel)); err != nil {
				return fmt.Errorf("invalid flags: --log-level: %w", err)
			}
			o.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
			o.Profiles = dpnode.SimProfiles
			o.Version = version
			o.PortSet = cmd.Flags().Changed("port")
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGTERM, syscall.SIGINT)
			defer stop()
			return cluster.Run(ctx, o)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.Host, "host", o.Host, "address the HTTP server listens on")
	f.IntVar(&o.Port, "port", o.Port, "HTTP port")
	f.IntVar(&o.MetricsPort, "metrics-port", o.MetricsPort, "also serve /metrics, /health and /v1/cluster on this port (a headless node has no other; -1: off)")
	f.IntVar(&o.DataParallelSize, "data-parallel-size", o.DataParallelSize, "ranks in the whole deployment (default: the local ranks)")
	f.IntVar(&o.DataParallelSizeLocal, "data-parallel-size-local", o.DataParallelSizeLocal, "ranks on this node, one GPU each (default: one per GPU found)")
	f.IntVar(&o.DataParallelStartRank, "data-parallel-start-rank", o.DataParallelStartRank, "first rank on this node (default 0)")
	f.IntVar(&o.DataParallelRank, "data-parallel-rank", o.DataParallelRank, "serve only this rank behind an outside load balancer (external mode)")
	f.StringVar(&o.LB, "data-parallel-lb", "", "who balances: hybrid (each node over its own ranks; the default), internal, or external")
	f.BoolVar(&o.HybridLB, "data-parallel-hybrid-lb", false, "same as --data-parallel-lb hybrid")
	f.BoolVar(&o.ExternalLB, "data-parallel-external-lb", false, "same as --data-parallel-lb external")
	f.BoolVar(&o.Headless, "headless", false, "host ranks without an API server (internal mode)")
	f.StringSliceVar(&o.Seeds, "seeds", nil, "gossip addresses (host:port) of cluster members to join; none starts a new cluster")
	f.StringVar(&o.Bind, "bind", o.Bind, "gossip address (host:port); the actor transport listens on the same host")
	f.StringVar(&o.Advertise, "advertise", "", "address (host[:port]) other nodes reach this one at (default: the bind host, or a private IP)")
	f.IntVar(&o.RPCPort, "data-parallel-rpc-port", o.RPCPort, "port of the actor transport between nodes")
	f.StringVar(&o.GossipKey, "gossip-key", os.Getenv("DPNODE_GOSSIP_KEY"), "base64 key (16, 24 or 32 bytes) that encrypts gossip (default: $DPNODE_GOSSIP_KEY)")
	f.StringVar(&o.GossipProfile, "gossip-profile", o.GossipProfile, "gossip timings: lan, or local for nodes on one machine (faster failure detection)")
	f.StringVar(&o.TLS.Cert, "cluster-tls-cert", "", "PEM certificate of this node for the actor transport (mutual TLS)")
	f.StringVar(&o.TLS.Key, "cluster-tls-key", "", "PEM private key of --cluster-tls-cert")
	f.StringVar(&o.TLS.CA, "cluster-tls-ca", "", "PEM certificate of the cluster CA that signs every node's certificate")
	f.BoolVar(&o.ExpertParallel, "enable-expert-parallel", false, "MoE with expert parallelism: ranks step in lockstep waves (needs a MoE profile)")
	f.DurationVar(&o.CollectiveTimeout, "ep-collective-timeout", o.CollectiveTimeout, "how long a step waits for a lost rank before the others go on without it")
	f.StringVar(&o.Model, "model", "", "model to serve (default: the simulated profile's model)")
	f.StringVar(&o.ServedModelName, "served-model-name", "", "model name clients use (default: --model)")
	f.StringVar(&o.Engine, "engine", o.Engine, "executor: sim (the calibrated simulated executor)")
	f.StringVar(&o.SimProfile, "sim-profile", o.SimProfile, "simulated GPU+model profile: a built-in name or a path to a profile .json")
	f.Float64Var(&o.SimTimeScale, "sim-time-scale", o.SimTimeScale, "multiply simulated step times by this (0 runs steps at no cost)")
	f.IntVar(&o.GPUs, "gpus", o.GPUs, "virtual GPUs to use where NVML finds no driver")
	f.StringVar(&o.APIKey, "api-key", os.Getenv("DPNODE_API_KEY"), "require this bearer token on /v1 routes (default: $DPNODE_API_KEY)")
	f.IntVar(&o.MaxNumSeqs, "max-num-seqs", 0, "most sequences in one engine step (default: the profile's, 256)")
	f.IntVar(&o.MaxNumBatchedTokens, "max-num-batched-tokens", 0, "token budget of one engine step (default: the profile's, 8192)")
	f.IntVar(&o.MaxModelLen, "max-model-len", 0, "context length, prompt plus output (default: the profile's)")
	f.BoolVar(&o.NoPrefixCaching, "no-enable-prefix-caching", false, "turn prefix caching off")
	f.DurationVar(&o.DrainTimeout, "drain-timeout", o.DrainTimeout, "on SIGTERM, how long to let requests in flight finish")
	f.StringVar(&o.BalancePolicy, "balance-policy", o.BalancePolicy, "how a rank is picked per request: "+strings.Join(dp.PolicyNames, ", ")+" (live: exact in-flight load with prefix-cache affinity; vllm: 4*waiting+running on 100 ms snapshots)")
	f.BoolVar(&o.Migration, "request-migration", o.Migration, "move a request mid-stream off a lost engine, to continue token-exactly on another rank")
	f.IntVar(&o.MaxMigrations, "max-migrations", o.MaxMigrations, "how many lost engines one request may ride through")
	f.IntVar(&o.EngineMaxRestarts, "engine-max-restarts", o.EngineMaxRestarts, "crashes within --engine-restart-window after which a rank is stopped and marked failed (0: never)")
	f.DurationVar(&o.EngineRestartWindow, "engine-restart-window", o.EngineRestartWindow, "window over which engine crashes count")
	f.StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	return cmd
}
