// Package grafana holds no code: dpnode.json is a Grafana dashboard of the
// series dpnode exports, and the tests check each query against the
// series that dpnode's own code registers.
package grafana
