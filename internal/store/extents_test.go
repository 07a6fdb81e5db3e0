package store

import (
	"encoding/binary"
	"errors"
	"hash/crc32"
	"math/rand/v2"
	"os"
	"slices"
	"testing"

	"github.com/gd2fs/gd2fs/errs"
	"github.com/gd2fs/gd2fs/internal/crc32c"
	"github.com/gd2fs/gd2fs/internal/limits"
)

// TestExtentSetModel: random adds and removes against a byte map: the set is
// always exactly the bytes added and not removed since, sorted, apart.
func TestExtentSetModel(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	// Exactness against an independent model.
	for round := range 200 {
		var e extentSet
		model := make([]bool, 300)
		for range 30 {
			a := r.Int64N(300)
			b := a + r.Int64N(300-a) + 1
			add := r.IntN(4) != 0
			if add {
				e.add(a, b)
			} else {
				e.remove(a, b)
			}
			for i := a; i < b; i++ {
				model[i] = add
			}
			var want []int64
			for i := int64(0); i < 300; i++ {
				if model[i] && (i == 0 || !model[i-1]) {
					want = append(want, i)
				}
				if model[i] && (i == 299 || !model[i+1]) {
					want = append(want, i+1)
				}
			}
			if !slices.Equal(e.iv, want) {
				t.Fatalf("round %d: set %v, model %v", round, e.iv, want)
			}
		}
	}
}

// TestSequentialWritesAreOneExtent: a chunk written in order, in any number
// of writes, direct (into DRAM pages) or buffered, is one extent; a hole
// stays a hole until it is written.
func TestSequentialWritesAreOneExtent(t *testing.T) {
	s := open(t, Config{MemBytes: 8 << 20, Dir: t.TempDir(), DiskBytes: 64 << 20})
	for i := range int64(100) {
		p := rnd(10_000, uint64(i))
		if i%2 == 0 {
			if err := s.Write(1, i*10_000, p); err != nil {
				t.Fatal(err)
			}
			continue
		}
		dst, pw, ok := s.BeginWrite(1, i*10_000, len(p))
		if !ok {
			t.Fatal("direct write declined")
		}
		rest := p
		for _, d := range dst {
			rest = rest[copy(d, rest):]
		}
		if err := pw.Commit(crc32c.Checksum(p)); err != nil {
			t.Fatal(err)
		}
	}
	if ext, l, _, err := s.Extents(1, 0, limits.MaxChunk); err != nil || l != 1_000_000 || !slices.Equal(ext, []int64{0, 1_000_000}) {
		t.Fatalf("extents %v length %d err %v, want one extent [0, 1000000)", ext, l, err)
	}
	if err := s.Write(1, 2_000_000, rnd(100, 9)); err != nil {
		t.Fatal(err)
	}
	ext, _, _, _ := s.Extents(1, 500_000, 2_000_000)
	if !slices.Equal(ext, []int64{500_000, 1_000_000, 2_000_000, 2_000_100}) {
		t.Fatalf("with a hole: %v", ext)
	}
	if err := s.Write(1, 1_000_000, make([]byte, 1_000_000)); err != nil {
		t.Fatal(err)
	}
	if ext, _, _, _ := s.Extents(1, 0, limits.MaxChunk); !slices.Equal(ext, []int64{0, 2_000_100}) {
		t.Fatalf("hole filled: %v", ext)
	}
}

// TestExtentsSurviveRestart: the written extents come back after a restart,
// sealed or not, and a chunk file of version 1 (written before extents were
// kept) loads as whole.
func TestExtentsSurviveRestart(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(Config{MemBytes: 4 << 20, Dir: dir, DiskBytes: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range [][2]int64{{0, 100}, {200_000, 300_000}, {1 << 20, 1<<20 + 5}} {
		if err := s.Write(1, w[0], rnd(int(w[1]-w[0]), 1)); err != nil {
			t.Fatal(err)
		}
		if err := s.Write(2, w[0], rnd(int(w[1]-w[0]), 2)); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Seal(2); err != nil {
		t.Fatal(err)
	}
	if err := s.Write(3, 0, rnd(70_000, 3)); err != nil {
		t.Fatal(err)
	}
	s.Close()
	// Chunk 3 as a version-1 file: its header says version 1, no record.
	p := s.path(3)
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	binary.LittleEndian.PutUint16(b[4:], 1)
	binary.LittleEndian.PutUint32(b[20:], crc32.Checksum(b[:20], crc32c.Table))
	clear(b[extRecordOff:crcTableOff])
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	s2 := open(t, Config{Dir: dir, DiskBytes: 64 << 20})
	want := []int64{0, 100, 200_000, 300_000, 1 << 20, 1<<20 + 5}
	for id := uint64(1); id <= 2; id++ {
		if ext, _, sealed, err := s2.Extents(id, 0, limits.MaxChunk); err != nil || !slices.Equal(ext, want) || sealed != (id == 2) {
			t.Fatalf("chunk %d after restart: %v sealed %v err %v, want %v", id, ext, sealed, err, want)
		}
	}
	if ext, _, _, _ := s2.Extents(3, 0, limits.MaxChunk); !slices.Equal(ext, []int64{0, 70_000}) {
		t.Fatalf("a version-1 chunk loads as %v, want whole", ext)
	}
	// A damaged record claims nothing (the bytes stay readable).
	s2.Close()
	b, _ = os.ReadFile(s.path(1))
	b[extRecordOff+9] ^= 1
	if err := os.WriteFile(s.path(1), b, 0o600); err != nil {
		t.Fatal(err)
	}
	s3 := open(t, Config{Dir: dir, DiskBytes: 64 << 20})
	if ext, _, _, err := s3.Extents(1, 0, limits.MaxChunk); err != nil || len(ext) != 0 {
		t.Fatalf("a damaged record claims %v (err %v)", ext, err)
	}
	readAll(t, s3, 1, 0, 100)
}

// TestExtentLimit: a write that would leave a chunk in more separate pieces
// than are tracked is refused and stores nothing; filling a gap is accepted.
func TestExtentLimit(t *testing.T) {
	s := open(t, Config{MemBytes: 1 << 20})
	for i := range int64(limits.MaxChunkExtents) {
		if err := s.Write(1, i*10, []byte{1}); err != nil {
			t.Fatal(i, err)
		}
	}
	info, _ := s.Stat(1)
	err := s.Write(1, limits.MaxChunkExtents*10, []byte{1})
	if !errors.Is(err, errs.ErrTooLarge) {
		t.Fatalf("write number %d: %v", limits.MaxChunkExtents+1, err)
	}
	if again, _ := s.Stat(1); again.Length != info.Length {
		t.Fatal("a refused write changed the chunk")
	}
	if err := s.Write(1, 1, make([]byte, 9)); err != nil { // joins two pieces
		t.Fatal(err)
	}
	if err := s.Write(1, limits.MaxChunkExtents*10, []byte{1}); err != nil {
		t.Fatal(err)
	}
}
