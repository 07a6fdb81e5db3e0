package wire

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"testing"
	"testing/iotest"
	"unsafe"

	"github.com/gd2fs/gd2fs/errs"
	"github.com/gd2fs/gd2fs/internal/crc32c"
)

func frame(h Header, key, payload []byte) []byte {
	h.PayloadLen = uint32(len(payload))
	h.PayloadCRC = crc32c.Checksum(payload)
	var hb [HeaderSize]byte
	out := append([]byte{}, Encode(hb[:], &h, key)...)
	out = append(out, key...)
	return append(out, payload...)
}

func TestRoundTrip(t *testing.T) {
	key := AppendChunkRef(nil, ChunkRef{ID: 42, Forward: []string{"127.0.0.1:1", "127.0.0.1:2"}})
	payload := bytes.Repeat([]byte("abc"), 1000)
	var stream []byte
	stream = append(stream, frame(Header{Op: OpWrite, ReqID: 7, Offset: 99, Count: 5}, key, payload)...)
	stream = append(stream, frame(Header{Op: OpRead, ReqID: 8}, key[:8], nil)...)
	r := NewReader(bytes.NewReader(stream), DefaultLimits())
	h, k, err := r.Next()
	if err != nil {
		t.Fatal(err)
	}
	if h.Op != OpWrite || h.ReqID != 7 || h.Offset != 99 || h.Count != 5 || int(h.PayloadLen) != len(payload) {
		t.Fatalf("header %+v", h)
	}
	ref, err := ParseChunkRef(k)
	if err != nil || ref.ID != 42 || len(ref.Forward) != 2 || ref.Forward[1] != "127.0.0.1:2" {
		t.Fatalf("ref %+v %v", ref, err)
	}
	dst := make([]byte, len(payload))
	if _, err := r.ReadPayload(dst, h.PayloadCRC); err != nil || !bytes.Equal(dst, payload) {
		t.Fatalf("payload: %v", err)
	}
	h, _, err = r.Next()
	if err != nil || h.Op != OpRead || h.ReqID != 8 {
		t.Fatalf("second frame %+v %v", h, err)
	}
}

func TestDecodeErrors(t *testing.T) {
	good := frame(Header{Op: OpWrite, ReqID: 1}, []byte("12345678"), []byte("hello"))
	cases := map[string]struct {
		mut  func(b []byte) []byte
		kind error
	}{
		"magic":        {func(b []byte) []byte { b[0] ^= 1; return b }, errs.ErrBadRequest},
		"version":      {func(b []byte) []byte { b[4] = 9; return b }, errs.ErrVersion},
		"headercrc":    {func(b []byte) []byte { b[30] ^= 1; return b }, errs.ErrBadRequest},
		"keycrc":       {func(b []byte) []byte { b[HeaderSize] ^= 1; return b }, errs.ErrBadRequest},
		"truncated":    {func(b []byte) []byte { return b[:20] }, errs.ErrBadRequest},
		"truncatedkey": {func(b []byte) []byte { return b[:HeaderSize+3] }, errs.ErrBadRequest},
		"toolarge": {func(b []byte) []byte {
			b[12], b[13], b[14], b[15] = 0xff, 0xff, 0xff, 0x7f
			return b
		}, errs.ErrTooLarge},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			b := c.mut(append([]byte{}, good...))
			r := NewReader(bytes.NewReader(b), DefaultLimits())
			_, _, err := r.Next()
			if !errors.Is(err, c.kind) {
				t.Fatalf("got %v, want %v", err, c.kind)
			}
		})
	}
	t.Run("payloadcrc", func(t *testing.T) {
		b := append([]byte{}, good...)
		b[len(b)-1] ^= 1
		r := NewReader(bytes.NewReader(b), DefaultLimits())
		h, _, err := r.Next()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := r.ReadPayload(make([]byte, 5), h.PayloadCRC); !errors.Is(err, errs.ErrChecksum) {
			t.Fatalf("got %v", err)
		}
	})
}

func TestStatusMapping(t *testing.T) {
	for s := StatusBadRequest; s <= StatusExists; s++ {
		if got := StatusOf(ErrorOf(s, "x")); got != s {
			t.Errorf("status %d round-trips to %d", s, got)
		}
	}
	if StatusOf(errors.New("plain")) != StatusInternal {
		t.Error("plain error should map to internal")
	}
	// The kind decides, every time, even when the cause has another kind
	// the wire also knows.
	err := errs.New(errs.ErrUnavailable, "no replica (last: %w)", ErrorOf(StatusChecksum, "crc"))
	for i := 0; i < 100; i++ {
		if got := StatusOf(err); got != StatusUnavailable {
			t.Fatalf("StatusOf = %v, want unavailable", got)
		}
	}
}

