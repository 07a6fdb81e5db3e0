package wire

import (
	"bufio"
	"bytes"
	"errors"
	"net"
	"testing"

	"github.com/gd2fs/gd2fs/errs"
	"github.com/gd2fs/gd2fs/internal/crc32c"
)

// TestReadPayloadIntoSocket: on a TCP socket, ReadPayloadInto reads views
// with readv, several at a time; whatever the views' sizes (empty, odd,
// page-sized) and however the sender splits its writes, the views hold
// the payload, each sum is its view's CRC32C, and the frame after the
// payload reads intact. A stream cut inside a payload is an error.
func TestReadPayloadIntoSocket(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	payload := make([]byte, 1<<20+12345)
	for i := range payload {
		payload[i] = byte(i*13 + i>>11)
	}
	splits := [][]int{
		{64 << 10},          // pages, as the DRAM tier gives them
		{1000, 0, 70 << 10}, // odd, with empty views
		{len(payload)},      // one view
		{300 << 10, 0},
	}
	var stream []byte
	for i := range splits {
		stream = append(stream, frame(Header{Op: OpWrite, ReqID: uint64(i)}, []byte("k"), payload)...)
	}
	stream = append(stream, frame(Header{Op: OpPing, ReqID: 99}, nil, []byte("after"))...)
	cut := frame(Header{Op: OpWrite, ReqID: 100}, nil, payload)
	stream = append(stream, cut[:len(cut)-5000]...)
	errc := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			errc <- err
			return
		}
		defer c.Close()
		// Uneven writes, so reads meet every boundary.
		for off, k := 0, 0; off < len(stream); k++ {
			n := min(len(stream)-off, []int{7, 100_000, 33_333, 250_000}[k%4])
			if _, err := c.Write(stream[off : off+n]); err != nil {
				errc <- err
				return
			}
			off += n
		}
		errc <- nil
	}()
	nc, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	r := NewBufferedReader(bufio.NewReaderSize(nc, 64<<10), nc, DefaultLimits())
	got := make([]byte, len(payload))
	for i, sp := range splits {
		h, _, err := r.Next()
		if err != nil || h.ReqID != uint64(i) {
			t.Fatalf("frame %d: %+v %v", i, h, err)
		}
		clear(got)
		var views [][]byte
		for off, k := 0, 0; off < len(got); k++ {
			n := min(len(got)-off, sp[k%len(sp)])
			views = append(views, got[off:off+n])
			off += n
		}
		sums := make([]uint32, len(views))
		if err := r.ReadPayloadInto(views, sums); err != nil {
			t.Fatalf("frame %d: %v", i, err)
		}
		if !bytes.Equal(got, payload) {
			t.Fatalf("frame %d: the views hold other bytes than the payload", i)
		}
		for j, v := range views {
			if sums[j] != crc32c.Checksum(v) {
				t.Fatalf("frame %d view %d (%d bytes): sum %08x, CRC %08x", i, j, len(v), sums[j], crc32c.Checksum(v))
			}
		}
	}
	h, _, err := r.Next()
	if err != nil || h.ReqID != 99 {
		t.Fatalf("frame after the payloads: %+v %v", h, err)
	}
	small := make([]byte, 8)
	if n, err := r.ReadPayload(small, h.PayloadCRC); err != nil || string(small[:n]) != "after" {
		t.Fatalf("payload after the large ones %q: %v", small[:n], err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if h, _, err = r.Next(); err != nil || h.ReqID != 100 {
		t.Fatalf("cut frame's header: %+v %v", h, err)
	}
	if err := r.ReadPayloadInto([][]byte{got}, []uint32{0}); !errors.Is(err, errs.ErrBadRequest) {
		t.Fatalf("a payload cut short: %v, want a truncated-payload error", err)
	}
}
