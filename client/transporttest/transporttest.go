// Package transporttest is the conformance suite of client.Transport: every
// implementation of the SDK's data plane runs it (the TCP transport in
// client/transport_test.go; any other, from its own package, against its
// own servers), so the SDK can rely on the same behaviour from each.
//
//	func TestConformance(t *testing.T) {
//		transporttest.Run(t, func(t *testing.T) transporttest.Env {
//			return transporttest.Env{Transport: myTransport(...), Addrs: myServers(t), Pool: "perf"}
//		})
//	}
package transporttest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gd2fs/gd2fs/client"
	"github.com/gd2fs/gd2fs/errs"
)

// Env is an implementation under test and the servers it reaches.
type Env struct {
	// Transport is a fresh transport; the suite closes it.
	Transport client.Transport
	// Addrs are at least two data servers, each owning every KV key (no
	// membership map, or one that gives them all), that the transport
	// reaches. The suite uses chunk ids and keys of its own.
	Addrs []string
	// Pool is the KV pool the suite writes to.
	Pool string
	// Cold, when set, stores data as an object of the cold tier and
	// returns the ref of one chunk covering all of it; nil skips the cold
	// tests.
	Cold func(t *testing.T, data []byte) client.ColdRef
}

var nextID atomic.Uint64

// id returns a chunk id no other test of this process uses.
func id() uint64 { return 1<<40 + uint64(time.Now().UnixNano())&(1<<30-1)<<8 + nextID.Add(1) }

func payload(n int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// Run runs every conformance test; newEnv is called once per test.
func Run(t *testing.T, newEnv func(t *testing.T) Env) {
	tests := []struct {
		name string
		fn   func(t *testing.T, e Env)
	}{
		{"ChunkRoundTrip", testChunkRoundTrip},
		{"ChunkErrors", testChunkErrors},
		{"Forward", testForward},
		{"Seal", testSeal},
		{"Cold", testCold},
		{"KV", testKV},
		{"KVPrefixAndScan", testKVScan},
		{"Concurrent", testConcurrent},
		{"Canceled", testCanceled},
		{"Closed", testClosed},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			if len(e.Addrs) < 2 {
				t.Fatalf("transporttest: Env has %d servers, want at least 2", len(e.Addrs))
			}
			if tc.name != "Closed" {
				t.Cleanup(e.Transport.Close)
			}
			tc.fn(t, e)
		})
	}
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

func wantKind(t *testing.T, what string, err, kind error) {
	t.Helper()
	if !errors.Is(err, kind) {
		t.Fatalf("%s: %v, want %v", what, err, kind)
	}
}

// testChunkRoundTrip: writes at any offsets read back as a model of the
// chunk says, in any ranges.
func testChunkRoundTrip(t *testing.T, e Env) {
	c, tr, addr, id := ctx(t), e.Transport, e.Addrs[0], id()
	var model []byte
	r := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 12; i++ {
		off := r.IntN(300 << 10)
		p := payload(r.IntN(200<<10)+1, uint64(i))
		if err := tr.WriteChunk(c, addr, id, int64(off), p, nil); err != nil {
			t.Fatalf("write [%d,+%d): %v", off, len(p), err)
		}
		if need := off + len(p); need > len(model) {
			model = append(model, make([]byte, need-len(model))...)
		}
		copy(model[off:], p)
		for j := 0; j < 4; j++ {
			ro := r.IntN(len(model))
			n := r.IntN(len(model)-ro) + 1
			dst := make([]byte, n)
			if err := tr.ReadChunk(c, addr, id, int64(ro), dst); err != nil {
				t.Fatalf("read [%d,+%d) of %d bytes: %v", ro, n, len(model), err)
			}
			if !bytes.Equal(dst, model[ro:ro+n]) {
				t.Fatalf("read [%d,+%d): bytes differ from what was written", ro, n)
			}
		}
	}
	whole := make([]byte, len(model))
	if err := tr.ReadChunk(c, addr, id, 0, whole); err != nil || !bytes.Equal(whole, model) {
		t.Fatalf("whole chunk: %v (equal %v)", err, bytes.Equal(whole, model))
	}
	if err := tr.ReadChunk(c, addr, id, 5, nil); err != nil {
		t.Fatalf("empty read: %v", err)
	}
}

