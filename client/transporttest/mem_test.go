package transporttest_test

// A Transport written outside package client, from its public types only,
// runs the conformance suite: the seam is one a package outside the module
// can implement. It keeps every server's chunks and KV blocks in memory.

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/gd2fs/gd2fs/client"
	"github.com/gd2fs/gd2fs/client/transporttest"
	"github.com/gd2fs/gd2fs/errs"
)

type memChunk struct {
	data   []byte
	sealed bool
}

type memServer struct {
	chunks map[uint64]*memChunk
	kv     map[string][]byte // pool + "\x00" + key
}

type memTransport struct {
	mu      sync.Mutex
	servers map[string]*memServer
	cold    map[string][]byte // URI → object
	closed  bool
}

func newMem(addrs ...string) *memTransport {
	m := &memTransport{servers: map[string]*memServer{}, cold: map[string][]byte{}}
	for _, a := range addrs {
		m.servers[a] = &memServer{chunks: map[uint64]*memChunk{}, kv: map[string][]byte{}}
	}
	return m
}

// server checks the call can go ahead and returns addr's state; m.mu held.
func (m *memTransport) server(ctx context.Context, addr string) (*memServer, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if m.closed {
		return nil, errs.New(errs.ErrUnavailable, "mem transport closed")
	}
	s := m.servers[addr]
	if s == nil {
		return nil, errs.New(errs.ErrUnavailable, "no server %s", addr)
	}
	return s, nil
}

func (m *memTransport) WriteChunk(ctx context.Context, addr string, id uint64, off int64, data []byte, forward []string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, a := range append([]string{addr}, forward...) {
		s, err := m.server(ctx, a)
		if err != nil {
			return err
		}
		c := s.chunks[id]
		if c == nil {
			c = &memChunk{}
			s.chunks[id] = c
		}
		if c.sealed {
			return errs.New(errs.ErrSealed, "chunk %d is sealed", id)
		}
		if need := off + int64(len(data)); need > int64(len(c.data)) {
			c.data = append(c.data, make([]byte, need-int64(len(c.data)))...)
		}
		copy(c.data[off:], data)
	}
	return nil
}

func (m *memTransport) read(s *memServer, id uint64, off int64, dst []byte) error {
	c := s.chunks[id]
	if c == nil {
		return errs.New(errs.ErrNotFound, "no chunk %d", id)
	}
	if off < 0 || off+int64(len(dst)) > int64(len(c.data)) {
		return errs.New(errs.ErrOutOfRange, "chunk %d holds %d bytes", id, len(c.data))
	}
	copy(dst, c.data[off:])
	return nil
}

func (m *memTransport) ReadChunk(ctx context.Context, addr string, id uint64, off int64, dst []byte) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	s, err := m.server(ctx, addr)
	if err != nil {
		return err
	}
	return m.read(s, id, off, dst)
}

func (m *memTransport) ReadChunkCold(ctx context.Context, addr string, ref client.ColdRef, off int64, dst []byte) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	s, err := m.server(ctx, addr)
	if err != nil {
		return false, err
	}
	filled := false
	if s.chunks[ref.ID] == nil {
		obj, ok := m.cold[ref.URI]
		if !ok || ref.Offset+ref.Length > int64(len(obj)) {
			return false, errs.New(errs.ErrNotFound, "no object %s", ref.URI)
		}
		s.chunks[ref.ID] = &memChunk{data: slices.Clone(obj[ref.Offset : ref.Offset+ref.Length]), sealed: true}
		filled = true
	}
	return filled, m.read(s, ref.ID, off, dst)
}

func (m *memTransport) SealChunk(ctx context.Context, addr string, id uint64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	s, err := m.server(ctx, addr)
	if err != nil {
		return err
	}
	c := s.chunks[id]
	if c == nil {
		return errs.New(errs.ErrNotFound, "no chunk %d", id)
	}
	c.sealed = true
	return nil
}

func kvKey(pool string, key []byte) string { return pool + "\x00" + string(key) }

func (m *memTransport) KVPut(ctx context.Context, addr string, ref client.KVRef, epoch int64, value []byte, overwrite bool) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	existed := false
	for i, a := range append([]string{addr}, ref.Forward...) {
		s, err := m.server(ctx, a)
		if err != nil {
			return false, err
		}
		k := kvKey(ref.Pool, ref.Key)
		if _, ok := s.kv[k]; ok && !overwrite {
			existed = existed || i == 0
			continue
		}
		s.kv[k] = slices.Clone(value)
	}
	return existed, nil
}

