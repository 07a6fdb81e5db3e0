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
//   - kv_inner:    for each layer, the pages of the range, each token's heads
//     with K and V side by side: [layer][page][token][head][k|v][dim] — what
//     the newest vLLM explicit-offloading branch writes (per-layer cache
//     tensors whose blocks hold K and V per head, copied block by block)
//
// The paged side is what vLLM-style engines hold: per layer, one K and one V
// array of fixed-size pages ([page][token][head][dim]), and a block table
// naming the pages of a sequence. Gather copies from pages to bytes, Scatter
// back; both are plain copies of whole per-layer pages, at memmove speed.
package kvlayout

import (
	"fmt"

	"github.com/gd2fs/gd2fs/errs"
	"github.com/gd2fs/gd2fs/internal/dtype"
	"github.com/gd2fs/gd2fs/internal/limits"
)

// Order is a byte layout.
type Order int

// Layouts.
const (
	LayerFirst Order = iota
	PageFirst
	KVFirst
	KVInner
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
	case "kv_inner":
		return KVInner, nil
	}
	return 0, fmt.Errorf("kvlayout: unknown layout %q (layer_first, page_first, kv_first or kv_inner)", s)
}

// Layout describes how a model's KV is laid out in bytes. It is the one
// layout type of gd2fs: the master stores it, the HTTP API carries it as
// JSON, and RankDesc gives the paged shape one tensor-parallel rank holds,
// which Gather and Scatter move.
type Layout struct {
	Model      string `json:"model"`
	Layers     int    `json:"layers"`
	KVHeads    int    `json:"kv_heads"`
	HeadDim    int    `json:"head_dim"`
	DType      string `json:"dtype"` // fp32, fp16, bf16, fp8, int8
	PageTokens int    `json:"page_tokens"`
	Order      string `json:"layout"` // layer_first, page_first, kv_first or kv_inner
	// TPSize is the number of tensor-parallel ranks the engine shards the
	// KV heads over (default 1). A range then holds one region per rank,
	// back to back: rank r's at kv_start + r × kv_length/regions.
	TPSize int `json:"tp_size,omitempty"`
	// Replicated: every rank holds the same KV (MLA), stored once.
	Replicated bool `json:"replicated,omitempty"`
	// KVLayers is how many of the layers hold KV (hybrid models: only the
	// full-attention layers do; vLLM then gives block_ids per KV cache
	// group); 0 means all. Sizes, byte orders and the paged shape count
	// these layers only.
	KVLayers int `json:"kv_layers,omitempty"`
}

// StoredLayers is the number of layers whose KV is stored: KVLayers, or
// Layers when that is 0.
func (l Layout) StoredLayers() int {
	if l.KVLayers > 0 {
		return l.KVLayers
	}
	return l.Layers
}

// DTypeSize is the size in bytes of one element of dtype, or 0 if unknown.
func DTypeSize(name string) int { return dtype.Size(name) }

// Validate checks a layout's fields.
func (l Layout) Validate() error {
	switch {
	case l.Model == "":
		return errs.New(errs.ErrBadRequest, "layout needs a model name")
	case l.Layers < 1 || l.KVHeads < 1 || l.HeadDim < 1 || l.PageTokens < 1:
		return errs.New(errs.ErrBadRequest, "layout of %s: layers, kv_heads, head_dim and page_tokens must be positive", l.Model)
	case DTypeSize(l.DType) == 0:
		return errs.New(errs.ErrBadRequest, "layout of %s: unknown dtype %q (fp32, fp16, bf16, fp8, int8)", l.Model, l.DType)
	case l.Order != "layer_first" && l.Order != "page_first" && l.Order != "kv_first" && l.Order != "kv_inner":
		return errs.New(errs.ErrBadRequest, "layout of %s: layout must be layer_first, page_first, kv_first or kv_inner, not %q", l.Model, l.Order)
	case l.KVLayers < 0 || l.KVLayers > l.Layers:
		return errs.New(errs.ErrBadRequest, "layout of %s: kv_layers (layers holding KV) must be 1 to layers (%d), or 0 for all, not %d", l.Model, l.Layers, l.KVLayers)
	case l.TPSize < 0 || l.TPSize > 1024:
		return errs.New(errs.ErrBadRequest, "layout of %s: tp_size must be 1 to 1024, not %d", l.Model, l.TPSize)
	case l.Layers > 1<<16 || l.KVHeads > 1<<16 || l.HeadDim > 1<<16 || l.PageTokens > 1<<20:
		return errs.New(errs.ErrBadRequest, "layout of %s: layers, kv_heads and head_dim are at most 65536, page_tokens at most 2^20", l.Model)
	case l.RankHeads() == 0:
		return errs.New(errs.ErrBadRequest, "layout of %s: %d KV heads cannot be split over %d ranks (one must divide the other)", l.Model, l.KVHeads, l.TPSize)
	case l.PageBytes() > 1<<30:
		return errs.New(errs.ErrBadRequest, "layout of %s: a page of %d bytes is too large", l.Model, l.PageBytes())
	}
	return l.checkLimits()
}

