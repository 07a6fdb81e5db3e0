package store

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"sync"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/gd2fs/gd2fs/errs"
	"github.com/gd2fs/gd2fs/internal/crc32c"
	"github.com/gd2fs/gd2fs/internal/limits"
	"github.com/gd2fs/gd2fs/internal/testutil"
)

func open(t *testing.T, cfg Config) *Store {
	t.Helper()
	s, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	checkAfter(t, s) // cleanups run last first: before Close
	return s
}

func readAll(t *testing.T, s *Store, id uint64, off, n int64) []byte {
	t.Helper()
	var out []byte
	err := s.Read(id, off, n, func(bufs [][]byte, crc uint32) error {
		for _, b := range bufs {
			out = append(out, b...)
		}
		if got := crc32c.Checksum(bufs...); got != crc {
			return fmt.Errorf("chunk %d [%d,+%d): combined CRC %08x, bytes have %08x", id, off, n, crc, got)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("read chunk %d [%d,+%d): %v", id, off, n, err)
	}
	return out
}

func rnd(n int, seed uint64) []byte { return testutil.RandomBytes(n, seed) }

// fillViews copies p into the views of a direct write, as a socket read would.
func fillViews(dst [][]byte, p []byte) {
	for _, d := range dst {
		p = p[copy(d, p):]
	}
}

// model applies the same writes to a plain byte slice.
func modelWrite(m []byte, off int, p []byte) []byte {
	if need := off + len(p); need > len(m) {
		m = append(m, make([]byte, need-len(m))...)
	}
	copy(m[off:], p)
	return m
}

func TestTiersAgreeWithModel(t *testing.T) {
	configs := map[string]Config{
		"mem":      {MemBytes: 8 << 20},
		"disk":     {Dir: t.TempDir(), DiskBytes: 64 << 20},
		"mem+disk": {MemBytes: 1 << 20, Dir: t.TempDir(), DiskBytes: 64 << 20}, // 1 MiB DRAM forces eviction
	}
	for name, cfg := range configs {
		t.Run(name, func(t *testing.T) {
			s := open(t, cfg)
			r := rand.New(rand.NewPCG(7, 7))
			models := map[uint64][]byte{}
			for i := 0; i < 200; i++ {
				id := uint64(r.IntN(4) + 1)
				off := r.IntN(600 << 10)
				p := rnd(r.IntN(200<<10)+1, uint64(i))
				// Half the writes go the zero-copy way where the store
				// takes them (new bytes: appends and holes), one in eight
				// of those with a bad CRC first, which must change nothing
				// (half of those are not followed by the good write).
				direct := false
				if r.IntN(2) == 0 {
					if r.IntN(8) == 0 {
						if dst, pw, ok := s.BeginWrite(id, int64(off), len(p)); ok {
							fillViews(dst, p)
							if err := pw.Commit(crc32c.Checksum(p) ^ 1); !errors.Is(err, errs.ErrChecksum) {
								t.Fatalf("step %d: a direct write with a bad CRC: %v", i, err)
							}
							if r.IntN(2) == 0 {
								continue // and nothing written after it
							}
						}
					}
					if dst, pw, ok := s.BeginWrite(id, int64(off), len(p)); ok {
						fillViews(dst, p)
						if err := pw.Commit(crc32c.Checksum(p)); err != nil {
							t.Fatal(err)
						}
						direct = true
					}
				}
				if !direct {
					if err := s.Write(id, int64(off), p); err != nil {
						t.Fatal(err)
					}
				}
				models[id] = modelWrite(models[id], off, p)
				if i%7 == 0 {
					m := models[id]
					o := r.IntN(len(m))
					n := r.IntN(len(m) - o + 1)
					if got := readAll(t, s, id, int64(o), int64(n)); !bytes.Equal(got, m[o:o+n]) {
						t.Fatalf("step %d: chunk %d [%d,+%d) differs from model", i, id, o, n)
					}
				}
			}
			for id, m := range models {
				if got := readAll(t, s, id, 0, int64(len(m))); !bytes.Equal(got, m) {
					t.Fatalf("chunk %d differs from model", id)
				}
			}
			if cfg.Dir != "" {
				s.Close()
				s2 := open(t, Config{Dir: cfg.Dir, DiskBytes: cfg.DiskBytes, MemBytes: cfg.MemBytes})
				for id, m := range models {
					if got := readAll(t, s2, id, 0, int64(len(m))); !bytes.Equal(got, m) {
						t.Fatalf("after restart chunk %d differs", id)
					}
				}
				if u := s2.Usage(); u.Chunks != len(models) {
					t.Fatalf("after restart %d chunks, want %d", u.Chunks, len(models))
				}
			}
		})
	}
}

func TestErrors(t *testing.T) {
	dir := t.TempDir()
	s := open(t, Config{Dir: dir, DiskBytes: 1 << 20})
	if err := s.Write(1, 0, make([]byte, 1000)); err != nil {
		t.Fatal(err)
	}
	if err := s.Read(1, 500, 501, func([][]byte, uint32) error { return nil }); !errors.Is(err, errs.ErrOutOfRange) {
		t.Fatalf("read past end: %v", err)
	}
	if err := s.Read(2, 0, 1, func([][]byte, uint32) error { return nil }); !errors.Is(err, errs.ErrNotFound) {
		t.Fatalf("unknown chunk: %v", err)
	}
	if err := s.Write(3, 0, make([]byte, 2<<20)); !errors.Is(err, errs.ErrNoSpace) {
		t.Fatalf("full disk: %v", err)
	}
	if _, err := s.Stat(3); !errors.Is(err, errs.ErrNotFound) {
		t.Fatalf("failed first write left chunk 3 behind: %v", err)
	}
	if err := s.Write(4, limits.MaxChunk-1, []byte{1, 2}); !errors.Is(err, errs.ErrOutOfRange) {
		t.Fatalf("beyond chunk limit: %v", err)
	}
	if err := s.Seal(1); err != nil {
		t.Fatal(err)
	}
	if err := s.Write(1, 1000, []byte{1}); !errors.Is(err, errs.ErrSealed) {
		t.Fatalf("write to sealed: %v", err)
	}
	// The data written before is intact after all those failures.
	if got := readAll(t, s, 1, 0, 1000); !bytes.Equal(got, make([]byte, 1000)) {
		t.Fatal("chunk 1 changed")
	}
	if err := s.Delete(1); err != nil {
		t.Fatal(err)
	}
	if u := s.Usage(); u.DiskUsed != 0 || u.Chunks != 0 {
		t.Fatalf("after delete: %+v", u)
	}

	m := open(t, Config{MemBytes: 256 << 10})
	if err := m.Write(1, 0, make([]byte, 300<<10)); !errors.Is(err, errs.ErrNoSpace) {
		t.Fatalf("full DRAM without disk: %v", err)
	}
}

func TestCorruptBlockIsAnErrorNotData(t *testing.T) {
	dir := t.TempDir()
	s := open(t, Config{Dir: dir, DiskBytes: 64 << 20})
	data := rnd(3*limits.BlockSize+100, 3)
	if err := s.Write(9, 0, data); err != nil {
		t.Fatal(err)
	}
	s.Close()
	f, err := os.OpenFile(s.path(9), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte{^data[limits.BlockSize+5]}, dataOff+limits.BlockSize+5); err != nil {
		t.Fatal(err)
	}
	f.Close()
	s2 := open(t, Config{Dir: dir, DiskBytes: 64 << 20})
	if got := readAll(t, s2, 9, 0, limits.BlockSize); !bytes.Equal(got, data[:limits.BlockSize]) {
		t.Fatal("undamaged block differs")
	}
	err = s2.Read(9, limits.BlockSize, 10, func([][]byte, uint32) error { t.Fatal("damaged bytes handed out"); return nil })
	if !errors.Is(err, errs.ErrChecksum) {
		t.Fatalf("damaged block: %v", err)
	}
	// A damaged header drops the chunk as a miss.
	f, _ = os.OpenFile(s.path(9), os.O_RDWR, 0)
	f.WriteAt([]byte{0xff}, 9)
	f.Close()
	s3 := open(t, Config{Dir: dir, DiskBytes: 64 << 20})
	if _, err := s3.Stat(9); !errors.Is(err, errs.ErrNotFound) {
		t.Fatalf("damaged header: %v", err)
	}
}

func TestConcurrentWritersAndReaders(t *testing.T) {
	s := open(t, Config{MemBytes: 2 << 20, Dir: t.TempDir(), DiskBytes: 256 << 20})
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			id := uint64(g)
			data := rnd(1<<20, uint64(g))
			for off := 0; off < len(data); off += 100 << 10 {
				end := min(off+100<<10, len(data))
				if err := s.Write(id, int64(off), data[off:end]); err != nil {
					t.Error(err)
					return
				}
			}
			for i := 0; i < 5; i++ {
				var got []byte
				if err := s.Read(id, 0, int64(len(data)), func(b [][]byte, _ uint32) error {
					for _, x := range b {
						got = append(got, x...)
					}
					return nil
				}); err != nil {
					t.Error(err)
					return
				}
				if !bytes.Equal(got, data) {
					t.Errorf("chunk %d differs", id)
				}
			}
		}(g)
	}
	wg.Wait()
	if st := s.Stats(); st.Evictions == 0 {
		t.Errorf("expected DRAM evictions with 8 MiB over 2 MiB, got %+v", st)
	}
}

