package toolcall

import (
	"crypto/rand"
	"encoding/hex"
)

// alphanumeric are the characters of a Mistral call id.
const alphanumeric = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"

// NewCallID returns a fresh call id: 9 letters and digits for Mistral, whose
// chat templates refuse other ids, and "chatcmpl-tool-" and 32 lowercase hex
// digits otherwise, as vLLM makes them.
func NewCallID(f Format) string {
	if f == Mistral {
		id := make([]byte, 0, 9)
		var b [16]byte
		for len(id) < cap(id) {
			rand.Read(b[:])
			for _, c := range b {
				// 248 is 4×62: taking only bytes below it keeps the
				// characters equally likely.
				if c < 248 && len(id) < cap(id) {
					id = append(id, alphanumeric[c%62])
				}
			}
		}
		return string(id)
	}
	var b [16]byte
	rand.Read(b[:])
	return "chatcmpl-tool-" + hex.EncodeToString(b[:])
}
