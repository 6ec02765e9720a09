package main

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
)

// newBareCommand is "dpbench bare": a bare Go HTTP server that answers
// /v1/completions with the bytes dpnode streams, one flushed chunk per
// token, and does nothing else. Loaded as dpnode is, it is the limit a
// serving runtime can reach on the machine: what dpnode adds over it
// (actors, scheduling, balancing) is the runtime's overhead.
func newBareCommand() *cobra.Command {
	var listen, model string
	cmd := &cobra.Command{
		Use:   "bare",
		Short: "Serve /v1/completions as a bare Go HTTP server (the overhead baseline)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ln, err := net.Listen("tcp", listen)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "bare server on http://%s\n", ln.Addr())
			srv := &http.Server{Handler: bareHandler(model), ReadHeaderTimeout: 10 * time.Second}
			go func() {
				<-cmd.Context().Done()
				srv.Close()
			}()
			if err := srv.Serve(ln); err != http.ErrServerClosed {
				return err
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&listen, "listen", "127.0.0.1:8001", "address to listen on")
	cmd.Flags().StringVar(&model, "model", "meta-llama/Llama-3.1-8B-Instruct", "model name to report")
	return cmd
}

func bareHandler(model string) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/models", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"object":"list","data":[{"id":%q,"object":"model","owned_by":"bare"}]}`, model)
	})
	mux.HandleFunc("POST /v1/completions", func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Prompt    []uint32 `json:"prompt"`
			MaxTokens int      `json:"max_tokens"`
			Stream    bool     `json:"stream"`
		}
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.MaxTokens < 1 {
			http.Error(w, `{"error":{"message":"bad request"}}`, http.StatusBadRequest)
			return
		}
		created := strconv.FormatInt(time.Now().Unix(), 10)
		if !req.Stream {
			w.Header().Set("Content-Type", "application/json")
			text := strings.Repeat(" token", req.MaxTokens)
			fmt.Fprintf(w, `{"id":"cmpl-bare0000000000000000000000","object":"text_completion","created":%s,"model":"%s","choices":[{"index":0,"text":"%s","logprobs":null,"finish_reason":"length"}],"usage":{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d,"prompt_tokens_details":{"cached_tokens":0}}}`,
				created, model, text, len(req.Prompt), req.MaxTokens, len(req.Prompt)+req.MaxTokens)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("Cache-Control", "no-cache")
		flusher, _ := w.(http.Flusher)
		head := `data: {"id":"cmpl-bare0000000000000000000000","object":"text_completion","created":` + created + `,"model":"` + model + `","choices":[{"index":0,"text":" token","logprobs":null,"finish_reason":`
		for i := range req.MaxTokens {
			finish := "null"
			if i == req.MaxTokens-1 {
				finish = `"length"`
			}
			fmt.Fprint(w, head, finish, "}]}\n\n")
			if flusher != nil {
				flusher.Flush()
			}
		}
		fmt.Fprintf(w, `data: {"id":"cmpl-bare0000000000000000000000","object":"text_completion","created":%s,"model":"%s","choices":[],"usage":{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d,"prompt_tokens_details":{"cached_tokens":0}}}`+"\n\ndata: [DONE]\n\n",
			created, model, len(req.Prompt), req.MaxTokens, len(req.Prompt)+req.MaxTokens)
	})
	return mux
}
