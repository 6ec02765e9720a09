package httpapi

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Keys are the bearer tokens a route accepts: the ones given when the
// server starts, and those of a key file, one a line, which is read again
// when it changes. Several keys are accepted at once, so that a key is
// rotated by adding the new one, moving the clients over, then removing
// the old one, with no restart and no client refused on the way.
//
// Concurrency: safe for concurrent use.
type Keys struct {
	static [][sha256.Size]byte
	file   string

	mu sync.Mutex
	// fromFile are the file's keys as last read; checked is when the file
	// was last looked at, and mod and size what it was then.
	fromFile [][sha256.Size]byte
	checked  time.Time
	mod      time.Time
	size     int64
	// failing is the last reload's error, "" when it succeeded: a failure
	// is logged when it begins or changes, not every second it lasts.
	failing  string
	logger   *slog.Logger
	failures prometheus.Counter
}

// keyFileCheck is how often a key file is looked at for changes, at most.
const keyFileCheck = time.Second

// NewKeys returns the keys given and those of file (none when empty). It
// returns nil when there are neither: the routes are open.
func NewKeys(keys []string, file string) (*Keys, error) {
	k := &Keys{file: file}
	for _, key := range keys {
		if err := checkKey(key); err != nil {
			return nil, err
		}
		k.static = append(k.static, sha256.Sum256([]byte(key)))
	}
	if file != "" {
		if err := k.reload(time.Now()); err != nil {
			return nil, err
		}
	}
	if len(k.static) == 0 && file == "" {
		return nil, nil
	}
	return k, nil
}

func checkKey(key string) error {
	if key == "" || strings.ContainsAny(key, " \t\r\n") {
		return errors.New("an API key must be non-empty and hold no whitespace")
	}
	return nil
}

// Observe logs the key file's failed reloads at error, and counts them in
// dpnode_api_key_file_reload_failures_total on reg, which may be nil.
func (k *Keys) Observe(logger *slog.Logger, reg prometheus.Registerer) error {
	if k == nil || k.file == "" {
		return nil
	}
	c := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "dpnode_api_key_file_reload_failures_total",
		Help: "Reads of --api-key-file that failed (a missing file, a malformed line): the keys read before stay in force, so a key removed from the file is still accepted until it reads again.",
	})
	if reg != nil {
		if err := reg.Register(c); err != nil {
			return fmt.Errorf("httpapi: registering metrics: %w", err)
		}
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	k.logger, k.failures = logger, c
	return nil
}

// reloadAndReport reloads the key file and reports a failure, or the end
// of one. k.mu is held.
func (k *Keys) reloadAndReport(now time.Time) {
	err := k.reload(now)
	if k.logger == nil {
		return
	}
	switch {
	case err != nil:
		k.failures.Inc()
		if err.Error() != k.failing {
			k.logger.Error("could not read the API key file again: the keys read before stay in force, a key removed from it is still accepted",
				"file", k.file, "error", err)
		}
		k.failing = err.Error()
	case k.failing != "":
		k.failing = ""
		k.logger.Info("read the API key file again", "file", k.file, "keys", len(k.fromFile))
	}
}

// reload reads the key file if it changed since it was last read. A file
// that cannot be read keeps the keys read before: a rotation that writes
// the file anew must not lock every client out for a moment.
func (k *Keys) reload(now time.Time) error {
	k.checked = now
	st, err := os.Stat(k.file)
	if err != nil {
		return fmt.Errorf("the API key file: %w", err)
	}
	if st.ModTime().Equal(k.mod) && st.Size() == k.size && k.fromFile != nil {
		return nil
	}
	b, err := os.ReadFile(k.file)
	if err != nil {
		return fmt.Errorf("the API key file: %w", err)
	}
	keys := [][sha256.Size]byte{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for line := 1; sc.Scan(); line++ {
		key := strings.TrimSpace(sc.Text())
		if key == "" || strings.HasPrefix(key, "#") {
			continue
		}
		if err := checkKey(key); err != nil {
			return fmt.Errorf("the API key file %s, line %d: %w", k.file, line, err)
		}
		keys = append(keys, sha256.Sum256([]byte(key)))
	}
	k.fromFile, k.mod, k.size = keys, st.ModTime(), st.Size()
	return nil
}

// Allow reports whether an Authorization header carries one of the keys,
// as a bearer token (the scheme's name in any case, as RFC 9110 has it).
// Keys are compared by their SHA-256, in constant time, each of them.
func (k *Keys) Allow(authorization string) bool {
	scheme, token, ok := strings.Cut(authorization, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") || token == "" {
		return false
	}
	sum := sha256.Sum256([]byte(token))
	found := 0
	for _, key := range k.static {
		found |= subtle.ConstantTimeCompare(sum[:], key[:])
	}
	if k.file != "" {
		k.mu.Lock()
		if now := time.Now(); now.Sub(k.checked) >= keyFileCheck {
			k.reloadAndReport(now) // the keys read before stay on a failure
		}
		fromFile := k.fromFile
		k.mu.Unlock()
		for _, key := range fromFile {
			found |= subtle.ConstantTimeCompare(sum[:], key[:])
		}
	}
	return found == 1
}
