// Package engines is the list of the engines a node can run: each is a
// package of its own that tells the node, through package registry, its
// name, its flags and how it opens ranks.
package engines

import (
	"github.com/dpnode/dpnode/engine/registry"
	"github.com/dpnode/dpnode/engines/llamaengine"
	"github.com/dpnode/dpnode/engines/openai"
	"github.com/dpnode/dpnode/engines/simengine"
)

// All are the engines, the default first.
func All() []registry.Engine {
	return []registry.Engine{simengine.Engine, llamaengine.Engine, openai.Engine}
}

// Lookup returns the engine named name, or an error that lists them.
func Lookup(name string) (registry.Engine, error) { return registry.Lookup(All(), name) }
