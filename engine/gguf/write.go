package gguf

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"math"
)

// Tensor is a tensor to write: its data is F32 values, row-major with the
// first of Dims fastest, as ggml lays them out.
type Tensor struct {
	Name string
	Dims []uint64
	Data []float32
}

// Write writes a GGUF file of the given metadata and F32 tensors, with
// data aligned to DefaultAlignment.
func Write(out io.Writer, kv []KV, tensors []Tensor) error {
	w := &encoder{w: bufio.NewWriterSize(out, 1<<16)}
	w.raw([]byte(Magic))
	w.u32(Version)
	w.u64(uint64(len(tensors)))
	w.u64(uint64(len(kv)))
	seen := map[string]bool{}
	for _, e := range kv {
		if seen[e.Key] {
			return fmt.Errorf("gguf: metadata key %q given twice", e.Key)
		}
		seen[e.Key] = true
		t, err := typeOf(e.Value)
		if err != nil {
			return fmt.Errorf("gguf: metadata key %q: %w", e.Key, err)
		}
		w.str(e.Key)
		w.u32(uint32(t))
		if err := w.value(e.Value); err != nil {
			return fmt.Errorf("gguf: metadata key %q: %w", e.Key, err)
		}
	}
	var offset uint64
	for _, t := range tensors {
		n := uint64(1)
		for _, d := range t.Dims {
			n *= d
		}
		if n != uint64(len(t.Data)) {
			return fmt.Errorf("gguf: tensor %q has dims %v (%d elements) but %d values", t.Name, t.Dims, n, len(t.Data))
		}
		w.str(t.Name)
		w.u32(uint32(len(t.Dims)))
		for _, d := range t.Dims {
			w.u64(d)
		}
		w.u32(uint32(TensorF32))
		w.u64(offset)
		offset = alignUp(offset+4*n, DefaultAlignment)
	}
	w.pad()
	for _, t := range tensors {
		for _, f := range t.Data {
			w.u32(math.Float32bits(f))
		}
		w.pad()
	}
	if w.err != nil {
		return w.err
	}
	return w.w.Flush()
}

// typeOf is the GGUF type of a Go value.
func typeOf(v Value) (ValueType, error) {
	switch v.(type) {
	case uint8:
		return TypeUint8, nil
	case int8:
		return TypeInt8, nil
	case uint16:
		return TypeUint16, nil
	case int16:
		return TypeInt16, nil
	case uint32:
		return TypeUint32, nil
	case int32:
		return TypeInt32, nil
	case float32:
		return TypeFloat32, nil
	case bool:
		return TypeBool, nil
	case string:
		return TypeString, nil
	case *Array:
		return TypeArray, nil
	case uint64:
		return TypeUint64, nil
	case int64:
		return TypeInt64, nil
	case float64:
		return TypeFloat64, nil
	}
	return 0, fmt.Errorf("values of Go type %T have no GGUF type", v)
}

type encoder struct {
	w   *bufio.Writer
	n   uint64
	err error
	buf [8]byte
}

func (e *encoder) raw(b []byte) {
	if e.err != nil {
		return
	}
	_, e.err = e.w.Write(b)
	e.n += uint64(len(b))
}

func (e *encoder) u32(v uint32) {
	binary.LittleEndian.PutUint32(e.buf[:4], v)
	e.raw(e.buf[:4])
}

func (e *encoder) u64(v uint64) {
	binary.LittleEndian.PutUint64(e.buf[:8], v)
	e.raw(e.buf[:8])
}

func (e *encoder) str(s string) {
	e.u64(uint64(len(s)))
	e.raw([]byte(s))
}

func (e *encoder) pad() {
	for e.n%DefaultAlignment != 0 {
		e.raw([]byte{0})
	}
}

func (e *encoder) value(v Value) error {
	switch x := v.(type) {
	case uint8:
		e.raw([]byte{x})
	case int8:
		e.raw([]byte{byte(x)})
	case bool:
		b := byte(0)
		if x {
			b = 1
		}
		e.raw([]byte{b})
	case uint16:
		binary.LittleEndian.PutUint16(e.buf[:2], x)
		e.raw(e.buf[:2])
	case int16:
		binary.LittleEndian.PutUint16(e.buf[:2], uint16(x))
		e.raw(e.buf[:2])
	case uint32:
		e.u32(x)
	case int32:
		e.u32(uint32(x))
	case float32:
		e.u32(math.Float32bits(x))
	case uint64:
		e.u64(x)
	case int64:
		e.u64(uint64(x))
	case float64:
		e.u64(math.Float64bits(x))
	case string:
		e.str(x)
	case *Array:
		e.u32(uint32(x.Elem))
		e.u64(uint64(len(x.Values)))
		for i, el := range x.Values {
			t, err := typeOf(el)
			if err != nil {
				return err
			}
			if t != x.Elem {
				return fmt.Errorf("array element %d is %v in an array of %v", i, t, x.Elem)
			}
			if err := e.value(el); err != nil {
				return err
			}
		}
	default:
		return fmt.Errorf("values of Go type %T have no GGUF type", v)
	}
	return nil
}
