// Package safetensors parses and validates safetensors headers and reads
// single tensors, or tensor-parallel row shards, by byte range from any
// io.ReaderAt (a local file, or a gd2fs client.File).
//
// Format: an 8-byte little-endian header length N, N bytes of JSON mapping
// tensor names to {"dtype", "shape", "data_offsets": [begin, end]} (offsets
// relative to the first byte after the header) plus an optional
// "__metadata__" map of strings, then the data. Nothing is aligned.
package safetensors

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"sort"

	"github.com/gd2fs/gd2fs/errs"
	"github.com/gd2fs/gd2fs/internal/dtype"
)

// MaxHeader is the largest header accepted (the format's own limit).
const MaxHeader = 100 << 20

// Tensor is one entry of the header.
type Tensor struct {
	Name  string
	DType string
	Shape []int64
	Begin int64 // absolute file offsets
	End   int64
}

// Bytes is the tensor's size.
func (t Tensor) Bytes() int64 { return t.End - t.Begin }

// Header is a parsed, validated header.
type Header struct {
	Size     int64 // file size
	DataFrom int64 // 8 + header length
	Tensors  []Tensor
	Metadata map[string]string
	byName   map[string]int
}

// DTypeSize is the element size of a safetensors dtype, 0 if unknown.
func DTypeSize(dt string) int64 { return int64(dtype.Size(dt)) }

func bad(format string, args ...any) error {
	return errs.New(errs.ErrBadRequest, "safetensors: "+format, args...)
}

// Parse reads and validates the header of a file of size bytes.
func Parse(r io.ReaderAt, size int64) (*Header, error) {
	if size < 8 {
		return nil, bad("file of %d bytes is too short for a header", size)
	}
	var lb [8]byte
	if _, err := r.ReadAt(lb[:], 0); err != nil {
		return nil, bad("read header length: %v", err)
	}
	n := binary.LittleEndian.Uint64(lb[:])
	if n > MaxHeader {
		return nil, bad("header of %d bytes is beyond the %d-byte limit", n, MaxHeader)
	}
	if int64(n)+8 > size {
		return nil, bad("header of %d bytes does not fit a %d-byte file (truncated?)", n, size)
	}
	raw := make([]byte, n)
	if _, err := r.ReadAt(raw, 8); err != nil {
		return nil, bad("read header: %v", err)
	}
	var entries map[string]json.RawMessage
	if err := json.Unmarshal(raw, &entries); err != nil {
		return nil, bad("header is not a JSON object: %v", err)
	}
	h := &Header{Size: size, DataFrom: 8 + int64(n), byName: map[string]int{}}
	dataLen := size - h.DataFrom
	for name, msg := range entries {
		if name == "__metadata__" {
			if err := json.Unmarshal(msg, &h.Metadata); err != nil {
				return nil, bad("__metadata__ must map strings to strings: %v", err)
			}
			continue
		}
		var e struct {
			DType   string  `json:"dtype"`
			Shape   []int64 `json:"shape"`
			Offsets []int64 `json:"data_offsets"`
		}
		if err := json.Unmarshal(msg, &e); err != nil {
			return nil, bad("tensor %q: %v", name, err)
		}
		es := DTypeSize(e.DType)
		if es == 0 {
			return nil, bad("tensor %q: unknown dtype %q", name, e.DType)
		}
		if len(e.Offsets) != 2 || e.Offsets[0] < 0 || e.Offsets[1] < e.Offsets[0] || e.Offsets[1] > dataLen {
			return nil, bad("tensor %q: data_offsets %v outside the %d data bytes", name, e.Offsets, dataLen)
		}
		elems := int64(1)
		for _, d := range e.Shape {
			if d < 0 || (d > 0 && elems > (1<<62)/d) {
				return nil, bad("tensor %q: bad shape %v", name, e.Shape)
			}
			elems *= d
		}
		if elems*es != e.Offsets[1]-e.Offsets[0] {
			return nil, bad("tensor %q: shape %v of %s is %d bytes, data_offsets span %d", name, e.Shape, e.DType, elems*es, e.Offsets[1]-e.Offsets[0])
		}
		h.Tensors = append(h.Tensors, Tensor{Name: name, DType: e.DType, Shape: e.Shape, Begin: h.DataFrom + e.Offsets[0], End: h.DataFrom + e.Offsets[1]})
	}
	sort.Slice(h.Tensors, func(i, j int) bool {
		a, b := h.Tensors[i], h.Tensors[j]
		if a.Begin != b.Begin {
			return a.Begin < b.Begin
		}
		return a.Name < b.Name
	})
	for i, t := range h.Tensors {
		if i > 0 && t.Begin < h.Tensors[i-1].End {
			return nil, bad("tensors %q and %q overlap", h.Tensors[i-1].Name, t.Name)
		}
		h.byName[t.Name] = i
	}
	return h, nil
}

