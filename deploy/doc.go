// Package deploy holds the files that deploy dpnode: Kubernetes manifests
// (kubernetes/), a container image (Dockerfile) and a Grafana dashboard
// (grafana/). It has no code of its own; its tests check those files
// against the dpnode beside them in the source tree: the flags its
// containers pass exist in `dpnode join`, the ports they name are ones that
// dpnode opens, and the dashboard's queries name series that dpnode exports.
//
// It is a module of its own so that dpnode does not depend on kustomize and
// the Kubernetes API types.
package deploy
