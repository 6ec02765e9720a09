package node

import (
	"context"

	"github.com/dpnode/dpnode/dp"
	"github.com/dpnode/dpnode/engine/registry"
)

// openEngine opens the node's engine (a llama.cpp model's tokenizer
// loads here) and adopts what it learned as it opened.
func (p *plan) openEngine(ctx context.Context, o Options, topo dp.Topology) (*registry.Opened, error) {
	op, err := p.engine.Open(ctx, registry.Start{LocalSize: topo.LocalSize, ServesAPI: topo.ServesAPI(), Logger: o.Logger})
	if err != nil {
		return nil, err
	}
	if op.Close == nil {
		op.Close = func() {}
	}
	if op.Scheduler != nil {
		p.scheduler = *op.Scheduler
	}
	return op, nil
}