func testChunkErrors(t *testing.T, e Env) {
	c, tr, addr, id := ctx(t), e.Transport, e.Addrs[0], id()
	wantKind(t, "read of a chunk never written", tr.ReadChunk(c, addr, id, 0, make([]byte, 10)), errs.ErrNotFound)
	if err := tr.WriteChunk(c, addr, id, 0, payload(1000, 3), nil); err != nil {
		t.Fatal(err)
	}
	wantKind(t, "read past the end", tr.ReadChunk(c, addr, id, 900, make([]byte, 200)), errs.ErrOutOfRange)
	wantKind(t, "read starting past the end", tr.ReadChunk(c, addr, id, 5000, make([]byte, 1)), errs.ErrOutOfRange)
	wantKind(t, "read on the other server", tr.ReadChunk(c, e.Addrs[1], id, 0, make([]byte, 10)), errs.ErrNotFound)
}

// testForward: a write forwarded to another server is there when the write
// returns, byte for byte.
func testForward(t *testing.T, e Env) {
	c, tr, id := ctx(t), e.Transport, id()
	p := payload(700<<10, 4)
	if err := tr.WriteChunk(c, e.Addrs[0], id, 0, p, e.Addrs[1:2]); err != nil {
		t.Fatal(err)
	}
	for _, addr := range e.Addrs[:2] {
		dst := make([]byte, len(p))
		if err := tr.ReadChunk(c, addr, id, 0, dst); err != nil || !bytes.Equal(dst, p) {
			t.Fatalf("replica %s after a forwarded write: %v (equal %v)", addr, err, bytes.Equal(dst, p))
		}
	}
}

func testSeal(t *testing.T, e Env) {
	c, tr, addr, id := ctx(t), e.Transport, e.Addrs[0], id()
	p := payload(5000, 5)
	if err := tr.WriteChunk(c, addr, id, 0, p, nil); err != nil {
		t.Fatal(err)
	}
	if err := tr.SealChunk(c, addr, id); err != nil {
		t.Fatal(err)
	}
	if err := tr.SealChunk(c, addr, id); err != nil {
		t.Fatalf("sealing twice: %v", err)
	}
	wantKind(t, "write to a sealed chunk", tr.WriteChunk(c, addr, id, 5000, []byte("more"), nil), errs.ErrSealed)
	dst := make([]byte, len(p))
	if err := tr.ReadChunk(c, addr, id, 0, dst); err != nil || !bytes.Equal(dst, p) {
		t.Fatalf("read of a sealed chunk: %v", err)
	}
}

// testCold: the first read of a linked chunk fills it from the cold tier
// (filled), later ones are served as stored.
func testCold(t *testing.T, e Env) {
	if e.Cold == nil {
		t.Skip("no cold tier in this Env")
	}
	c, tr, addr := ctx(t), e.Transport, e.Addrs[0]
	data := payload(300<<10, 6)
	ref := e.Cold(t, data)
	dst := make([]byte, 1000)
	filled, err := tr.ReadChunkCold(c, addr, ref, 12345, dst)
	if err != nil || !filled || !bytes.Equal(dst, data[12345:13345]) {
		t.Fatalf("first cold read: filled %v, %v (equal %v)", filled, err, bytes.Equal(dst, data[12345:13345]))
	}
	whole := make([]byte, len(data))
	filled, err = tr.ReadChunkCold(c, addr, ref, 0, whole)
	if err != nil || filled || !bytes.Equal(whole, data) {
		t.Fatalf("second cold read: filled %v (want false), %v (equal %v)", filled, err, bytes.Equal(whole, data))
	}
	if err := tr.ReadChunk(c, addr, ref.ID, 0, whole); err != nil || !bytes.Equal(whole, data) {
		t.Fatalf("plain read of a filled chunk: %v", err)
	}
}