func TestWriteChecked(t *testing.T) {
	s := open(t, Config{MemBytes: 4 << 20, Dir: t.TempDir(), DiskBytes: 64 << 20})
	p := rnd(200_000, 5)
	if err := s.WriteChecked(1, 1000, p, crc32c.Checksum(p)^1); !errors.Is(err, errs.ErrChecksum) {
		t.Fatalf("bad CRC: %v", err)
	}
	if _, err := s.Stat(1); !errors.Is(err, errs.ErrNotFound) {
		t.Fatal("a write with a bad CRC left a chunk behind")
	}
	if err := s.WriteChecked(1, 1000, p, crc32c.Checksum(p)); err != nil {
		t.Fatal(err)
	}
	want := append(make([]byte, 1000), p...)
	if got := readAll(t, s, 1, 0, int64(len(want))); !bytes.Equal(got, want) {
		t.Fatal("read back differs")
	}
}

func TestDirectWrite(t *testing.T) {
	dir := t.TempDir()
	s := open(t, Config{MemBytes: 8 << 20, Dir: dir, DiskBytes: 64 << 20})
	put := func(id uint64, off int64, p []byte, crc uint32) (bool, error) {
		dst, pw, ok := s.BeginWrite(id, off, len(p))
		if !ok {
			return false, nil
		}
		rest := p
		for _, d := range dst {
			copy(d, rest)
			rest = rest[len(d):]
		}
		return true, pw.Commit(crc)
	}
	a, b := rnd(300_000, 1), rnd(100_000, 2)
	if ok, err := put(1, 0, a, crc32c.Checksum(a)); !ok || err != nil {
		t.Fatalf("direct write of a new chunk: %v %v", ok, err)
	}
	// Appending with a hole, and a bad CRC that must change nothing.
	if ok, err := put(1, 400_000, b, crc32c.Checksum(b)^1); !ok || !errors.Is(err, errs.ErrChecksum) {
		t.Fatalf("bad CRC: %v %v", ok, err)
	}
	if info, _ := s.Stat(1); info.Length != 300_000 {
		t.Fatalf("a rejected write changed the length to %d", info.Length)
	}
	if ok, err := put(1, 400_000, b, crc32c.Checksum(b)); !ok || err != nil {
		t.Fatal(err)
	}
	// Overwriting stored bytes is declined (it goes through a buffer),
	// also when the write starts in the hole.
	if _, _, ok := s.BeginWrite(1, 10, 5); ok {
		t.Fatal("direct overwrite of stored bytes accepted")
	}
	if _, _, ok := s.BeginWrite(1, 350_000, 100_000); ok {
		t.Fatal("direct write over the hole and stored bytes accepted")
	}
	// The hole [300000, 400000), filled directly (a piece that arrived
	// after a later one): a bad CRC leaves it zeros, a good one fills it.
	h := rnd(100_000, 3)
	if ok, err := put(1, 300_000, h, crc32c.Checksum(h)^1); !ok || !errors.Is(err, errs.ErrChecksum) {
		t.Fatalf("bad CRC in the hole: %v %v", ok, err)
	}
	if got := readAll(t, s, 1, 250_000, 200_000); !bytes.Equal(got[50_000:150_000], make([]byte, 100_000)) {
		t.Fatal("a rejected write left bytes in the hole")
	}
	if ok, err := put(1, 300_000, h, crc32c.Checksum(h)); !ok || err != nil {
		t.Fatalf("direct write into the hole: %v %v", ok, err)
	}
	if info, _ := s.Stat(1); info.Length != 500_000 {
		t.Fatalf("filling the hole changed the length to %d", info.Length)
	}
	// A rejected first write leaves no chunk behind.
	if ok, err := put(2, 0, b, 0); !ok || err == nil {
		t.Fatal("bad CRC on a new chunk accepted")
	}
	if _, err := s.Stat(2); !errors.Is(err, errs.ErrNotFound) {
		t.Fatal("rejected first write left a chunk")
	}
	want := make([]byte, 500_000)
	copy(want, a)
	copy(want[300_000:], h)
	copy(want[400_000:], b)
	if got := readAll(t, s, 1, 0, 500_000); !bytes.Equal(got, want) {
		t.Fatal("direct writes read back wrong")
	}
	s.Close()
	s2 := open(t, Config{Dir: dir, DiskBytes: 64 << 20})
	if got := readAll(t, s2, 1, 0, 500_000); !bytes.Equal(got, want) {
		t.Fatal("direct writes did not reach the disk tier intact")
	}
}