// Tensor looks a tensor up by name.
func (h *Header) Tensor(name string) (Tensor, error) {
	i, ok := h.byName[name]
	if !ok {
		return Tensor{}, errs.New(errs.ErrNotFound, "safetensors: no tensor %q", name)
	}
	return h.Tensors[i], nil
}

// Read reads a whole tensor.
func (h *Header) Read(r io.ReaderAt, name string) ([]byte, error) {
	t, err := h.Tensor(name)
	if err != nil {
		return nil, err
	}
	b := make([]byte, t.Bytes())
	if _, err := r.ReadAt(b, t.Begin); err != nil && !(err == io.EOF && t.Bytes() == 0) {
		return nil, fmt.Errorf("safetensors: read %s: %w", name, err)
	}
	return b, nil
}

// RowShard returns the byte range of rank's share of dimension 0 when the
// tensor is split over world ranks (tensor-parallel row sharding): rows are
// contiguous in row-major order, so a shard is one range. Rows that do not
// divide evenly go to the first ranks.
func (h *Header) RowShard(name string, rank, world int) (begin, end int64, err error) {
	t, err := h.Tensor(name)
	if err != nil {
		return 0, 0, err
	}
	if world < 1 || rank < 0 || rank >= world {
		return 0, 0, bad("rank %d of %d", rank, world)
	}
	if len(t.Shape) == 0 {
		return 0, 0, bad("tensor %q is a scalar and has no rows", name)
	}
	rows := t.Shape[0]
	rowBytes := int64(0)
	if rows > 0 {
		rowBytes = t.Bytes() / rows
	}
	per, extra := rows/int64(world), rows%int64(world)
	first := int64(rank)*per + min(int64(rank), extra)
	n := per
	if int64(rank) < extra {
		n++
	}
	return t.Begin + first*rowBytes, t.Begin + (first+n)*rowBytes, nil
}

// ReadRowShard reads rank's row shard of a tensor.
func (h *Header) ReadRowShard(r io.ReaderAt, name string, rank, world int) ([]byte, error) {
	b, e, err := h.RowShard(name, rank, world)
	if err != nil {
		return nil, err
	}
	out := make([]byte, e-b)
	if len(out) == 0 {
		return out, nil
	}
	if _, err := r.ReadAt(out, b); err != nil {
		return nil, fmt.Errorf("safetensors: read shard of %s: %w", name, err)
	}
	return out, nil
}

// Build writes a safetensors file image of tensors (in the given order)
// with optional metadata; for tests and tools. data[i] must match the
// shape and dtype of tensors[i].
func Build(tensors []Tensor, data [][]byte, meta map[string]string) ([]byte, error) {
	hdr := map[string]any{}
	if meta != nil {
		hdr["__metadata__"] = meta
	}
	var off int64
	for i, t := range tensors {
		hdr[t.Name] = map[string]any{"dtype": t.DType, "shape": t.Shape, "data_offsets": []int64{off, off + int64(len(data[i]))}}
		off += int64(len(data[i]))
	}
	js, err := json.Marshal(hdr)
	if err != nil {
		return nil, err
	}
	out := binary.LittleEndian.AppendUint64(nil, uint64(len(js)))
	out = append(out, js...)
	for _, d := range data {
		out = append(out, d...)
	}
	return out, nil
}
