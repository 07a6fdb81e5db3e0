package safetensors

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"

	"github.com/gd2fs/gd2fs/errs"
)

func sample(t *testing.T) ([]byte, [][]byte) {
	t.Helper()
	// 7x3 F32 (84 bytes) then 5 BF16 (10 bytes): nothing aligned.
	a := make([]byte, 84)
	for i := range a {
		a[i] = byte(i)
	}
	b := bytes.Repeat([]byte{0xee}, 10)
	img, err := Build([]Tensor{{Name: "w", DType: "F32", Shape: []int64{7, 3}}, {Name: "b", DType: "BF16", Shape: []int64{5}}},
		[][]byte{a, b}, map[string]string{"format": "pt"})
	if err != nil {
		t.Fatal(err)
	}
	return img, [][]byte{a, b}
}

func TestParseReadShard(t *testing.T) {
	img, data := sample(t)
	h, err := Parse(bytes.NewReader(img), int64(len(img)))
	if err != nil {
		t.Fatal(err)
	}
	if len(h.Tensors) != 2 || h.Metadata["format"] != "pt" || h.DataFrom%8 == 0 && false {
		t.Fatalf("header %+v", h)
	}
	got, err := h.Read(bytes.NewReader(img), "b")
	if err != nil || !bytes.Equal(got, data[1]) {
		t.Fatalf("read b: %v", err)
	}
	// 7 rows over 3 ranks: 3, 2, 2 rows of 12 bytes.
	var all []byte
	for rank, rows := range []int{3, 2, 2} {
		s, err := h.ReadRowShard(bytes.NewReader(img), "w", rank, 3)
		if err != nil || len(s) != rows*12 {
			t.Fatalf("rank %d: %d bytes, %v", rank, len(s), err)
		}
		all = append(all, s...)
	}
	if !bytes.Equal(all, data[0]) {
		t.Fatal("shards do not add up to the tensor")
	}
	if _, err := h.Tensor("nope"); !errors.Is(err, errs.ErrNotFound) {
		t.Fatal("unknown tensor")
	}
}

func TestBadFiles(t *testing.T) {
	img, _ := sample(t)
	n := binary.LittleEndian.Uint64(img)
	cases := map[string][]byte{
		"short":     img[:5],
		"truncated": img[:len(img)-3],
		"huge":      append(binary.LittleEndian.AppendUint64(nil, MaxHeader+1), img[8:]...),
		"beyond":    append(binary.LittleEndian.AppendUint64(nil, uint64(len(img))), img[8:]...),
		"notjson":   append(binary.LittleEndian.AppendUint64(nil, n), append(bytes.Repeat([]byte("x"), int(n)), img[8+n:]...)...),
	}
	mk := func(hdr string, data int) []byte {
		b := binary.LittleEndian.AppendUint64(nil, uint64(len(hdr)))
		return append(append(b, hdr...), make([]byte, data)...)
	}
	cases["overlap"] = mk(`{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[4],"data_offsets":[2,6]}}`, 8)
	cases["shape"] = mk(`{"a":{"dtype":"F32","shape":[4],"data_offsets":[0,4]}}`, 8)
	cases["dtype"] = mk(`{"a":{"dtype":"Q4","shape":[4],"data_offsets":[0,4]}}`, 8)
	cases["offsets"] = mk(`{"a":{"dtype":"U8","shape":[4],"data_offsets":[6,10]}}`, 8)
	for name, b := range cases {
		if _, err := Parse(bytes.NewReader(b), int64(len(b))); !errors.Is(err, errs.ErrBadRequest) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

func FuzzParse(f *testing.F) {
	img, err := Build([]Tensor{{Name: "w", DType: "U8", Shape: []int64{2, 2}}}, [][]byte{{1, 2, 3, 4}}, nil)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(img)
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := Parse(bytes.NewReader(b), int64(len(b)))
		if err != nil {
			return
		}
		for _, tn := range h.Tensors {
			if tn.Begin < h.DataFrom || tn.End > int64(len(b)) || tn.End < tn.Begin {
				t.Fatalf("accepted tensor outside the file: %+v", tn)
			}
		}
	})
}
