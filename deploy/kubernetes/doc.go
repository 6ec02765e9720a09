// Package kubernetes holds no code: its directories are kustomizations
// that deploy dpnode on Kubernetes (base, overlays, components, and an
// example of the Secrets they read), and its tests build each of them and
// check it against the dpnode built from this source tree.
//
// The tests link kustomize, which imports Go's plugin package; a binary
// that does is bound eagerly, and go-nvml's symbols that no driver has
// (dpnode's, through its actors) would fail it at start. So the dashboard's
// tests, which link dpnode's metrics, are a package of their own.
package kubernetes
