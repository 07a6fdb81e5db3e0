package transporttest

import (
	"bytes"
	"errors"
	"slices"
	"testing"

	"github.com/gd2fs/gd2fs/client"
	"github.com/gd2fs/gd2fs/errs"
	"github.com/gd2fs/gd2fs/internal/crc32c"
)

// PeerEnv is a client.PeerTransport under test and the servers it reaches,
// as Env; the servers reach each other with the same data plane (a
// CopyChunk makes one fetch from another).
type PeerEnv struct {
	Transport client.PeerTransport
	Addrs     []string
	Pool      string
	Cold      func(t *testing.T, data []byte) client.ColdRef
}

// RunPeer runs the conformance tests of a client.PeerTransport: every
// Transport test of Run, then the calls the cluster's own processes make
// (forwards of writes, stats and extents, repair copies, KV forwards and
// the held KV calls of membership moves).
func RunPeer(t *testing.T, newEnv func(t *testing.T) PeerEnv) {
	t.Run("Transport", func(t *testing.T) {
		Run(t, func(t *testing.T) Env {
			e := newEnv(t)
			return Env{Transport: e.Transport, Addrs: e.Addrs, Pool: e.Pool, Cold: e.Cold}
		})
	})
	tests := []struct {
		name string
		fn   func(t *testing.T, e PeerEnv)
	}{
		{"ForwardChunk", testForwardChunk},
		{"StatAndExtents", testStatExtents},
		{"CopyChunk", testCopyChunk},
		{"KVHeld", testKVHeld},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			if len(e.Addrs) < 2 {
				t.Fatalf("transporttest: PeerEnv has %d servers, want at least 2", len(e.Addrs))
			}
			t.Cleanup(e.Transport.Close)
			tc.fn(t, e)
		})
	}
}

// split cuts p into buffers of uneven sizes, as DRAM pages and a frame's
// remainder are.
func split(p []byte, sizes ...int) [][]byte {
	var out [][]byte
	for _, n := range sizes {
		n = min(n, len(p))
		out = append(out, p[:n])
		p = p[n:]
	}
	return append(out, p)
}

// testForwardChunk: a replica's copy given as several buffers is stored as
// their bytes one after the other, synced or not; one whose CRC does not
// match stores nothing.
func testForwardChunk(t *testing.T, e PeerEnv) {
	c, tr, addr := ctx(t), e.Transport, e.Addrs[1]
	for _, sync := range []bool{false, true} {
		id := id()
		p := payload(300<<10+17, 7)
		bufs := split(p, 1, 64<<10, 0, 100<<10+3)
		if err := tr.ForwardChunk(c, addr, id, 0, bufs, crc32c.Checksum(bufs...), sync); err != nil {
			t.Fatalf("forward (sync %v): %v", sync, err)
		}
		tail := payload(5000, 8)
		if err := tr.ForwardChunk(c, addr, id, int64(len(p)), [][]byte{tail}, crc32c.Checksum(tail), sync); err != nil {
			t.Fatalf("forward of the tail (sync %v): %v", sync, err)
		}
		want := append(slices.Clone(p), tail...)
		dst := make([]byte, len(want))
		if err := tr.ReadChunk(c, addr, id, 0, dst); err != nil || !bytes.Equal(dst, want) {
			t.Fatalf("forwarded chunk (sync %v): %v (equal %v)", sync, err, bytes.Equal(dst, want))
		}
		if err := tr.ReadChunk(c, e.Addrs[0], id, 0, make([]byte, 1)); !errors.Is(err, errs.ErrNotFound) {
			t.Fatalf("a forward reached another server than addr: %v", err)
		}
	}
	id := id()
	p := payload(70<<10, 9)
	wantKind(t, "forward with a wrong CRC", tr.ForwardChunk(c, addr, id, 0, split(p, 1000), crc32c.Checksum(p)^1, false), errs.ErrChecksum)
	wantKind(t, "read of what a bad forward brought", tr.ReadChunk(c, addr, id, 0, make([]byte, 1)), errs.ErrNotFound)
}

