package kvlayout

import (
	"bytes"
	"math/rand/v2"
	"testing"
)

// TestKVInnerIsWhatTheEngineWrites: the newest vLLM explicit-offloading
// branch keeps, per layer, one cache tensor of blocks laid out
// [block][token][head][k|v][dim] and writes a segment as, for each layer in
// turn, its blocks' bytes in block-table order. The bytes it writes must be
// exactly Gather's kv_inner bytes of the same KV held as separate K and V
// pages, sizes agree with the layout, and Scatter puts them back (issue 28).
func TestKVInnerIsWhatTheEngineWrites(t *testing.T) {
	const layers, heads, dim, ds, pt, blocks = 3, 2, 4, 2, 16, 8
	vec := dim * ds
	engine := make([][]byte, layers) // per layer: blocks × [token][head][k|v][dim]
	r := rand.New(rand.NewPCG(5, 5))
	for l := range engine {
		engine[l] = make([]byte, blocks*pt*heads*2*vec)
		for i := range engine[l] {
			engine[l][i] = byte(r.Uint32())
		}
	}
	// The same KV as gd2fs's paged K and V arrays ([page][token][head][dim]).
	d := Desc{Layers: layers, KVHeads: heads, HeadDim: dim, DTypeSize: ds, PageTokens: pt, Order: KVInner}
	p := NewPaged(d, blocks)
	for l := 0; l < layers; l++ {
		for x := 0; x < blocks*pt*heads; x++ { // each (block, token, head)
			copy(p.K[l][x*vec:(x+1)*vec], engine[l][(2*x)*vec:(2*x+1)*vec])
			copy(p.V[l][x*vec:(x+1)*vec], engine[l][(2*x+1)*vec:(2*x+2)*vec])
		}
	}
	table := []int{5, 0, 6}
	block := pt * heads * 2 * vec
	var wrote []byte // what the engine writes: layer by layer, block by block
	for l := 0; l < layers; l++ {
		for _, b := range table {
			wrote = append(wrote, engine[l][b*block:(b+1)*block]...)
		}
	}
	l := Layout{Model: "m", Layers: layers, KVHeads: heads, HeadDim: dim, DType: "fp16", PageTokens: pt, Order: "kv_inner"}
	if err := l.Validate(); err != nil {
		t.Fatal(err)
	}
	if got := l.RangeBytes(int64(len(table) * pt)); got != int64(len(wrote)) {
		t.Fatalf("layout sizes %d tokens as %d bytes, the engine wrote %d", len(table)*pt, got, len(wrote))
	}
	rd, err := l.RankDesc()
	if err != nil || rd != d {
		t.Fatalf("RankDesc %+v %v, want %+v", rd, err, d)
	}
	buf := make([]byte, len(wrote))
	if err := Gather(d, p, table, buf); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(buf, wrote) {
		t.Fatal("kv_inner bytes differ from what the engine writes")
	}
	back := NewPaged(d, 10)
	other := []int{9, 2, 4}
	if err := Scatter(d, wrote, back, other); err != nil {
		t.Fatal(err)
	}
	u := d.UnitBytes()
	for ly := 0; ly < layers; ly++ {
		for i := range table {
			a, b := table[i], other[i]
			if !bytes.Equal(p.K[ly][a*u:(a+1)*u], back.K[ly][b*u:(b+1)*u]) || !bytes.Equal(p.V[ly][a*u:(a+1)*u], back.V[ly][b*u:(b+1)*u]) {
				t.Fatalf("layer %d page %d did not round-trip", ly, a)
			}
		}
	}
	if _, err := ParseOrder("kv_inner"); err != nil {
		t.Fatal(err)
	}
	if err := Gather(d, p, table, buf[:len(buf)-1]); err == nil {
		t.Fatal("a short buffer was accepted")
	}
}

// TestKVLayers: a hybrid model's layout sizes ranges by the layers that
// hold KV (kv_layers), not by all its layers.
func TestKVLayers(t *testing.T) {
	l := Layout{Model: "hybrid", Layers: 8, KVLayers: 2, KVHeads: 4, HeadDim: 16, DType: "bf16", PageTokens: 16, Order: "kv_first", TPSize: 2}
	if err := l.Validate(); err != nil {
		t.Fatal(err)
	}
	if got, want := l.RankTokenBytes(), int64(2*2*2*16*2); got != want {
		t.Fatalf("rank token bytes %d, want %d (2 KV layers, 2 heads per rank)", got, want)
	}
	if d, _ := l.RankDesc(); d.Layers != 2 {
		t.Fatalf("paged shape has %d layers, want 2", d.Layers)
	}
	l.KVLayers = 0
	if l.StoredLayers() != 8 {
		t.Fatal("kv_layers 0 must mean every layer")
	}
	for _, bad := range []int{-1, 9} {
		l.KVLayers = bad
		if err := l.Validate(); err == nil {
			t.Fatalf("kv_layers %d accepted", bad)
		}
	}
}
