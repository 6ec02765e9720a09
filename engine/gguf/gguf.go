// Package gguf reads and writes GGUF, llama.cpp's model file format: a
// header of typed key-value metadata, a table of tensors, and the tensors'
// data, aligned.
//
// The reader is for metadata (architecture, context length, tokenizer
// keys, chat template): it reads the header and the tensor table, never
// the data, and treats the file as untrusted, bounding every length by
// what the file can hold. The writer writes whole files, which is how the
// project makes small random-weight models for tests.
package gguf

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
)

// Magic is the first four bytes of a GGUF file.
const Magic = "GGUF"

// Version is the format version written; the reader takes 2 and 3, which
// differ only in ways this reader does not see (version 1 used 32-bit
// counts and is refused).
const Version = 3

// DefaultAlignment is the alignment of tensor data when the file does not
// set general.alignment.
const DefaultAlignment = 32

// ValueType is the type tag of a metadata value.
type ValueType uint32

// The value types of GGUF.
const (
	TypeUint8   ValueType = 0
	TypeInt8    ValueType = 1
	TypeUint16  ValueType = 2
	TypeInt16   ValueType = 3
	TypeUint32  ValueType = 4
	TypeInt32   ValueType = 5
	TypeFloat32 ValueType = 6
	TypeBool    ValueType = 7
	TypeString  ValueType = 8
	TypeArray   ValueType = 9
	TypeUint64  ValueType = 10
	TypeInt64   ValueType = 11
	TypeFloat64 ValueType = 12
)

func (t ValueType) String() string {
	names := [...]string{"uint8", "int8", "uint16", "int16", "uint32", "int32", "float32", "bool", "string", "array", "uint64", "int64", "float64"}
	if int(t) < len(names) {
		return names[t]
	}
	return fmt.Sprintf("type(%d)", uint32(t))
}

// size is the encoded size of a scalar of type t; 0 for strings and arrays.
func (t ValueType) size() int {
	switch t {
	case TypeUint8, TypeInt8, TypeBool:
		return 1
	case TypeUint16, TypeInt16:
		return 2
	case TypeUint32, TypeInt32, TypeFloat32:
		return 4
	case TypeUint64, TypeInt64, TypeFloat64:
		return 8
	}
	return 0
}

// TensorType is a ggml tensor element type.
type TensorType uint32

// The tensor types the writer produces.
const (
	TensorF32 TensorType = 0
	TensorF16 TensorType = 1
)

// Value is a metadata value: one of uint8, int8, uint16, int16, uint32,
// int32, float32, bool, string, uint64, int64, float64, or an Array.
type Value any

// Array is an array value; its elements all have type Elem.
type Array struct {
	Elem   ValueType
	Values []Value
}

// KV is one metadata entry.
type KV struct {
	Key   string
	Value Value
}

// TensorInfo describes one tensor of the table.
type TensorInfo struct {
	Name string
	// Dims are ggml's: the first is the fastest-varying (a row's length).
	Dims []uint64
	Type TensorType
	// Offset is from the start of the data section.
	Offset uint64
}

// File is a GGUF file's header and tensor table.
type File struct {
	Version uint32
	KV      []KV
	Tensors []TensorInfo
	// DataOffset is where the data section starts in the file.
	DataOffset int64
	index      map[string]int
}

// Errors of malformed files; each is wrapped with the file and the place.
var (
	ErrNotGGUF     = errors.New("gguf: not a GGUF file (bad magic)")
	ErrVersion     = errors.New("gguf: unsupported GGUF version")
	ErrTruncated   = errors.New("gguf: the file is truncated")
	ErrMalformed   = errors.New("gguf: the file is malformed")
	ErrMissingKey  = errors.New("gguf: a required metadata key is missing")
	ErrKeyWrongTyp = errors.New("gguf: a metadata key has an unexpected type")
)

// Limits that keep a hostile header from making the reader allocate
// without bound: a count is also checked against the bytes left.
const (
	maxStringLen  = 64 << 20
	maxArrayLen   = 1 << 26
	maxTensorDims = 8
)

// ReadFile reads the header and tensor table of the GGUF file at path.
func ReadFile(path string) (*File, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	g, err := Read(f, st.Size())
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return g, nil
}