// testStatExtents: a chunk's length, seal and written extents, as writes
// and a seal leave them.
func testStatExtents(t *testing.T, e PeerEnv) {
	c, tr, addr, id := ctx(t), e.Transport, e.Addrs[0], id()
	if _, _, err := tr.StatChunk(c, addr, id); !errors.Is(err, errs.ErrNotFound) {
		t.Fatalf("stat of a chunk never written: %v, want not found", err)
	}
	for _, off := range []int64{0, 200 << 10} {
		if err := tr.WriteChunk(c, addr, id, off, payload(1000, uint64(off)), nil); err != nil {
			t.Fatal(err)
		}
	}
	n, sealed, err := tr.StatChunk(c, addr, id)
	if err != nil || n != 200<<10+1000 || sealed {
		t.Fatalf("stat: %d bytes, sealed %v, %v; want %d, false", n, sealed, err, 200<<10+1000)
	}
	ext, n, sealed, err := tr.ChunkExtents(c, addr, id, 0, 300<<10)
	if want := []int64{0, 1000, 200 << 10, 200<<10 + 1000}; err != nil || !slices.Equal(ext, want) || n != 200<<10+1000 || sealed {
		t.Fatalf("extents %v of %d bytes (sealed %v), %v; want %v", ext, n, sealed, err, want)
	}
	ext, _, _, err = tr.ChunkExtents(c, addr, id, 500, 1000)
	if want := []int64{500, 1000}; err != nil || !slices.Equal(ext, want) {
		t.Fatalf("extents within [500, 1500): %v, %v; want %v", ext, err, want)
	}
	if err := tr.SealChunk(c, addr, id); err != nil {
		t.Fatal(err)
	}
	if _, sealed, err := tr.StatChunk(c, addr, id); err != nil || !sealed {
		t.Fatalf("stat after seal: sealed %v, %v", sealed, err)
	}
	// A prefetch is a hint: it answers, and changes no byte.
	if err := tr.PrefetchChunk(c, addr, id); err != nil {
		t.Fatalf("prefetch of a sealed chunk: %v", err)
	}
	got := make([]byte, 1000)
	if err := tr.ReadChunk(c, addr, id, 200<<10, got); err != nil || !bytes.Equal(got, payload(1000, 200<<10)) {
		t.Fatalf("read after prefetch: %v or other bytes", err)
	}
}

// testCopyChunk: a server asked to copy a chunk from another holds the same
// bytes, written extents and seal when the call returns.
func testCopyChunk(t *testing.T, e PeerEnv) {
	c, tr, src, dst, id := ctx(t), e.Transport, e.Addrs[0], e.Addrs[1], id()
	p := payload(600<<10, 10)
	if err := tr.WriteChunk(c, src, id, 0, p, nil); err != nil {
		t.Fatal(err)
	}
	if err := tr.WriteChunk(c, src, id, 1<<20, p[:100], nil); err != nil {
		t.Fatal(err)
	}
	if err := tr.SealChunk(c, src, id); err != nil {
		t.Fatal(err)
	}
	if err := tr.CopyChunk(c, dst, id, src); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(p))
	if err := tr.ReadChunk(c, dst, id, 0, got); err != nil || !bytes.Equal(got, p) {
		t.Fatalf("copied chunk: %v (equal %v)", err, bytes.Equal(got, p))
	}
	ext, n, sealed, err := tr.ChunkExtents(c, dst, id, 0, 2<<20)
	if want := []int64{0, 600 << 10, 1 << 20, 1<<20 + 100}; err != nil || !slices.Equal(ext, want) || n != 1<<20+100 || !sealed {
		t.Fatalf("copy's extents %v of %d bytes (sealed %v), %v; want %v, sealed", ext, n, sealed, err, want)
	}
	wantKind(t, "copy of a chunk the source lacks", tr.CopyChunk(c, dst, id+1, src), errs.ErrNotFound)
}

