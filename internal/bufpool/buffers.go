package bufpool

import (
	"bytes"
	"sync"
)

// Buffers pools bytes.Buffers for small, short-lived bytes: a JSON body
// read before a hand decoder runs, an answer encoded before it is copied.
// Unlike the payload classes above, a sync.Pool suits them: they are a few
// KiB, and one lost at a GC costs one small allocation. A buffer grown
// past the pool's bound (a rare large message) is left to the collector.
type Buffers struct {
	pool sync.Pool
	max  int
}

// NewBuffers pools buffers of up to max bytes of capacity.
func NewBuffers(max int) *Buffers {
	return &Buffers{pool: sync.Pool{New: func() any { return new(bytes.Buffer) }}, max: max}
}

// Get returns an empty buffer. Return it with Put when nothing refers to
// its bytes any more.
func (p *Buffers) Get() *bytes.Buffer {
	b := p.pool.Get().(*bytes.Buffer)
	b.Reset()
	return b
}

// Put returns b to the pool, unless it grew past the bound.
func (p *Buffers) Put(b *bytes.Buffer) {
	if b.Cap() <= p.max {
		p.pool.Put(b)
	}
}
