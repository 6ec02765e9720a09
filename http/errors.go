package httpapi

import (
	"encoding/json"
	"net/http"
	"strconv"
)

// apiError is OpenAI's error object.
type apiError struct {
	Status  int     `json:"-"`
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    *string `json:"code"`
	// RetryAfter, in seconds, is sent as the Retry-After header when not 0.
	RetryAfter int `json:"-"`
}

func (e *apiError) Error() string { return e.Message }

type errorBody struct {
	Error *apiError `json:"error"`
}

func strp(s string) *string { return &s }

func badRequest(msg string, param string) *apiError {
	e := &apiError{Status: http.StatusBadRequest, Message: msg, Type: "invalid_request_error"}
	if param != "" {
		e.Param = strp(param)
	}
	return e
}

func writeError(w http.ResponseWriter, e *apiError) {
	if e.RetryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(e.RetryAfter))
	}
	writeJSON(w, e.Status, errorBody{Error: e})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v)
}
