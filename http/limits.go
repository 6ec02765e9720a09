package httpapi

import (
	"fmt"
	"math"
	"strconv"

	"github.com/dpnode/dpnode/engine"
)

// The limits of one call. vLLM has none of these but the body size, so a
// single request can make every request of its rank slower (a list of
// millions of stop token ids is checked for each token sampled) or make
// the tokenizer, which every request goes through, busy for seconds. The
// limits are far above what clients send.
const (
	// maxChoices bounds n times the number of prompts of one call.
	maxChoices = 128
	// maxStops bounds the stop strings, and maxStopBytes each one's length:
	// the text of every token is matched against them (OpenAI takes 4).
	maxStops     = 32
	maxStopBytes = 1024
	// maxStopTokenIDs bounds stop_token_ids, as the engine does.
	maxStopTokenIDs = engine.MaxStopTokenIDs
	// maxMessages bounds a conversation, as OpenAI does.
	maxMessages = 2048
	// maxContentParts bounds the content parts of one message.
	maxContentParts = 4096
	// maxLogitBias bounds logit_bias's entries.
	maxLogitBias = 1024
	// maxCacheSaltBytes bounds cache_salt.
	maxCacheSaltBytes = 1024
	// maxBodyList bounds every other list and object of a body (a JSON
	// schema's, a tool's), maxBodyDepth their nesting, and
	// maxBodyContainers how many there are in all: each decodes into
	// something allocated, and limits on lengths alone do not bound how
	// many nest.
	maxBodyList       = 4096
	maxBodyDepth      = 64
	maxBodyContainers = 1 << 16
)

// limitError is the 400 of a list over its limit.
func limitError(param string, n, limit int, what string) *apiError {
	return badRequest(fmt.Sprintf("%s has %d %s; at most %d are allowed", param, n, what, limit), param)
}

// checkLists checks the parameters both endpoints share against the limits,
// before any work is done for the call.
func checkLists(p *commonParams) *apiError {
	switch {
	case len(p.Stop) > maxStops:
		return limitError("stop", len(p.Stop), maxStops, "strings")
	case len(p.StopTokenIDs) > maxStopTokenIDs:
		return limitError("stop_token_ids", len(p.StopTokenIDs), maxStopTokenIDs, "token ids")
	case len(p.LogitBias) > maxLogitBias:
		return limitError("logit_bias", len(p.LogitBias), maxLogitBias, "entries")
	}
	if p.CacheSalt != nil && (*p.CacheSalt == "" || len(*p.CacheSalt) > maxCacheSaltBytes) {
		return badRequest(fmt.Sprintf("cache_salt must be a non-empty string of at most %d bytes", maxCacheSaltBytes), "cache_salt")
	}
	for _, s := range p.Stop {
		switch {
		case s == "":
			return badRequest("stop strings must not be empty", "stop")
		case len(s) > maxStopBytes:
			return badRequest(fmt.Sprintf("a stop string of %d bytes is longer than the limit of %d", len(s), maxStopBytes), "stop")
		}
	}
	for k, v := range p.LogitBias {
		if id, err := strconv.ParseUint(k, 10, 32); err != nil || id > math.MaxInt32 {
			return badRequest(fmt.Sprintf("logit_bias keys must be token ids, got %q", k), "logit_bias")
		}
		if v < -100 || v > 100 {
			return badRequest(fmt.Sprintf("logit_bias values must be between -100 and 100, got %v", v), "logit_bias")
		}
	}
	return nil
}

// vocabulary is what the server knows of the tokenizer's vocabulary; zero
// values mean unknown.
func (s *Server) vocabulary() (size, maxTokenBytes int) {
	if v, ok := s.cfg.Tokenizer.(engine.Vocabulary); ok {
		return v.VocabSize(), v.MaxTokenBytes()
	}
	return 0, 0
}

// checkTextLength refuses a prompt text that cannot fit in the context
// however it tokenizes: each token stands for at most MaxTokenBytes bytes.
// Tokenizing it would take the tokenizer, which every call shares, for as
// long as a 16 MiB text takes.
func (s *Server) checkTextLength(bytes int, param string) *apiError {
	if _, per := s.vocabulary(); per > 0 && bytes > per*s.cfg.MaxModelLen {
		return badRequest(fmt.Sprintf("the prompt's %d bytes are more than this model's context of %d tokens can hold", bytes, s.cfg.MaxModelLen), param)
	}
	return nil
}

// checkTokenIDs refuses token ids outside the vocabulary: llama.cpp would
// fail the step of every request on the rank.
func (s *Server) checkTokenIDs(ids []uint32, param string) *apiError {
	size, _ := s.vocabulary()
	if size <= 0 {
		return nil
	}
	for _, id := range ids {
		if id >= uint32(size) {
			return badRequest(fmt.Sprintf("token id %d is out of the vocabulary, which has %d tokens", id, size), param)
		}
	}
	return nil
}