// testKVHeld: a forwarded put is stored under its verified CRC (a wrong one
// stores nothing), and the held calls see, read and delete what a server
// holds.
func testKVHeld(t *testing.T, e PeerEnv) {
	c, tr, addr := ctx(t), e.Transport, e.Addrs[0]
	ref := func(k string) client.KVRef { return client.KVRef{Pool: e.Pool, Key: []byte(k)} }
	v := payload(100<<10, 11)
	if existed, err := tr.KVPutChecked(c, addr, ref("held/a"), 0, v, false, crc32c.Checksum(v)); err != nil || existed {
		t.Fatalf("forwarded put: existed %v, %v", existed, err)
	}
	if existed, err := tr.KVPutChecked(c, addr, ref("held/a"), 0, v[:5], false, crc32c.Checksum(v[:5])); err != nil || !existed {
		t.Fatalf("forwarded put of a key there: existed %v, %v", existed, err)
	}
	if _, err := tr.KVPutChecked(c, addr, ref("held/bad"), 0, v, false, crc32c.Checksum(v)^1); !errors.Is(err, errs.ErrChecksum) {
		t.Fatalf("forwarded put with a wrong CRC: %v, want checksum", err)
	}
	if _, _, err := tr.KVExistsHeld(c, addr, ref("held/bad"), 0); !errors.Is(err, errs.ErrNotFound) {
		t.Fatalf("a put with a wrong CRC left a block: %v", err)
	}
	if got, err := tr.KVGetHeld(c, addr, ref("held/a"), 0); err != nil || !bytes.Equal(got, v) {
		t.Fatalf("held get: %v (equal %v)", err, bytes.Equal(got, v))
	}
	if size, tier, err := tr.KVExistsHeld(c, addr, ref("held/a"), 0); err != nil || size != int64(len(v)) || tier < 1 || tier > 2 {
		t.Fatalf("held exists: %d bytes in tier %d, %v", size, tier, err)
	}
	if r, gone, err := tr.KVRetentionHeld(c, addr, ref("held/a"), 0); err != nil || gone || r != (client.Retention{}) {
		t.Fatalf("retention of a plain block: %+v gone %v, %v", r, gone, err)
	}
	if _, _, err := tr.KVRetentionHeld(c, addr, ref("held/none"), 0); !errors.Is(err, errs.ErrNotFound) {
		t.Fatalf("retention of a missing block: %v, want not found", err)
	}
	if ok, err := tr.KVDeleteHeld(c, addr, ref("held/a"), 0); err != nil || !ok {
		t.Fatalf("held delete: %v, %v", ok, err)
	}
	if ok, err := tr.KVDeleteHeld(c, addr, ref("held/a"), 0); err != nil || ok {
		t.Fatalf("held delete of a deleted key: %v, %v", ok, err)
	}
	if _, err := tr.KVGetHeld(c, addr, ref("held/a"), 0); !errors.Is(err, errs.ErrNotFound) {
		t.Fatalf("held get after delete: %v", err)
	}
	for _, k := range []string{"pre/1", "pre/2", "other"} {
		if _, err := tr.KVPutChecked(c, addr, ref(k), 0, []byte(k), false, crc32c.Checksum([]byte(k))); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := tr.KVPutChecked(c, e.Addrs[1], ref("pre/3"), 0, []byte("x"), false, crc32c.Checksum([]byte("x"))); err != nil {
		t.Fatal(err)
	}
	if n, err := tr.KVDeletePrefixHeld(c, addr, ref("pre/"), 0); err != nil || n != 2 {
		t.Fatalf("held prefix delete: %d keys, %v; want 2 (addr's only)", n, err)
	}
	if _, _, err := tr.KVExistsHeld(c, e.Addrs[1], ref("pre/3"), 0); err != nil {
		t.Fatalf("a held prefix delete reached another server: %v", err)
	}
	if _, _, err := tr.KVExistsHeld(c, addr, ref("other"), 0); err != nil {
		t.Fatalf("a prefix delete took a key outside the prefix: %v", err)
	}
}