// TestDirectWriteSums: a zero-copy write whose receiver summed each view
// as it read it (Pending.Sums) is checked against the payload's CRC from
// those sums: damaged bytes store nothing, good ones read back from DRAM
// and, after a reopen, from disk, where the stored block CRCs check them.
func TestDirectWriteSums(t *testing.T) {
	dir := t.TempDir()
	s := open(t, Config{MemBytes: 8 << 20, Dir: dir, DiskBytes: 64 << 20})
	put := func(id uint64, off int64, p []byte, crc uint32) error {
		dst, pw, ok := s.BeginWrite(id, off, len(p))
		if !ok {
			t.Fatalf("chunk %d: no zero-copy write", id)
		}
		sums := pw.Sums()
		rest := p
		for i, d := range dst {
			copy(d, rest)
			rest = rest[len(d):]
			sums[i] = crc32c.Checksum(d)
		}
		return pw.Commit(crc)
	}
	a := rnd(300_000, 3)
	damaged := append([]byte(nil), a...)
	damaged[200_000] ^= 1
	if err := put(1, 0, damaged, crc32c.Checksum(a)); !errors.Is(err, errs.ErrChecksum) {
		t.Fatalf("damaged payload: %v", err)
	}
	if _, err := s.Stat(1); !errors.Is(err, errs.ErrNotFound) {
		t.Fatal("a damaged first write left a chunk")
	}
	if err := put(1, 0, a, crc32c.Checksum(a)); err != nil {
		t.Fatal(err)
	}
	if got := readAll(t, s, 1, 0, int64(len(a))); !bytes.Equal(got, a) {
		t.Fatal("summed write reads back wrong from DRAM")
	}
	s.Close()
	s2 := open(t, Config{Dir: dir, DiskBytes: 64 << 20})
	if got := readAll(t, s2, 1, 0, int64(len(a))); !bytes.Equal(got, a) {
		t.Fatal("summed write reads back wrong from disk")
	}
}

// TestDiskFull: a full file system is errs.ErrNoSpace (the cause kept), and
// the usage a server reports counts what its file system cannot hold as
// used, so the master stops placing chunks on it.
func TestDiskFull(t *testing.T) {
	s := open(t, Config{Dir: t.TempDir(), DiskBytes: 1 << 50})
	err := s.diskErr(fmt.Errorf("store: write chunk 1: %w", unix.ENOSPC))
	if !errors.Is(err, errs.ErrNoSpace) || !errors.Is(err, unix.ENOSPC) {
		t.Fatalf("ENOSPC became %v", err)
	}
	if other := s.diskErr(io.ErrShortWrite); errors.Is(other, errs.ErrNoSpace) {
		t.Fatalf("a short write became %v", other)
	}
	u := s.Usage()
	if u.DiskCap != 1<<50 || u.DiskUsed <= 0 || u.DiskUsed >= u.DiskCap {
		t.Fatalf("a 1 PiB disk tier on this file system reports %d of %d used; want the space the file system lacks counted as used", u.DiskUsed, u.DiskCap)
	}
}