func TestParseChunkRefBad(t *testing.T) {
	for _, k := range [][]byte{nil, []byte("1234567"), append(make([]byte, 8), ','), append(make([]byte, 8), "a,"...)} {
		if _, err := ParseChunkRef(k); !errors.Is(err, errs.ErrBadRequest) {
			t.Errorf("%q: got %v", k, err)
		}
	}
}

func TestKVRef(t *testing.T) {
	ref := KVRef{Pool: "ha", Key: []byte("llama/rank0/\x00\xffhash"), Forward: []string{"127.0.0.1:1", "127.0.0.1:2"}}
	got, err := ParseKVRef(AppendKVRef(nil, ref))
	if err != nil || got.Pool != "ha" || !bytes.Equal(got.Key, ref.Key) || len(got.Forward) != 2 {
		t.Fatalf("%+v %v", got, err)
	}
	for _, b := range [][]byte{nil, {5, 'a'}, {1, 'a', 9, 0, 'x'}, append(AppendKVRef(nil, KVRef{Pool: "p", Key: []byte("k")}), ",x"...)} {
		if _, err := ParseKVRef(b); !errors.Is(err, errs.ErrBadRequest) {
			t.Errorf("%q: %v", b, err)
		}
	}
}

// readLog is a source that remembers every buffer it was asked to fill.
type readLog struct {
	r     io.Reader
	calls [][]byte
}

func (l *readLog) Read(p []byte) (int, error) {
	n, err := l.r.Read(p)
	l.calls = append(l.calls, p[:n])
	return n, err
}

// TestPayloadReadDirect: a large payload goes from the connection straight
// into the caller's views (one copy), not through the reader's buffer, and
// the bytes the buffer had already read ahead are not lost; small frames
// around it still go through the buffer. Before, every payload byte of a
// server's zero-copy write was copied once more out of its 256 KiB buffer.
func TestPayloadReadDirect(t *testing.T) {
	payload := make([]byte, 300<<10)
	for i := range payload {
		payload[i] = byte(i * 7)
	}
	var stream []byte
	stream = append(stream, frame(Header{Op: OpPing, ReqID: 1}, nil, []byte("small"))...)
	stream = append(stream, frame(Header{Op: OpWrite, ReqID: 2}, []byte("k"), payload)...)
	stream = append(stream, frame(Header{Op: OpPing, ReqID: 3}, nil, []byte("after"))...)
	src := &readLog{r: iotest.HalfReader(bytes.NewReader(stream))}
	r := NewBufferedReader(bufio.NewReaderSize(src, 256<<10), src, DefaultLimits())

	h, _, err := r.Next()
	if err != nil || h.ReqID != 1 {
		t.Fatalf("first frame: %+v %v", h, err)
	}
	small := make([]byte, 16)
	if n, err := r.ReadPayload(small, h.PayloadCRC); err != nil || string(small[:n]) != "small" {
		t.Fatalf("small payload %q: %v", small[:n], err)
	}
	if h, _, err = r.Next(); err != nil || h.ReqID != 2 {
		t.Fatalf("second frame: %+v %v", h, err)
	}
	// Views of a page each, as the DRAM tier gives them.
	got := make([]byte, len(payload))
	var views [][]byte
	for off := 0; off < len(got); off += 64 << 10 {
		views = append(views, got[off:min(off+64<<10, len(got))])
	}
	src.calls = nil
	sums := make([]uint32, len(views))
	if err := r.ReadPayloadInto(views, sums); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, payload) {
		t.Fatal("payload read into views differs from the one sent")
	}
	for i, v := range views {
		if sums[i] != crc32c.Checksum(v) {
			t.Fatalf("view %d: sum %08x, its CRC is %08x", i, sums[i], crc32c.Checksum(v))
		}
	}
	direct := 0
	lo, hi := uintptr(unsafe.Pointer(&got[0])), uintptr(unsafe.Pointer(&got[len(got)-1]))
	for _, c := range src.calls {
		if p := uintptr(unsafe.Pointer(unsafe.SliceData(c))); len(c) > 0 && p >= lo && p <= hi {
			direct += len(c)
		}
	}
	if direct < len(payload)/2 {
		t.Fatalf("%d of %d payload bytes were read from the connection into the views; the rest was copied out of the reader's buffer", direct, len(payload))
	}
	if h, _, err = r.Next(); err != nil || h.ReqID != 3 {
		t.Fatalf("frame after the payload: %+v %v", h, err)
	}
	if n, err := r.ReadPayload(small, h.PayloadCRC); err != nil || string(small[:n]) != "after" {
		t.Fatalf("payload after the large one %q: %v", small[:n], err)
	}
}
