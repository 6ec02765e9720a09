// Package node is dpnode's composition root: it turns one Options tree
// (the command line, checked as a whole, with every default) into a
// running node. Start goes in steps: listen, join the cluster, claim
// ranks, start the engines, serve the HTTP API, with one cleanup stack
// that undoes whatever a failed step left behind; Running drains and
// stops the node. The engine factory and the actor transport (with its
// shared secret) live here too, and so do the node-level integration
// tests, which run whole nodes, in process or as processes.
package node
