package httpapi

import (
	"crypto/sha256"
	_ "embed"
	"encoding/base64"
	"fmt"
	"net/http"
	"strings"
)

func (s *Server) cluster(w http.ResponseWriter, r *http.Request) {
	v, err := s.cfg.Backend.View(r.Context())
	if err != nil {
		writeError(w, &apiError{Status: http.StatusServiceUnavailable, Message: err.Error(), Type: "server_error"})
		return
	}
	writeJSON(w, http.StatusOK, v)
}

// clusterPage is the live cluster page: static, with no data in it, so it
// is served without a key; its script asks /v1/cluster, which needs one.
//
//go:embed cluster.html
var clusterPage []byte

// clusterPagePolicy lets the page run its own inline script and style and
// nothing else: no other origin, no frame around it.
var clusterPagePolicy = fmt.Sprintf("default-src 'none'; script-src %s; style-src %s; connect-src 'self'; img-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
	inlineHash(clusterPage, "script"), inlineHash(clusterPage, "style"))

// inlineHash is the CSP source of the page's one inline element tag.
func inlineHash(page []byte, tag string) string {
	_, rest, ok := strings.Cut(string(page), "<"+tag+">")
	body, _, ok2 := strings.Cut(rest, "</"+tag+">")
	if !ok || !ok2 {
		panic("httpapi: cluster.html has no <" + tag + "> element")
	}
	sum := sha256.Sum256([]byte(body))
	return "'sha256-" + base64.StdEncoding.EncodeToString(sum[:]) + "'"
}

func (s *Server) clusterPage(w http.ResponseWriter, _ *http.Request) {
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Cache-Control", "no-cache")
	h.Set("Content-Security-Policy", clusterPagePolicy)
	h.Set("X-Content-Type-Options", "nosniff")
	w.Write(clusterPage)
}
