// Package crc32c is the CRC32C (Castagnoli) math of gd2fs, a leaf every
// layer shares: checksums over several buffers, and combination: crc(A‖B)
// from crc(A), crc(B) and len(B), without touching the bytes (the zlib
// crc32_combine method over GF(2)). The data servers keep a CRC per 64 KiB
// block and answer reads with the combination of the blocks' CRCs, so
// sending bytes costs no pass over them.
package crc32c

import "hash/crc32"

// Table is the CRC32C table (hardware accelerated on amd64 and arm64).
var Table = crc32.MakeTable(crc32.Castagnoli)

// Checksum is CRC32C over the concatenation of bufs.
func Checksum(bufs ...[]byte) uint32 {
	var c uint32
	for _, b := range bufs {
		c = crc32.Update(c, Table, b)
	}
	return c
}

// Update returns crc extended with the bytes of p.
func Update(crc uint32, p []byte) uint32 { return crc32.Update(crc, Table, p) }

type gf2 [32]uint32

func (m *gf2) times(v uint32) uint32 {
	var sum uint32
	for i := 0; v != 0; i, v = i+1, v>>1 {
		if v&1 != 0 {
			sum ^= m[i]
		}
	}
	return sum
}

func (m *gf2) square(of *gf2) {
	for n := range m {
		m[n] = of.times(of[n])
	}
}

// Combine returns the CRC32C of A‖B given crc1 = CRC32C(A), crc2 = CRC32C(B)
// and len2 = len(B). It costs about log2(len2) 32×32 bit-matrix squarings;
// for a length used often, build a Shift once.
func Combine(crc1, crc2 uint32, len2 int64) uint32 {
	return shiftBy(crc1, len2) ^ crc2
}

// shiftBy appends len2 zero bytes' worth of CRC state to crc (the linear
// part of Combine).
func shiftBy(crc uint32, len2 int64) uint32 {
	if len2 <= 0 {
		return crc
	}
	var even, odd gf2
	odd[0] = 0x82f63b78 // Castagnoli, reflected
	row := uint32(1)
	for n := 1; n < 32; n++ {
		odd[n] = row
		row <<= 1
	}
	even.square(&odd) // two zero bits
	odd.square(&even) // four zero bits
	for {
		even.square(&odd)
		if len2&1 != 0 {
			crc = even.times(crc)
		}
		if len2 >>= 1; len2 == 0 {
			break
		}
		odd.square(&even)
		if len2&1 != 0 {
			crc = odd.times(crc)
		}
		if len2 >>= 1; len2 == 0 {
			break
		}
	}
	return crc
}

// Shift combines CRCs with a fixed second length fast (32 steps).
type Shift struct {
	n int64
	m gf2
}

// NewShift prepares combination with blocks of n bytes.
func NewShift(n int64) *Shift {
	s := &Shift{n: n}
	for i := range s.m {
		s.m[i] = shiftBy(1<<i, n)
	}
	return s
}

// Combine is Combine(crc1, crc2, n) for the Shift's n.
func (s *Shift) Combine(crc1, crc2 uint32) uint32 { return s.m.times(crc1) ^ crc2 }

// Len is the Shift's length.
func (s *Shift) Len() int64 { return s.n }
