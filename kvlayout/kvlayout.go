// Package kvlayout moves KV cache between an engine's paged GPU-style memory
// and the contiguous bytes gd2fs stores, in the two layouts of the source
// design (DESIGN.md §6, R4):
//
//   - layer_first: for each layer, K then V, each the pages of the range in
//     block-table order: [layer][k|v][page][token][head][dim]
//   - page_first:  for each page in block-table order, every layer's K and V:
//     [page][layer][k|v][token][head][dim]
//   - kv_first:    every layer's K pages, then every layer's V pages:
//     [k|v][layer][page][token][head][dim] — what an engine holding per-layer
//     K and V tensors writes when it copies each layer's run of blocks in
//     turn, K tensors first (vLLM's explicit-offloading connector)
//
// The paged side is what vLLM-style engines hold: per layer, one K and one V
// array of fixed-size pages ([page][token][head][dim]), and a block table
// naming the pages of a sequence. Gather copies from pages to bytes, Scatter
// back; both are plain copies of whole per-layer pages, at memmove speed.
package kvlayout

import (
	"fmt"
)

// Order is a byte layout.
type Order int

// Layouts.
const (
	LayerFirst Order = iota
	PageFirst
	KVFirst
)

// ParseOrder reads "layer_first", "page_first" or "kv_first".
func ParseOrder(s string) (Order, error) {
	switch s {
	case "layer_first":
		return LayerFirst, nil
	case "page_first":
		return PageFirst, nil
	case "kv_first":
		return KVFirst, nil
	}
	return 0, fmt.Errorf("kvlayout: unknown layout %q (layer_first, page_first or kv_first)", s)
}

// Desc describes a model's KV shape.
type Desc struct {
	Layers     int
	KVHeads    int
	HeadDim    int
	DTypeSize  int // bytes per element
	PageTokens int
	Order      Order
}

// UnitBytes is one page of one layer of K (or V).
func (d Desc) UnitBytes() int { return d.PageTokens * d.KVHeads * d.HeadDim * d.DTypeSize }

// PageBytes is one page of every layer, K and V.
func (d Desc) PageBytes() int { return 2 * d.Layers * d.UnitBytes() }

// Paged is an engine's paged KV memory: K[layer] and V[layer] each hold the
// same number of pages of UnitBytes.
type Paged struct {
	K, V [][]byte
}

// NewPaged allocates a paged buffer of pages pages.
func NewPaged(d Desc, pages int) Paged {
	p := Paged{K: make([][]byte, d.Layers), V: make([][]byte, d.Layers)}
	for l := range p.K {
		p.K[l] = make([]byte, pages*d.UnitBytes())
		p.V[l] = make([]byte, pages*d.UnitBytes())
	}
	return p
}

func (d Desc) check(p Paged, table []int, n int) error {
	if d.Layers < 1 || d.UnitBytes() < 1 {
		return fmt.Errorf("kvlayout: empty layout %+v", d)
	}
	if len(p.K) != d.Layers || len(p.V) != d.Layers {
		return fmt.Errorf("kvlayout: paged buffer has %d K and %d V layers, layout has %d", len(p.K), len(p.V), d.Layers)
	}
	u := d.UnitBytes()
	pages := len(p.K[0]) / u
	for l := 0; l < d.Layers; l++ {
		if len(p.K[l]) != pages*u || len(p.V[l]) != pages*u {
			return fmt.Errorf("kvlayout: layer %d: K and V must both hold %d whole pages of %d bytes", l, pages, u)
		}
	}
	for i, pg := range table {
		if pg < 0 || pg >= pages {
			return fmt.Errorf("kvlayout: block table entry %d is page %d; the buffer has %d pages", i, pg, pages)
		}
	}
	if want := len(table) * d.PageBytes(); n != want {
		return fmt.Errorf("kvlayout: %d pages take %d bytes, the contiguous side has %d", len(table), want, n)
	}
	return nil
}

// offset is where unit (page i of the table, layer l, kv 0=K 1=V) sits in
// the contiguous bytes of n pages.
func (d Desc) offset(i, l, kv, n int) int {
	u := d.UnitBytes()
	switch d.Order {
	case LayerFirst:
		return ((l*2+kv)*n + i) * u
	case KVFirst:
		return ((kv*d.Layers+l)*n + i) * u
	}
	return ((i*d.Layers+l)*2 + kv) * u
}

// each calls fn for every unit in the order of the contiguous side, so
// that side is read or written sequentially: dst/src offset o, and the
// paged unit (one layer's K or V of one page).
func (d Desc) each(p Paged, table []int, fn func(o int, unit []byte)) {
	u, n := d.UnitBytes(), len(table)
	unit := func(l, kv, pg int) []byte {
		side := p.K[l]
		if kv == 1 {
			side = p.V[l]
		}
		return side[pg*u : (pg+1)*u]
	}
	switch d.Order {
	case LayerFirst:
		for l := 0; l < d.Layers; l++ {
			for kv := 0; kv < 2; kv++ {
				for i, pg := range table {
					fn(d.offset(i, l, kv, n), unit(l, kv, pg))
				}
			}
		}
		return
	case KVFirst:
		for kv := 0; kv < 2; kv++ {
			for l := 0; l < d.Layers; l++ {
				for i, pg := range table {
					fn(d.offset(i, l, kv, n), unit(l, kv, pg))
				}
			}
		}
		return
	}
	for i, pg := range table {
		for l := 0; l < d.Layers; l++ {
			for kv := 0; kv < 2; kv++ {
				fn(d.offset(i, l, kv, n), unit(l, kv, pg))
			}
		}
	}
}

// Gather copies the pages named by table from p into dst (len(table) pages of
// PageBytes, in d.Order).
func Gather(d Desc, p Paged, table []int, dst []byte) error {
	if err := d.check(p, table, len(dst)); err != nil {
		return err
	}
	d.each(p, table, func(o int, unit []byte) { copy(dst[o:o+len(unit)], unit) })
	return nil
}

// Scatter copies src (len(table) pages in d.Order) into the pages of p named
// by table.
func Scatter(d Desc, src []byte, p Paged, table []int) error {
	if err := d.check(p, table, len(src)); err != nil {
		return err
	}
	d.each(p, table, func(o int, unit []byte) { copy(unit, src[o:o+len(unit)]) })
	return nil
}
