package httpapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"time"
)

// sseWriter writes server-sent events. Headers go out with the first
// event, so that an error that comes first can still be a plain HTTP
// error with its status.
type sseWriter struct {
	w  http.ResponseWriter
	rc *http.ResponseController
	// timeout bounds each flush: a client that takes nothing for that
	// long is dropped, and err says so.
	timeout time.Duration
	err     error
	buf     bytes.Buffer
	started bool
}

func (o *sseWriter) start() {
	h := o.w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("Connection", "keep-alive")
	h.Set("X-Accel-Buffering", "no")
	o.w.WriteHeader(http.StatusOK)
	o.started = true
}

func (o *sseWriter) data(v any) {
	if !o.started {
		o.start()
	}
	o.buf.WriteString("data: ")
	enc := json.NewEncoder(&o.buf)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v)
	o.buf.WriteString("\n")
}

func newSSEWriter(w http.ResponseWriter, timeout time.Duration) *sseWriter {
	return &sseWriter{w: w, rc: http.NewResponseController(w), timeout: timeout}
}

// flush sends what is buffered within the write timeout; after the first
// failure it sends nothing.
func (o *sseWriter) flush() {
	if o.err != nil {
		o.buf.Reset()
		return
	}
	if err := o.rc.SetWriteDeadline(time.Now().Add(o.timeout)); err != nil && !errors.Is(err, http.ErrNotSupported) {
		o.err = err
	}
	if o.err == nil {
		_, o.err = o.w.Write(o.buf.Bytes())
	}
	if o.err == nil {
		o.err = o.rc.Flush()
	}
	o.buf.Reset()
}

// liftDeadline clears the write deadline, which net/http would otherwise
// keep into the connection's next request.
func (o *sseWriter) liftDeadline() { _ = o.rc.SetWriteDeadline(time.Time{}) }

func (o *sseWriter) done() {
	if !o.started {
		o.start()
	}
	o.buf.WriteString("data: [DONE]\n\n")
	o.flush()
}
