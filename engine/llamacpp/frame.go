package llamacpp

import (
	"encoding/binary"
	"fmt"
	"io"

	"google.golang.org/protobuf/proto"
)

// MaxFrame bounds one message between an engine and its worker. The
// largest is a vocabulary (about 1.5 MB for 150k tokens) or a step of a
// long prompt (4 bytes a token).
const MaxFrame = 64 << 20

// WriteFrame writes m with its length before it.
func WriteFrame(w io.Writer, m proto.Message) error {
	b, err := proto.Marshal(m)
	if err != nil {
		return err
	}
	if len(b) > MaxFrame {
		return fmt.Errorf("llamacpp: a message of %d bytes is over the %d-byte limit", len(b), MaxFrame)
	}
	buf := make([]byte, 4+len(b))
	binary.LittleEndian.PutUint32(buf, uint32(len(b)))
	copy(buf[4:], b)
	_, err = w.Write(buf)
	return err
}

// ReadFrame reads one message into m. It returns io.EOF when the other
// side closed between messages.
func ReadFrame(r io.Reader, m proto.Message) error {
	var head [4]byte
	if _, err := io.ReadFull(r, head[:]); err != nil {
		return err
	}
	n := binary.LittleEndian.Uint32(head[:])
	if n > MaxFrame {
		return fmt.Errorf("llamacpp: a message of %d bytes is over the %d-byte limit", n, MaxFrame)
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(r, b); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return err
	}
	return proto.Unmarshal(b, m)
}