func testKV(t *testing.T, e Env) {
	c, tr, addr := ctx(t), e.Transport, e.Addrs[0]
	key := []byte(fmt.Sprintf("transporttest/%d/block", id()))
	ref := client.KVRef{Pool: e.Pool, Key: key}
	_, err := tr.KVGet(c, addr, ref, 0, nil)
	wantKind(t, "get of a key never put", err, errs.ErrNotFound)
	_, _, err = tr.KVExists(c, addr, ref, 0)
	wantKind(t, "exists of a key never put", err, errs.ErrNotFound)
	v1, v2 := payload(100<<10, 7), payload(50<<10, 8)
	if existed, err := tr.KVPut(c, addr, ref, 0, v1, false); err != nil || existed {
		t.Fatalf("first put: existed %v, %v", existed, err)
	}
	if existed, err := tr.KVPut(c, addr, ref, 0, v2, false); err != nil || !existed {
		t.Fatalf("put without overwrite of a key that exists: existed %v, %v", existed, err)
	}
	got, err := tr.KVGet(c, addr, ref, 0, nil)
	if err != nil || !bytes.Equal(got, v1) {
		t.Fatalf("get after a put that kept the first value: %v (equal %v)", err, bytes.Equal(got, v1))
	}
	if existed, err := tr.KVPut(c, addr, ref, 0, v2, true); err != nil || existed {
		t.Fatalf("overwrite: existed %v, %v", existed, err)
	}
	dst := make([]byte, 64<<10)
	got, err = tr.KVGet(c, addr, ref, 0, dst)
	if err != nil || !bytes.Equal(got, v2) || &got[0] != &dst[0] {
		t.Fatalf("get into a buffer: %v (equal %v, in the buffer %v)", err, bytes.Equal(got, v2), err == nil && &got[0] == &dst[0])
	}
	_, err = tr.KVGet(c, addr, ref, 0, make([]byte, 10))
	wantKind(t, "get into a buffer too small", err, errs.ErrTooLarge)
	size, tier, err := tr.KVExists(c, addr, ref, 0)
	if err != nil || size != int64(len(v2)) || tier < 1 || tier > 2 {
		t.Fatalf("exists: size %d tier %d, %v", size, tier, err)
	}
	if n, err := tr.KVDelete(c, addr, ref, 0, false); err != nil || n != 1 {
		t.Fatalf("delete: %d, %v", n, err)
	}
	_, err = tr.KVGet(c, addr, ref, 0, nil)
	wantKind(t, "get after delete", err, errs.ErrNotFound)
	if n, err := tr.KVDelete(c, addr, ref, 0, false); err != nil || n != 0 {
		t.Fatalf("delete of a missing key: %d, %v", n, err)
	}
	// A put forwarded to the second server is there when it returns.
	fref := client.KVRef{Pool: e.Pool, Key: append(key, "-fwd"...), Forward: e.Addrs[1:2]}
	if _, err := tr.KVPut(c, addr, fref, 0, v1, false); err != nil {
		t.Fatal(err)
	}
	got, err = tr.KVGet(c, e.Addrs[1], client.KVRef{Pool: e.Pool, Key: fref.Key}, 0, nil)
	if err != nil || !bytes.Equal(got, v1) {
		t.Fatalf("forwarded put on the replica: %v", err)
	}
}

func testKVScan(t *testing.T, e Env) {
	c, tr, addr := ctx(t), e.Transport, e.Addrs[0]
	prefix := fmt.Sprintf("transporttest/%d/", id())
	var want []string
	for i := 0; i < 40; i++ {
		k := fmt.Sprintf("%s%03d", prefix, i)
		want = append(want, k)
		if _, err := tr.KVPut(c, addr, client.KVRef{Pool: e.Pool, Key: []byte(k)}, 0, []byte(k), false); err != nil {
			t.Fatal(err)
		}
	}
	var got []string
	var cursor uint64
	for rounds := 0; ; rounds++ {
		keys, next, total, err := tr.KVScan(c, addr, e.Pool, cursor, 7)
		if err != nil {
			t.Fatal(err)
		}
		if total < int64(len(want)) {
			t.Fatalf("scan total %d, but %d keys were put", total, len(want))
		}
		if next >= 1<<56 {
			t.Fatalf("scan cursor %x does not fit in 56 bits", next)
		}
		got = append(got, keys...)
		if cursor = next; cursor == 0 {
			break
		}
		if rounds > 10000 {
			t.Fatal("scan never ends")
		}
	}
	for _, k := range want {
		if !slices.Contains(got, k) {
			t.Fatalf("scan missed key %q", k)
		}
	}
	if _, _, total, err := tr.KVScan(c, addr, e.Pool, 0, 0); err != nil || total < int64(len(want)) {
		t.Fatalf("scan for the total: %d, %v", total, err)
	}
	n, err := tr.KVDelete(c, addr, client.KVRef{Pool: e.Pool, Key: []byte(prefix)}, 0, true)
	if err != nil || n != int64(len(want)) {
		t.Fatalf("delete by prefix: %d keys, %v; want %d", n, err, len(want))
	}
	_, err = tr.KVGet(c, addr, client.KVRef{Pool: e.Pool, Key: []byte(want[0])}, 0, nil)
	wantKind(t, "get after delete by prefix", err, errs.ErrNotFound)
}

