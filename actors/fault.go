package actors

import "github.com/asynkron/protoactor-go/actor"

// faultHook sees every message of the engine, API server and coordinator
// actors before they do, and may take it. It is nil except in builds with
// the chaos tag, where it crashes actors on demand for the chaos suite.
var faultHook func(ctx actor.Context) bool
