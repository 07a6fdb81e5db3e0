// Package crc32c is the CRC32C (Castagnoli) math of gd2fs, a leaf every
// layer shares: checksums over several buffers, and combination: crc(A‖B)
// from crc(A), crc(B) and len(B), without touching the bytes (multiplication
// by a power of x modulo the polynomial). The data servers keep a CRC per 64 KiB
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

// The CRC state is a polynomial over GF(2) of degree < 32, stored
// reflected: bit 31 is x^0, bit 0 is x^31 (the order the table-driven CRC
// keeps it in). Appending n zero bytes multiplies the state by x^(8n) mod P,
// so combining costs one multiplication by a power of x, built from the
// powers x^(8·2^k) mod P kept in x8pow: popcount(len2)+1 multiplications of at
// most 32 steps each (a 32×32 bit-matrix squaring per bit of len2 before,
// 30–40× slower for a 52 KiB piece: 7 % of a data server's CPU in chat turns).

// poly is CRC32C's (Castagnoli's) polynomial, reflected, without x^32.
const poly = 0x82f63b78

// x8pow[k] is x^(8·2^k) mod P.
var x8pow = func() (t [64]uint32) {
	t[0] = 1 << (31 - 8) // x^8
	for k := 1; k < len(t); k++ {
		t[k] = mulMod(t[k-1], t[k-1])
	}
	return t
}()

// mulMod returns a·b mod P.
func mulMod(a, b uint32) uint32 {
	var p uint32
	// For each term x^i of a, from x^0 up, add b·x^i: b is multiplied by x
	// (one step right, reduced by P when x^31 moves past) after each term.
	for m := uint32(1) << 31; m != 0; m >>= 1 {
		if a&m != 0 {
			if p ^= b; a&(m-1) == 0 {
				break // no higher term left
			}
		}
		if b&1 != 0 {
			b = b>>1 ^ poly
		} else {
			b >>= 1
		}
	}
	return p
}

// xPow8 returns x^(8n) mod P (x^0 for n ≤ 0).
func xPow8(n int64) uint32 {
	r := uint32(1) << 31 // x^0
	if n <= 0 {
		return r
	}
	for k := 0; n != 0; k, n = k+1, n>>1 {
		if n&1 != 0 {
			r = mulMod(x8pow[k], r)
		}
	}
	return r
}

// Combine returns the CRC32C of A‖B given crc1 = CRC32C(A), crc2 = CRC32C(B)
// and len2 = len(B). It costs popcount(len2)+1 multiplications of at most
// 32 steps; for a length used often, build a Shift once.
func Combine(crc1, crc2 uint32, len2 int64) uint32 {
	return shiftBy(crc1, len2) ^ crc2
}

// shiftBy appends len2 zero bytes' worth of CRC state to crc (the linear
// part of Combine).
func shiftBy(crc uint32, len2 int64) uint32 {
	if len2 <= 0 {
		return crc
	}
	return mulMod(xPow8(len2), crc)
}

// Shift combines CRCs with a fixed second length fast (one multiplication).
type Shift struct {
	n int64
	x uint32 // x^(8n) mod P
}

// NewShift prepares combination with blocks of n bytes.
func NewShift(n int64) *Shift {
	if n < 0 {
		n = 0
	}
	return &Shift{n: n, x: xPow8(n)}
}

// Combine is Combine(crc1, crc2, n) for the Shift's n.
func (s *Shift) Combine(crc1, crc2 uint32) uint32 { return mulMod(s.x, crc1) ^ crc2 }

// Len is the Shift's length.
func (s *Shift) Len() int64 { return s.n }
