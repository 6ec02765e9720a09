package httpapi

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// TestKeysRotateThroughTheFile: keys given at the start and those of the
// key file are all accepted; a key added to the file is accepted and one
// removed is refused once the file is read again, with no restart.
func TestKeysRotateThroughTheFile(t *testing.T) {
	file := filepath.Join(t.TempDir(), "keys")
	write := func(content string, age time.Duration) {
		if err := os.WriteFile(file, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		// A distinct modification time, as a rewrite seconds apart has.
		at := time.Now().Add(-age)
		if err := os.Chtimes(file, at, at); err != nil {
			t.Fatal(err)
		}
	}
	write("# clients\nold\n\n", time.Hour)
	k, err := NewKeys([]string{"flag-a", "flag-b"}, file)
	if err != nil {
		t.Fatal(err)
	}
	expect := func(allowed map[string]bool) {
		t.Helper()
		for key, want := range allowed {
			if got := k.Allow("Bearer " + key); got != want {
				t.Errorf("key %q allowed %v, want %v", key, got, want)
			}
		}
	}
	expect(map[string]bool{"flag-a": true, "flag-b": true, "old": true, "new": false, "# clients": false, "": false})
	if k.Allow("flag-a") || k.Allow("Basic flag-a") || k.Allow("Bearerflag-a") || k.Allow("Bearer ") {
		t.Error("a key not sent as a bearer token was accepted")
	}
	// The scheme's name is case-insensitive.
	if !k.Allow("bearer flag-a") || !k.Allow("BEARER flag-b") {
		t.Error("a bearer token with the scheme in another case was refused")
	}

	// Rotation: the new key joins, then the old one goes.
	write("old\nnew\n", 30*time.Minute)
	k.mu.Lock()
	k.checked = time.Time{} // as if a second had passed
	k.mu.Unlock()
	expect(map[string]bool{"old": true, "new": true})
	write("new\n", 0)
	k.mu.Lock()
	k.checked = time.Time{}
	k.mu.Unlock()
	expect(map[string]bool{"old": false, "new": true, "flag-a": true})

	// A file that vanishes mid-rotation keeps the keys read before.
	if err := os.Remove(file); err != nil {
		t.Fatal(err)
	}
	k.mu.Lock()
	k.checked = time.Time{}
	k.mu.Unlock()
	expect(map[string]bool{"new": true})
}

func TestBadKeysAreRefusedAtStart(t *testing.T) {
	if _, err := NewKeys([]string{"has space"}, ""); err == nil {
		t.Error("a key with a space was accepted")
	}
	if _, err := NewKeys(nil, filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Error("a missing key file was accepted")
	}
	if k, err := NewKeys(nil, ""); k != nil || err != nil {
		t.Errorf("no keys: %v %v, want nil (open)", k, err)
	}
}

// TestFailedKeyReloadsAreReported: a key file that cannot be read again
// (gone, or a malformed line) keeps the keys read before, and says so: an
// error logged when the failure begins or changes, every failed read
// counted, and a line when the file reads again.
func TestFailedKeyReloadsAreReported(t *testing.T) {
	file := filepath.Join(t.TempDir(), "keys")
	if err := os.WriteFile(file, []byte("old\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	k, err := NewKeys(nil, file)
	if err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	reg := prometheus.NewRegistry()
	if err := k.Observe(slog.New(slog.NewTextHandler(&logs, nil)), reg); err != nil {
		t.Fatal(err)
	}
	again := func(key string) bool {
		k.mu.Lock()
		k.checked = time.Time{} // as if a second had passed
		k.mu.Unlock()
		return k.Allow("Bearer " + key)
	}
	failures := func() float64 {
		mfs, err := reg.Gather()
		if err != nil || len(mfs) != 1 {
			t.Fatalf("gathered %d families: %v", len(mfs), err)
		}
		return mfs[0].GetMetric()[0].GetCounter().GetValue()
	}
	if err := os.Remove(file); err != nil {
		t.Fatal(err)
	}
	if !again("old") || !again("old") {
		t.Fatal("the keys read before were dropped when the file vanished")
	}
	if n := failures(); n != 2 {
		t.Fatalf("%v failures counted, want 2", n)
	}
	if n := strings.Count(logs.String(), "level=ERROR"); n != 1 {
		t.Fatalf("%d errors logged for one failure that lasted, want 1:\n%s", n, logs.String())
	}
	if err := os.WriteFile(file, []byte("new\nhas space\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if again("new") {
		t.Fatal("a key of a malformed file was accepted")
	}
	if !strings.Contains(logs.String(), "line 2") {
		t.Fatalf("the malformed line was not logged:\n%s", logs.String())
	}
	if err := os.WriteFile(file, []byte("new\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if !again("new") || again("old") {
		t.Fatal("the mended file's keys are not the ones in force")
	}
	if !strings.Contains(logs.String(), "read the API key file again") || failures() != 3 {
		t.Fatalf("the recovery was not logged, or %v failures counted (want 3):\n%s", failures(), logs.String())
	}
}