// Read reads a GGUF header and tensor table from r, which holds size bytes
// in all (the file's size; it bounds the counts the header may claim and
// checks that the tensors' data is all there).
func Read(r io.Reader, size int64) (*File, error) {
	d := &decoder{r: bufio.NewReaderSize(r, 1<<16), left: size}
	var magic [4]byte
	if err := d.full(magic[:]); err != nil {
		return nil, err
	}
	if string(magic[:]) != Magic {
		return nil, ErrNotGGUF
	}
	g := &File{Version: d.u32(), index: map[string]int{}}
	if d.err == nil && (g.Version < 2 || g.Version > 3) {
		return nil, fmt.Errorf("%w: %d (this reader takes 2 and 3)", ErrVersion, g.Version)
	}
	nTensors, nKV := d.u64(), d.u64()
	if d.err != nil {
		return nil, d.err
	}
	// Each entry takes at least 8 bytes (its key's or name's length).
	if nKV > uint64(d.left)/8 || nTensors > uint64(d.left)/8 {
		return nil, fmt.Errorf("%w: the header claims %d metadata entries and %d tensors, more than the file can hold", ErrMalformed, nKV, nTensors)
	}
	for i := uint64(0); i < nKV && d.err == nil; i++ {
		key := d.str()
		typ := ValueType(d.u32())
		v := d.value(typ, 0)
		if d.err != nil {
			return nil, fmt.Errorf("metadata entry %d (%q): %w", i, key, d.err)
		}
		if _, dup := g.index[key]; dup {
			return nil, fmt.Errorf("%w: metadata key %q appears twice", ErrMalformed, key)
		}
		g.index[key] = len(g.KV)
		g.KV = append(g.KV, KV{Key: key, Value: v})
	}
	for i := uint64(0); i < nTensors && d.err == nil; i++ {
		t := TensorInfo{Name: d.str()}
		n := d.u32()
		if d.err == nil && (n == 0 || n > maxTensorDims) {
			return nil, fmt.Errorf("%w: tensor %q has %d dimensions", ErrMalformed, t.Name, n)
		}
		for range n {
			t.Dims = append(t.Dims, d.u64())
		}
		t.Type = TensorType(d.u32())
		t.Offset = d.u64()
		g.Tensors = append(g.Tensors, t)
	}
	if d.err != nil {
		return nil, d.err
	}
	align := uint64(DefaultAlignment)
	if v, ok := g.Uint("general.alignment"); ok {
		if v == 0 || v&(v-1) != 0 || v > 1<<20 {
			return nil, fmt.Errorf("%w: general.alignment %d is not a power of two", ErrMalformed, v)
		}
		align = v
	}
	g.DataOffset = int64(alignUp(uint64(size-d.left), align))
	for _, t := range g.Tensors {
		if t.Offset%align != 0 {
			return nil, fmt.Errorf("%w: tensor %q's data is not aligned to %d bytes", ErrMalformed, t.Name, align)
		}
		if bytes, ok := t.Bytes(); ok && uint64(g.DataOffset)+t.Offset+bytes > uint64(size) {
			return nil, fmt.Errorf("%w: tensor %q's data ends past the end of the file (%d bytes)", ErrTruncated, t.Name, size)
		}
	}
	return g, nil
}

// Elements is the number of elements of t.
func (t TensorInfo) Elements() uint64 {
	n := uint64(1)
	for _, d := range t.Dims {
		n *= d
	}
	return n
}

// Bytes is the size of t's data, when its type is one whose size this
// package knows (F32, F16).
func (t TensorInfo) Bytes() (uint64, bool) {
	switch t.Type {
	case TensorF32:
		return 4 * t.Elements(), true
	case TensorF16:
		return 2 * t.Elements(), true
	}
	return 0, false
}

// Get returns the value of key.
func (g *File) Get(key string) (Value, bool) {
	i, ok := g.index[key]
	if !ok {
		return nil, false
	}
	return g.KV[i].Value, true
}

// String returns the string value of key.
func (g *File) String(key string) (string, bool) {
	v, ok := g.Get(key)
	s, isStr := v.(string)
	return s, ok && isStr
}

// Uint returns the value of key when it is a non-negative integer of any
// width.
func (g *File) Uint(key string) (uint64, bool) {
	v, ok := g.Get(key)
	if !ok {
		return 0, false
	}
	switch x := v.(type) {
	case uint8:
		return uint64(x), true
	case uint16:
		return uint64(x), true
	case uint32:
		return uint64(x), true
	case uint64:
		return x, true
	case int8:
		return uint64(x), x >= 0
	case int16:
		return uint64(x), x >= 0
	case int32:
		return uint64(x), x >= 0
	case int64:
		return uint64(x), x >= 0
	}
	return 0, false
}

