// Package httpapi serves a node's OpenAI-compatible HTTP API with chi:
// /v1/models, /v1/completions and /v1/chat/completions (with SSE
// streaming), /health, /metrics, /v1/cluster and /version.
//
// Handlers run outside the actors: they tokenize, hand requests to the API
// server actor, and drain each call's stream, turning tokens into text and
// matching stop strings as they go. A handler whose client goes away, or
// whose stop string matched, aborts its requests in their engines.
package httpapi
