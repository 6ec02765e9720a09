// Package deploy holds the files that deploy dpnode: a container image
// (Dockerfile), Kubernetes manifests (kubernetes/) and a Grafana dashboard
// (grafana/). Its packages have no code of their own; their tests check
// those files against the dpnode beside them in the source tree: the flags
// the containers pass exist in `dpnode join`, the ports they name are ones
// that dpnode opens, and the dashboard's queries name series that dpnode
// exports.
//
// It is a module of its own so that dpnode does not depend on kustomize and
// the Kubernetes API types.
package deploy
