//go:build chaos

package actors

import (
	"fmt"
	"time"

	"github.com/asynkron/protoactor-go/actor"
)

// injectPanic makes the actor that receives it panic, as a bug or a GPU
// fault would.
type injectPanic struct{ what string }

func init() {
	faultHook = func(ctx actor.Context) bool {
		if p, ok := ctx.Message().(*injectPanic); ok {
			panic("injected fault: " + p.what)
		}
		return false
	}
}

const faultTimeout = 5 * time.Second

// InjectFault crashes one of the node's actors: "engine" (of a local rank),
// "api-server" or "coordinator" (when it runs on this node).
func (n *Node) InjectFault(target string, rank int) error {
	var pid *actor.PID
	switch target {
	case "engine":
		if !n.cfg.Topology.Hosts(rank) {
			return fmt.Errorf("actors: rank %d is not on this node", rank)
		}
		pid = actor.NewPID(n.system.Address(), engineID(rank))
	case "api-server":
		pid = n.apiServer
	case "coordinator":
		res, err := n.system.Root.RequestFuture(n.root, &getMembers{}, faultTimeout).Result()
		if err != nil {
			return err
		}
		if !res.(*membersView).running {
			return fmt.Errorf("actors: the coordinator does not run on this node")
		}
		pid = actor.NewPID(n.system.Address(), coordinatorID)
	default:
		return fmt.Errorf("actors: unknown fault target %q (engine, api-server, coordinator)", target)
	}
	n.system.Root.Send(pid, &injectPanic{what: target})
	return nil
}
