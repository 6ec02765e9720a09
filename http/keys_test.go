package httpapi

import (
	"os"
	"path/filepath"
	"testing"
	"time"
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
