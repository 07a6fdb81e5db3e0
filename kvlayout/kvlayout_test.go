package kvlayout

import (
	"bytes"
	"math/rand/v2"
	"testing"
)

func fill(p Paged, seed uint64) {
	r := rand.New(rand.NewPCG(seed, 1))
	for l := range p.K {
		for _, side := range [][]byte{p.K[l], p.V[l]} {
			for i := range side {
				side[i] = byte(r.Uint32())
			}
		}
	}
}

// TestGatherScatterRoundTrip: for every layout, several page sizes and any
// subset of pages in any order, scatter(gather(x)) restores x's pages, and
// the contiguous bytes sit exactly where the layout says.
func TestGatherScatterRoundTrip(t *testing.T) {
	for _, order := range []Order{LayerFirst, PageFirst, KVFirst} { // kv_inner: kvinner_test.go
		for _, pt := range []int{1, 16, 64} {
			d := Desc{Layers: 3, KVHeads: 2, HeadDim: 4, DTypeSize: 2, PageTokens: pt, Order: order}
			src := NewPaged(d, 10)
			fill(src, uint64(pt))
			table := []int{7, 2, 9, 0}
			buf := make([]byte, len(table)*d.PageBytes())
			if err := Gather(d, src, table, buf); err != nil {
				t.Fatal(err)
			}
			u := d.UnitBytes()
			// Spot-check the layout: page index 1 of the table (page 2),
			// layer 2, V.
			var o int
			switch order {
			case LayerFirst:
				o = ((2*2+1)*len(table) + 1) * u
			case KVFirst: // after all 3 layers of K and 2 layers of V
				o = ((1*3+2)*len(table) + 1) * u
			default:
				o = ((1*3+2)*2 + 1) * u
			}
			if !bytes.Equal(buf[o:o+u], src.V[2][2*u:3*u]) {
				t.Fatalf("order %v page %d: unit not where the layout puts it", order, pt)
			}
			dst := NewPaged(d, 12)
			other := []int{11, 3, 5, 1}
			if err := Scatter(d, buf, dst, other); err != nil {
				t.Fatal(err)
			}
			for l := 0; l < d.Layers; l++ {
				for i := range table {
					a, b := table[i], other[i]
					if !bytes.Equal(src.K[l][a*u:(a+1)*u], dst.K[l][b*u:(b+1)*u]) || !bytes.Equal(src.V[l][a*u:(a+1)*u], dst.V[l][b*u:(b+1)*u]) {
						t.Fatalf("order %v page %d: layer %d page %d did not round-trip", order, pt, l, a)
					}
				}
			}
		}
	}
}

func TestErrors(t *testing.T) {
	d := Desc{Layers: 2, KVHeads: 1, HeadDim: 8, DTypeSize: 2, PageTokens: 4}
	p := NewPaged(d, 4)
	if err := Gather(d, p, []int{4}, make([]byte, d.PageBytes())); err == nil {
		t.Error("page beyond the buffer accepted")
	}
	if err := Gather(d, p, []int{1}, make([]byte, d.PageBytes()-1)); err == nil {
		t.Error("short destination accepted")
	}
	if err := Scatter(d, make([]byte, d.PageBytes()), Paged{K: p.K[:1], V: p.V}, []int{0}); err == nil {
		t.Error("missing layer accepted")
	}
	if _, err := ParseOrder("row_major"); err == nil {
		t.Error("unknown layout accepted")
	}
}

// BenchmarkGather compares gather and scatter with a plain copy of the same
// bytes (the memmove reference), for both layouts and 16/64-token pages of a
// Llama-3-8B-like shape (32 layers, 8 KV heads, head dim 128, bf16), 32
// pages scattered over a 256-page buffer.
func BenchmarkGather(b *testing.B) {
	for _, pt := range []int{16, 64} {
		for _, order := range []Order{LayerFirst, PageFirst, KVFirst} { // kv_inner: kvinner_test.go
			d := Desc{Layers: 32, KVHeads: 8, HeadDim: 128, DTypeSize: 2, PageTokens: pt, Order: order}
			pages := 256
			if pt == 64 {
				pages = 64
			}
			p := NewPaged(d, pages)
			fill(p, 3)
			r := rand.New(rand.NewPCG(1, 2))
			table := r.Perm(pages)[:pages/8]
			buf := make([]byte, len(table)*d.PageBytes())
			for i := range buf {
				buf[i] = byte(i)
			}
			name := map[Order]string{LayerFirst: "layer_first", PageFirst: "page_first", KVFirst: "kv_first"}[order]
			b.Run(name+"/page"+itoa(pt)+"/gather", func(b *testing.B) {
				b.SetBytes(int64(len(buf)))
				for i := 0; i < b.N; i++ {
					Gather(d, p, table, buf)
				}
			})
			b.Run(name+"/page"+itoa(pt)+"/scatter", func(b *testing.B) {
				b.SetBytes(int64(len(buf)))
				for i := 0; i < b.N; i++ {
					Scatter(d, buf, p, table)
				}
			})
			b.Run(name+"/page"+itoa(pt)+"/memmove", func(b *testing.B) {
				// Written first: an untouched slice reads the kernel's shared
				// zero page, from cache, and would flatter memmove.
				src := make([]byte, len(buf))
				for i := range src {
					src[i] = byte(i)
				}
				b.SetBytes(int64(len(buf)))
				for i := 0; i < b.N; i++ {
					copy(buf, src)
				}
			})
		}
	}
}

func itoa(n int) string {
	if n == 16 {
		return "16"
	}
	return "64"
}

// TestRankDesc: a layout's per-rank shape holds the rank's heads, and its
// pages make up the layout's bytes over all regions.
func TestRankDesc(t *testing.T) {
	l := Layout{Model: "m", Layers: 4, KVHeads: 8, HeadDim: 16, DType: "bf16", PageTokens: 16, Order: "kv_first", TPSize: 2}
	d, err := l.RankDesc()
	if err != nil {
		t.Fatal(err)
	}
	if d.KVHeads != 4 || d.Order != KVFirst || d.DTypeSize != 2 {
		t.Fatalf("rank shape %+v", d)
	}
	if int64(d.PageBytes()*l.Regions()) != l.PageBytes() {
		t.Fatalf("a rank page of %d bytes x %d regions != a layout page of %d", d.PageBytes(), l.Regions(), l.PageBytes())
	}
	l.DType = "bf17"
	if _, err := l.RankDesc(); err == nil {
		t.Fatal("unknown dtype accepted")
	}
}
