package chaos

import (
	"encoding/binary"
	"fmt"
	"hash/fnv"
)

// The content model: byte i of the object named key is a pure function of
// (seed, key, i), so a reader checks any range of any file without keeping
// what was written. Words of 8 bytes come from splitmix64 over the word
// index, which makes fill and check of an arbitrary offset cheap.

func keyHash(seed uint64, key string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(key))
	return h.Sum64() ^ seed*0x9e3779b97f4a7c15
}

func splitmix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// fill writes the content of key at [off, off+len(dst)) into dst.
func fill(seed uint64, key string, off int64, dst []byte) {
	h := keyHash(seed, key)
	var w [8]byte
	for i := 0; i < len(dst); {
		pos := off + int64(i)
		word := uint64(pos) / 8
		binary.LittleEndian.PutUint64(w[:], splitmix(h^word*0xd1b54a32d192ed03))
		n := copy(dst[i:], w[pos%8:])
		i += n
	}
}

// firstDiff returns the index of the first byte of got that differs from
// key's content at off, or -1 when every byte matches.
func firstDiff(seed uint64, key string, off int64, got []byte) int {
	want := make([]byte, min(len(got), 1<<20))
	for done := 0; done < len(got); {
		n := min(len(want), len(got)-done)
		fill(seed, key, off+int64(done), want[:n])
		for i := 0; i < n; i++ {
			if got[done+i] != want[i] {
				return done + i
			}
		}
		done += n
	}
	return -1
}

// sizeOf is the size a file named key is written with, in [lo, hi].
func sizeOf(seed uint64, key string, lo, hi int64) int64 {
	return lo + int64(splitmix(keyHash(seed, key)^0x5151)%uint64(hi-lo+1))
}

// diffDetail describes a mismatch at index i of got (read at off): the
// bytes read and expected there, and how much of the read is zero, which
// tells a hole or an unwritten block from bytes of another file.
func diffDetail(seed uint64, key string, off int64, got []byte, i int) string {
	end := min(len(got), i+8)
	want := make([]byte, end-i)
	fill(seed, key, off+int64(i), want)
	zeros, bad := 0, 0
	exp := make([]byte, len(got))
	fill(seed, key, off, exp)
	for j, c := range got {
		if c == 0 {
			zeros++
		}
		if c != exp[j] {
			bad++
		}
	}
	return fmt.Sprintf("got %x want %x; %d of %d bytes differ, %d are zero", got[i:end], want, bad, len(got), zeros)
}
