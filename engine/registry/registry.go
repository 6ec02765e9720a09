// Package registry is what an engine tells the node: its name, its own
// flags and their checks, and how it opens a node's ranks. The node reads
// engines only through it, so that an engine is one package plus a line in
// the list (package engines).
package registry

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/dpnode/dpnode/engine"
	"github.com/dpnode/dpnode/gpu"
	httpapi "github.com/dpnode/dpnode/http"
)

// Engine is one engine as the node knows it.
type Engine struct {
	// Name is what --engine takes.
	Name string
	// Summary is what --engine's help says of it, in a few words.
	Summary string
	// NewOptions returns the engine's own options at their defaults.
	NewOptions func() Options
	// ModelSuffix, when set, is the file name ending of the models the
	// engine runs (".gguf"): a --model that ends so picks the engine when
	// --engine is not given.
	ModelSuffix string
}

// ForModel returns the engine of engines whose ModelSuffix model ends
// with (case aside); false when none claims it.
func ForModel(engines []Engine, model string) (Engine, bool) {
	for _, e := range engines {
		if e.ModelSuffix != "" && strings.HasSuffix(strings.ToLower(model), strings.ToLower(e.ModelSuffix)) {
			return e, true
		}
	}
	return Engine{}, false
}

// Options are an engine's own settings. Their flags belong to the engine:
// another engine refuses them.
type Options interface {
	// AddFlags binds the options to their flags.
	AddFlags(fs *pflag.FlagSet)
	// Plan checks the options against the node's settings and resolves
	// the engine's defaults, starting nothing. Its errors are about the
	// command line.
	Plan(n Node) (*Plan, error)
}

// Node is what an engine reads of the node's settings. A zero number is
// "not given": the engine's default.
type Node struct {
	// Model is --model; ChatTemplate is a chat template file that
	// replaces the model's own.
	Model        string
	ChatTemplate string
	MaxNumSeqs   int
	// MaxNumBatchedTokens and MaxModelLen as given.
	MaxNumBatchedTokens int
	MaxModelLen         int
	PrefixCaching       bool
	// ExpertParallel asks for lockstep waves; Size is then the
	// deployment's size, 0 when elastic (each join is checked then).
	ExpertParallel bool
	Size           int
	// LocalSize is --data-parallel-size-local, -1 when not given.
	LocalSize int
	Logger    *slog.Logger
}

// Plan is an engine's checked settings for a node.
type Plan struct {
	// Served is the model name clients use when --served-model-name is
	// not given.
	Served string
	// Profile identifies what the ranks serve, for other nodes to check
	// that they serve the same.
	Profile string
	// Scheduler bounds each rank: sequences, step size, context length.
	// A step engine's scheduler runs under it; for an engine that
	// schedules its own, it is what the API server admits and balances.
	Scheduler    engine.SchedulerConfig
	Capabilities engine.Capabilities
	// PrefillWeight, when not 0, is what a step's worth of prefill
	// waiting at a rank weighs in the live policy, in requests
	// (dp.LiveLoad.PrefillWeight): how much sooner a new request's first
	// token comes on a rank with less prefill ahead of it, against one
	// with fewer requests running, depends on how the engine schedules.
	PrefillWeight float64
	// Simulated is true for an engine whose text is not a model's.
	Simulated bool
	// Experts is the model's expert count under expert parallelism: an
	// elastic deployment's size must divide it. 0 otherwise.
	Experts int
	// Devices, when not nil, are the node's local ranks, one each,
	// whatever GPUs the machine has: a server per rank.
	Devices []gpu.Device
	// Open prepares the node's side of the engine; it is called once, as
	// the node starts.
	Open func(ctx context.Context, s Start) (*Opened, error)
}

// Start is what an engine's Open learns of the node it opens on.
type Start struct {
	// LocalSize is the node's local ranks.
	LocalSize int
	// ServesAPI is true on a node with an API server, which tokenizes.
	ServesAPI bool
	Logger    *slog.Logger
}

// Opened is an engine opened on a node.
type Opened struct {
	// Tokenizer is what the node's API server tokenizes with; nil on a
	// node that serves no API.
	Tokenizer engine.Tokenizer
	// Template renders chats; nil for a model without a chat template.
	Template httpapi.ChatTemplate
	// NewCore opens a local rank's engine, again at each restart, off
	// the rank's mailbox; it must return when ctx is done.
	NewCore func(ctx context.Context, rank int, dev gpu.Device) (engine.Core, error)
	// StartTimeout bounds the ranks' start (a model's load); 0 keeps the
	// node's default.
	StartTimeout time.Duration
	// Scheduler, when not nil, replaces the plan's: limits learned as
	// the engine opened.
	Scheduler *engine.SchedulerConfig
	// Describe is what the node's start-up log line says of the engine.
	Describe []any
	// Close releases what Open took; nil when nothing.
	Close func()
}

// Lookup returns the engine named name in list, or an error that lists
// them.
func Lookup(list []Engine, name string) (Engine, error) {
	var names []string
	for _, e := range list {
		if e.Name == name {
			return e, nil
		}
		names = append(names, fmt.Sprintf("%s (%s)", e.Name, e.Summary))
	}
	return Engine{}, fmt.Errorf("--engine %q is not available; the engines are: %s", name, strings.Join(names, ", "))
}

// FlagSet returns e's flags on a set of their own, bound to opts.
func FlagSet(e Engine, opts Options) *pflag.FlagSet {
	fs := pflag.NewFlagSet(e.Name, pflag.ContinueOnError)
	opts.AddFlags(fs)
	return fs
}