// testConcurrent: many calls in flight at once on one transport (run it
// with -race) each get their own answer.
func testConcurrent(t *testing.T, e Env) {
	c, tr := ctx(t), e.Transport
	var wg sync.WaitGroup
	errc := make(chan error, 64)
	for g := 0; g < 32; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			addr, id := e.Addrs[g%len(e.Addrs)], id()
			for i := 0; i < 8; i++ {
				p := payload(16<<10+g*100+i, uint64(g*100+i))
				off := int64(i) * 32 << 10
				if err := tr.WriteChunk(c, addr, id, off, p, nil); err != nil {
					errc <- err
					return
				}
				dst := make([]byte, len(p))
				if err := tr.ReadChunk(c, addr, id, off, dst); err != nil {
					errc <- err
					return
				}
				if !bytes.Equal(dst, p) {
					errc <- fmt.Errorf("goroutine %d, piece %d: read another call's bytes", g, i)
					return
				}
				k := client.KVRef{Pool: e.Pool, Key: fmt.Appendf(nil, "transporttest/c/%d/%d", id, i)}
				if _, err := tr.KVPut(c, addr, k, 0, p[:100], false); err != nil {
					errc <- err
					return
				}
				if v, err := tr.KVGet(c, addr, k, 0, nil); err != nil || !bytes.Equal(v, p[:100]) {
					errc <- fmt.Errorf("goroutine %d: kv get %v (equal %v)", g, err, bytes.Equal(v, p[:100]))
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Error(err)
	}
}

// testCanceled: a call under a context already ended fails and leaves the
// transport usable.
func testCanceled(t *testing.T, e Env) {
	tr, addr, id := e.Transport, e.Addrs[0], id()
	if err := tr.WriteChunk(ctx(t), addr, id, 0, payload(1000, 9), nil); err != nil {
		t.Fatal(err)
	}
	dead, cancel := context.WithCancel(context.Background())
	cancel()
	if err := tr.ReadChunk(dead, addr, id, 0, make([]byte, 1000)); err == nil {
		t.Fatal("a read under a canceled context succeeded")
	}
	if err := tr.WriteChunk(dead, addr, id, 0, []byte("x"), nil); err == nil {
		t.Fatal("a write under a canceled context succeeded")
	}
	if err := tr.ReadChunk(ctx(t), addr, id, 0, make([]byte, 1000)); err != nil {
		t.Fatalf("a read after a canceled one: %v", err)
	}
}

// testClosed: calls after Close fail (they neither hang nor succeed).
func testClosed(t *testing.T, e Env) {
	tr, addr, id := e.Transport, e.Addrs[0], id()
	if err := tr.WriteChunk(ctx(t), addr, id, 0, []byte("hello"), nil); err != nil {
		t.Fatal(err)
	}
	tr.Close()
	if err := tr.ReadChunk(ctx(t), addr, id, 0, make([]byte, 5)); err == nil {
		t.Fatal("a read after Close succeeded")
	}
	if _, err := tr.KVGet(ctx(t), addr, client.KVRef{Pool: e.Pool, Key: []byte("k")}, 0, nil); err == nil {
		t.Fatal("a KV get after Close succeeded")
	}
}