func (m *memTransport) KVGet(ctx context.Context, addr string, ref client.KVRef, epoch int64, dst []byte) ([]byte, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	s, err := m.server(ctx, addr)
	if err != nil {
		return nil, err
	}
	v, ok := s.kv[kvKey(ref.Pool, ref.Key)]
	if !ok {
		return nil, errs.New(errs.ErrNotFound, "no key %q", ref.Key)
	}
	if dst == nil {
		return slices.Clone(v), nil
	}
	if len(v) > len(dst) {
		return nil, errs.New(errs.ErrTooLarge, "value of %d bytes, buffer of %d", len(v), len(dst))
	}
	return dst[:copy(dst, v)], nil
}

func (m *memTransport) KVExists(ctx context.Context, addr string, ref client.KVRef, epoch int64) (int64, int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	s, err := m.server(ctx, addr)
	if err != nil {
		return 0, 0, err
	}
	v, ok := s.kv[kvKey(ref.Pool, ref.Key)]
	if !ok {
		return 0, 0, errs.New(errs.ErrNotFound, "no key %q", ref.Key)
	}
	return int64(len(v)), 1, nil
}

func (m *memTransport) KVDelete(ctx context.Context, addr string, ref client.KVRef, epoch int64, prefix bool) (int64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	s, err := m.server(ctx, addr)
	if err != nil {
		return 0, err
	}
	k := kvKey(ref.Pool, ref.Key)
	var n int64
	for key := range s.kv {
		if key == k || prefix && strings.HasPrefix(key, k) {
			delete(s.kv, key)
			n++
		}
	}
	return n, nil
}

// KVScan's cursor is the position in the sorted keys, plus one.
func (m *memTransport) KVScan(ctx context.Context, addr, pool string, cursor uint64, count int) ([]string, uint64, int64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	s, err := m.server(ctx, addr)
	if err != nil {
		return nil, 0, 0, err
	}
	var keys []string
	for k := range s.kv {
		if p, key, ok := strings.Cut(k, "\x00"); ok && p == pool {
			keys = append(keys, key)
		}
	}
	slices.Sort(keys)
	total := int64(len(keys))
	if count == 0 {
		return nil, 0, total, nil
	}
	from := min(int(cursor), len(keys))
	to := min(from+count, len(keys))
	next := uint64(to)
	if to == len(keys) {
		next = 0
	}
	return keys[from:to], next, total, nil
}

func (m *memTransport) Close() {
	m.mu.Lock()
	m.closed = true
	m.mu.Unlock()
}

func TestMemTransportConforms(t *testing.T) {
	transporttest.Run(t, func(t *testing.T) transporttest.Env {
		m := newMem("mem-a", "mem-b", "mem-c")
		n := 0
		return transporttest.Env{Transport: m, Addrs: []string{"mem-a", "mem-b", "mem-c"}, Pool: "perf",
			Cold: func(t *testing.T, data []byte) client.ColdRef {
				n++
				uri := fmt.Sprintf("s3://cold/object-%d", n)
				m.mu.Lock()
				m.cold[uri] = slices.Clone(data)
				m.mu.Unlock()
				return client.ColdRef{ID: uint64(1<<50 + n), Length: int64(len(data)), URI: uri, ETag: "e"}
			}}
	})
}

// dropForward loses the forwarded copies of chunk writes.
type dropForward struct{ *memTransport }

func (d dropForward) WriteChunk(ctx context.Context, addr string, id uint64, off int64, data []byte, forward []string) error {
	return d.memTransport.WriteChunk(ctx, addr, id, off, data, nil)
}

// TestSuiteCatchesFaults: the suite is able to fail: run in a child
// process, it fails a transport that loses forwarded writes, naming the
// test that caught it.
func TestSuiteCatchesFaults(t *testing.T) {
	if os.Getenv("TRANSPORTTEST_LOSSY") == "1" {
		transporttest.Run(t, func(t *testing.T) transporttest.Env {
			return transporttest.Env{Transport: dropForward{newMem("mem-a", "mem-b")}, Addrs: []string{"mem-a", "mem-b"}, Pool: "perf"}
		})
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestSuiteCatchesFaults$")
	cmd.Env = append(os.Environ(), "TRANSPORTTEST_LOSSY=1")
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("the suite passed a transport that drops forwarded writes:\n%s", out)
	}
	if !strings.Contains(string(out), "--- FAIL: TestSuiteCatchesFaults/Forward") {
		t.Fatalf("the suite failed, but not in its Forward test:\n%s", out)
	}
}
