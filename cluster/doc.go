// Package cluster runs a node: it checks the command line as a whole,
// discovers the GPUs, starts the node's actors and serves its HTTP API
// until it is told to stop, then drains.
package cluster