// Array returns the array value of key.
func (g *File) Array(key string) (*Array, bool) {
	v, ok := g.Get(key)
	a, isArr := v.(*Array)
	return a, ok && isArr
}

// Architecture is general.architecture.
func (g *File) Architecture() (string, error) {
	a, ok := g.String("general.architecture")
	if !ok {
		return "", fmt.Errorf("%w: general.architecture", ErrMissingKey)
	}
	return a, nil
}

// Tensor returns the tensor named name.
func (g *File) Tensor(name string) (TensorInfo, bool) {
	for _, t := range g.Tensors {
		if t.Name == name {
			return t, true
		}
	}
	return TensorInfo{}, false
}

type decoder struct {
	r    *bufio.Reader
	left int64
	err  error
	buf  [8]byte
}

func (d *decoder) full(b []byte) error {
	if d.err != nil {
		return d.err
	}
	if int64(len(b)) > d.left {
		d.err = ErrTruncated
		return d.err
	}
	if _, err := io.ReadFull(d.r, b); err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			err = ErrTruncated
		}
		d.err = err
		return err
	}
	d.left -= int64(len(b))
	return nil
}

func (d *decoder) u8() uint8 {
	if d.full(d.buf[:1]) != nil {
		return 0
	}
	return d.buf[0]
}

func (d *decoder) u16() uint16 {
	if d.full(d.buf[:2]) != nil {
		return 0
	}
	return binary.LittleEndian.Uint16(d.buf[:2])
}

func (d *decoder) u32() uint32 {
	if d.full(d.buf[:4]) != nil {
		return 0
	}
	return binary.LittleEndian.Uint32(d.buf[:4])
}

func (d *decoder) u64() uint64 {
	if d.full(d.buf[:8]) != nil {
		return 0
	}
	return binary.LittleEndian.Uint64(d.buf[:8])
}

func (d *decoder) str() string {
	n := d.u64()
	if d.err != nil {
		return ""
	}
	if n > maxStringLen || int64(n) > d.left {
		d.err = fmt.Errorf("%w: a string of %d bytes", ErrMalformed, n)
		return ""
	}
	b := make([]byte, n)
	if d.full(b) != nil {
		return ""
	}
	return string(b)
}

// value reads one value of type t; depth bounds nested arrays.
func (d *decoder) value(t ValueType, depth int) Value {
	switch t {
	case TypeUint8:
		return d.u8()
	case TypeInt8:
		return int8(d.u8())
	case TypeUint16:
		return d.u16()
	case TypeInt16:
		return int16(d.u16())
	case TypeUint32:
		return d.u32()
	case TypeInt32:
		return int32(d.u32())
	case TypeFloat32:
		return math.Float32frombits(d.u32())
	case TypeBool:
		b := d.u8()
		if d.err == nil && b > 1 {
			d.err = fmt.Errorf("%w: a bool of value %d", ErrMalformed, b)
		}
		return b == 1
	case TypeString:
		return d.str()
	case TypeUint64:
		return d.u64()
	case TypeInt64:
		return int64(d.u64())
	case TypeFloat64:
		return math.Float64frombits(d.u64())
	case TypeArray:
		if depth > 2 {
			d.err = fmt.Errorf("%w: arrays nested too deep", ErrMalformed)
			return nil
		}
		elem := ValueType(d.u32())
		n := d.u64()
		if d.err != nil {
			return nil
		}
		minSize := int64(elem.size())
		if elem == TypeString || elem == TypeArray {
			minSize = 8
		}
		if minSize == 0 || n > maxArrayLen || int64(n) > d.left/minSize {
			d.err = fmt.Errorf("%w: an array of %d elements of type %v", ErrMalformed, n, elem)
			return nil
		}
		a := &Array{Elem: elem, Values: make([]Value, 0, n)}
		for i := uint64(0); i < n && d.err == nil; i++ {
			a.Values = append(a.Values, d.value(elem, depth+1))
		}
		return a
	}
	if d.err == nil {
		d.err = fmt.Errorf("%w: value type %d", ErrMalformed, uint32(t))
	}
	return nil
}

func alignUp(n, align uint64) uint64 { return (n + align - 1) / align * align }
