package gguf

import (
	"bytes"
	"errors"
	"reflect"
	"testing"
)

func sample() ([]KV, []Tensor) {
	kv := []KV{
		{Key: "general.architecture", Value: "llama"},
		{Key: "llama.context_length", Value: uint32(4096)},
		{Key: "llama.rope.freq_base", Value: float32(500000)},
		{Key: "general.alignment", Value: uint32(32)},
		{Key: "tokenizer.ggml.tokens", Value: &Array{Elem: TypeString, Values: []Value{"<s>", "a", "b"}}},
		{Key: "tokenizer.ggml.token_type", Value: &Array{Elem: TypeInt32, Values: []Value{int32(3), int32(1), int32(1)}}},
		{Key: "tokenizer.ggml.add_bos_token", Value: true},
		{Key: "x.i8", Value: int8(-3)},
		{Key: "x.u64", Value: uint64(1 << 40)},
		{Key: "x.f64", Value: 2.5},
		{Key: "x.nested", Value: &Array{Elem: TypeArray, Values: []Value{&Array{Elem: TypeUint8, Values: []Value{uint8(7)}}}}},
	}
	tensors := []Tensor{
		{Name: "a", Dims: []uint64{3}, Data: []float32{1, 2, 3}},
		{Name: "b", Dims: []uint64{2, 2}, Data: []float32{4, 5, 6, 7}},
	}
	return kv, tensors
}

func TestWriteThenRead(t *testing.T) {
	kv, tensors := sample()
	var buf bytes.Buffer
	if err := Write(&buf, kv, tensors); err != nil {
		t.Fatal(err)
	}
	g, err := Read(bytes.NewReader(buf.Bytes()), int64(buf.Len()))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(g.KV, kv) {
		t.Fatalf("metadata read back differs:\n got %#v\nwant %#v", g.KV, kv)
	}
	if a, _ := g.Architecture(); a != "llama" {
		t.Fatalf("architecture %q", a)
	}
	if n, ok := g.Uint("llama.context_length"); !ok || n != 4096 {
		t.Fatalf("context length %d %v", n, ok)
	}
	if len(g.Tensors) != 2 || g.Tensors[1].Name != "b" || g.Tensors[1].Elements() != 4 {
		t.Fatalf("tensors %+v", g.Tensors)
	}
	// The data is where the table says.
	raw := buf.Bytes()[g.DataOffset+int64(g.Tensors[1].Offset):]
	if raw[0] != 0 || raw[1] != 0 || raw[2] != 0x80 || raw[3] != 0x40 { // 4.0f
		t.Fatalf("tensor b's data starts with % x", raw[:4])
	}
}

// TestMalformedFilesAreErrors cuts and corrupts a file: every case is an
// error, none a panic or a huge allocation.
func TestMalformedFilesAreErrors(t *testing.T) {
	kv, tensors := sample()
	var buf bytes.Buffer
	if err := Write(&buf, kv, tensors); err != nil {
		t.Fatal(err)
	}
	good := buf.Bytes()
	g, err := Read(bytes.NewReader(good), int64(len(good)))
	if err != nil {
		t.Fatal(err)
	}
	last := g.Tensors[len(g.Tensors)-1]
	size, _ := last.Bytes()
	end := int(g.DataOffset) + int(last.Offset) + int(size)
	for n := 0; n < end; n += 7 {
		if _, err := Read(bytes.NewReader(good[:n]), int64(n)); err == nil {
			t.Fatalf("a file cut at %d of %d bytes was read", n, end)
		}
	}
	bad := append([]byte("GGML"), good[4:]...)
	if _, err := Read(bytes.NewReader(bad), int64(len(bad))); !errors.Is(err, ErrNotGGUF) {
		t.Fatalf("bad magic: %v", err)
	}
	huge := bytes.Clone(good)
	copy(huge[16:24], []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f}) // metadata count
	if _, err := Read(bytes.NewReader(huge), int64(len(huge))); !errors.Is(err, ErrMalformed) {
		t.Fatalf("a huge entry count: %v", err)
	}
	v1 := bytes.Clone(good)
	v1[4] = 1
	if _, err := Read(bytes.NewReader(v1), int64(len(v1))); !errors.Is(err, ErrVersion) {
		t.Fatalf("version 1: %v", err)
	}
}

func FuzzRead(f *testing.F) {
	kv, tensors := sample()
	var buf bytes.Buffer
	if err := Write(&buf, kv, tensors); err != nil {
		f.Fatal(err)
	}
	f.Add(buf.Bytes())
	f.Add([]byte("GGUF\x03\x00\x00\x00"))
	f.Fuzz(func(t *testing.T, b []byte) {
		g, err := Read(bytes.NewReader(b), int64(len(b)))
		if err != nil {
			return
		}
		// What reads must write back and read the same.
		var out bytes.Buffer
		if err := Write(&out, g.KV, nil); err != nil {
			t.Fatalf("read metadata does not write: %v", err)
		}
		g2, err := Read(bytes.NewReader(out.Bytes()), int64(out.Len()))
		if err != nil {
			t.Fatalf("written metadata does not read: %v", err)
		}
		// Compared as written bytes, not values: a NaN float is not equal
		// to itself, yet round-trips bit for bit.
		var again bytes.Buffer
		if err := Write(&again, g2.KV, nil); err != nil || !bytes.Equal(again.Bytes(), out.Bytes()) {
			t.Fatalf("metadata does not round-trip: %v", err)
		}
	})
}
