package wire

import (
	"bytes"
	"testing"

	"github.com/gd2fs/gd2fs/internal/crc32c"
	"github.com/gd2fs/gd2fs/internal/limits"
)

// FuzzReader feeds arbitrary bytes to the frame decoder: it must never panic,
// never read a payload longer than the limits allow, and every frame it accepts
// must re-encode to the same bytes. The seed corpus runs in normal tests.
func FuzzReader(f *testing.F) {
	key := AppendChunkRef(nil, ChunkRef{ID: 3, Forward: []string{"a:1"}})
	f.Add(frame(Header{Op: OpWrite, ReqID: 1, Offset: 4096}, key, []byte("payload")))
	f.Add(frame(Header{Op: OpHello}, []byte("client"), []byte("token")))
	f.Add(append(frame(Header{Op: OpRead, Count: 10}, key[:8], nil), frame(Header{Op: OpPing}, nil, nil)...))
	f.Add(frame(Header{Op: OpKVPut, Offset: 3}, AppendKVRef(nil, KVRef{Pool: "perf", Key: []byte("m/0/abc"), Forward: []string{"a:1", "b:2"}}), []byte("kv")))
	f.Add(frame(Header{Op: OpKVRetain, Offset: 3}, AppendKVRef(nil, KVRef{Pool: "perf", Key: []byte("k")}), AppendRetain(nil, Retain{Set: RetainPin | RetainTTL, Pin: 1, Priority: -2, TTL: 1500})))
	f.Add([]byte("GD2F"))
	f.Add(make([]byte, HeaderSize))
	lim := Limits{MaxKey: 1024, MaxPayload: 1 << 16}
	f.Fuzz(func(t *testing.T, data []byte) {
		r := NewReader(bytes.NewReader(data), lim)
		buf := make([]byte, lim.MaxPayload)
		for i := 0; i < 64; i++ {
			h, key, err := r.Next()
			if err != nil {
				return
			}
			if int(h.KeyLen) > lim.MaxKey || int(h.PayloadLen) > lim.MaxPayload {
				t.Fatalf("accepted lengths beyond limits: %+v", h)
			}
			keyCopy := append([]byte{}, key...)
			var n int
			if i%2 == 1 {
				// Every other payload into page-sized views, as a
				// server's zero-copy write reads it, summed as it
				// arrives; checked here.
				n = int(h.PayloadLen)
				var views [][]byte
				for off := 0; off < n; off += 20000 {
					views = append(views, buf[off:min(off+20000, n)])
				}
				sums := make([]uint32, len(views))
				if err := r.ReadPayloadInto(views, sums); err != nil {
					return
				}
				for j, v := range views {
					if sums[j] != crc32c.Checksum(v) {
						t.Fatalf("view %d of %d bytes: sum %08x, its CRC is %08x", j, len(v), sums[j], crc32c.Checksum(v))
					}
				}
				if crc32c.Checksum(buf[:n]) != h.PayloadCRC {
					continue
				}
			} else if n, err = r.ReadPayload(buf, h.PayloadCRC); err != nil {
				continue
			}
			re := frame(h, keyCopy, buf[:n])
			r2 := NewReader(bytes.NewReader(re), lim)
			h2, k2, err := r2.Next()
			if err != nil || h2 != h || !bytes.Equal(k2, keyCopy) {
				t.Fatalf("re-encode mismatch: %+v vs %+v (%v)", h, h2, err)
			}
			_, _ = ParseChunkRef(keyCopy)
			if ref, err := ParseColdRef(keyCopy); err == nil {
				if again, err := ParseColdRef(AppendColdRef(nil, ref)); err != nil || again != ref {
					t.Fatalf("cold ref does not round-trip: %+v", ref)
				}
			}
			if r, err := ParseRetain(buf[:n]); err == nil {
				if again, err := ParseRetain(AppendRetain(nil, r)); err != nil || again != r {
					t.Fatalf("retain does not round-trip: %+v", r)
				}
			}
			if ref, err := ParseKVRef(keyCopy); err == nil {
				if again, err := ParseKVRef(AppendKVRef(nil, ref)); err != nil || string(again.Key) != string(ref.Key) || again.Pool != ref.Pool {
					t.Fatalf("KV ref does not round-trip: %+v", ref)
				}
			}
		}
	})
}

// FuzzExtents: an OpExtents payload either decodes to ranges a chunk can
// hold (in order, apart, non-empty, within limits) that encode back to the
// same bytes, or is an error.
func FuzzExtents(f *testing.F) {
	f.Add(AppendExtents(nil, []int64{0, 100, 200, 300}))
	f.Add(AppendExtents(nil, []int64{5, 5}))
	f.Add(AppendExtents(nil, []int64{0, 10, 10, 20}))
	f.Add([]byte{1, 2, 3})
	f.Fuzz(func(t *testing.T, b []byte) {
		ext, err := ParseExtents(b)
		if err != nil {
			return
		}
		if len(ext)/2 > limits.MaxChunkExtents {
			t.Fatalf("%d ranges accepted", len(ext)/2)
		}
		for i := 0; i < len(ext); i += 2 {
			if ext[i] >= ext[i+1] || ext[i+1] > limits.MaxChunk || (i > 0 && ext[i] <= ext[i-1]) {
				t.Fatalf("accepted %v", ext)
			}
		}
		if !bytes.Equal(AppendExtents(nil, ext), b) {
			t.Fatalf("%v does not encode back to its bytes", ext)
		}
	})
}