// checkLimits bounds each field and computes the page size with checked
// multiplication, so no field combination wraps into a small or negative size.
func (l Layout) checkLimits() error {
	switch {
	case l.Layers > limits.MaxLayers, l.KVHeads > limits.MaxKVHeads, l.HeadDim > limits.MaxHeadDim, l.PageTokens > limits.MaxPageTokens:
		return errs.New(errs.ErrBadRequest, "layout of %s: layers at most %d, kv_heads at most %d, head_dim at most %d, page_tokens at most %d",
			l.Model, limits.MaxLayers, limits.MaxKVHeads, limits.MaxHeadDim, limits.MaxPageTokens)
	}
	// Heads as stored: every rank's region (tp_size of them when heads are
	// replicated over more ranks than there are heads).
	heads := int64(l.Regions()) * int64(l.RankHeads())
	if n, ok := limits.MulAll(2, int64(l.StoredLayers()), heads, int64(l.HeadDim), int64(DTypeSize(l.DType)), int64(l.PageTokens)); !ok || n > limits.MaxPageBytes {
		return errs.New(errs.ErrBadRequest, "layout of %s: a page of %d tokens is larger than %d bytes", l.Model, l.PageTokens, limits.MaxPageBytes)
	}
	return nil
}

// Regions is how many per-rank regions a range holds: the TP size, or 1
// when the KV is replicated on every rank.
func (l Layout) Regions() int {
	if l.Replicated || l.TPSize < 2 {
		return 1
	}
	return l.TPSize
}

// RankHeads is the KV heads one rank holds: kv_heads/tp_size, or 1 when
// there are fewer heads than ranks (engines then replicate heads), or 0
// when neither divides the other.
func (l Layout) RankHeads() int {
	tp := max(l.TPSize, 1)
	switch {
	case l.Replicated || tp == 1:
		return l.KVHeads
	case l.KVHeads%tp == 0:
		return l.KVHeads / tp
	case tp%l.KVHeads == 0:
		return 1
	}
	return 0
}

// RankTokenBytes is the KV size of one token on one rank: K and V, every
// layer, the rank's heads.
func (l Layout) RankTokenBytes() int64 {
	return 2 * int64(l.StoredLayers()) * int64(l.RankHeads()) * int64(l.HeadDim) * int64(DTypeSize(l.DType))
}

// TokenBytes is the KV size of one token as stored: every rank's region.
func (l Layout) TokenBytes() int64 { return int64(l.Regions()) * l.RankTokenBytes() }

// PageBytes is the size of one page of PageTokens tokens.
func (l Layout) PageBytes() int64 { return int64(l.PageTokens) * l.TokenBytes() }

// RangeBytes is the size of a range of tokens: whole pages, the last one
// padded. Pages are counted from the start of the range.
func (l Layout) RangeBytes(tokens int64) int64 {
	pages := (tokens + int64(l.PageTokens) - 1) / int64(l.PageTokens)
	return pages * l.PageBytes()
}

// RankDesc is the paged KV shape one tensor-parallel rank holds: the
// rank's heads, in the layout's byte order.
func (l Layout) RankDesc() (Desc, error) {
	if err := l.Validate(); err != nil {
		return Desc{}, err
	}
	o, err := ParseOrder(l.Order)
	if err != nil {
		return Desc{}, err
	}
	return Desc{Layers: l.StoredLayers(), KVHeads: l.RankHeads(), HeadDim: l.HeadDim, DTypeSize: DTypeSize(l.DType), PageTokens: l.PageTokens, Order: o}, nil
}

// Desc is the paged KV shape one rank holds (Layout.RankDesc).
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
// PageBytes, in d.Order). Gather and Scatter have no caller in gd2fs
// itself (engines move pages in their own tensors): they stay as the public
// Go form of a Desc's byte order, for Go callers, and as the reference the
// session property tests (internal/meta) check layouts against.
func Gather(d Desc, p Paged, table []int, dst []byte) error {
	if err := d.check(p, table, len(dst)); err != nil {
		return err
	}
	if d.Order == KVInner {
		d.interleave(p, table, dst, true)
		return nil
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
	if d.Order == KVInner {
		d.interleave(p, table, src, false)
		return nil
	}
	d.each(p, table, func(o int, unit []byte) { copy(unit, src[o:o+len(unit)]) })
	return nil
}

// interleave moves kv_inner bytes: for each layer, page, token and head,
// the head's K vector then its V vector. The contiguous side is walked in
// order; the copies are one head vector each (head_dim elements), not whole
// pages, since K and V alternate at that grain.
func (d Desc) interleave(p Paged, table []int, flat []byte, gather bool) {
	vec := d.HeadDim * d.DTypeSize
	u := d.UnitBytes()
	o := 0
	for l := 0; l < d.Layers; l++ {
		for _, pg := range table {
			k := p.K[l][pg*u : (pg+1)*u]
			v := p.V[l][pg*u : (pg+1)*u]
			for x := 0; x < u; x += vec { // each (token, head) of the page
				if gather {
					copy(flat[o:o+vec], k[x:x+vec])
					copy(flat[o+vec:o+2*vec], v[x:x+vec])
				} else {
					copy(k[x:x+vec], flat[o:o+vec])
					copy(v[x:x+vec], flat[o+vec:o+2*vec])
				}
				o += 2 * vec
			}
		}
	}
}
