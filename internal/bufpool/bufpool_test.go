package bufpool

import (
	"sync"
	"testing"
)

// drain empties every free list, so a test starts from a pool holding nothing.
func drain(t *testing.T) {
	t.Helper()
	for s := minShift; s <= maxShift; s++ {
		for {
			select {
			case b := <-free[s]:
				held.Add(-int64(cap(*b)))
				continue
			default:
			}
			break
		}
	}
	if h := Held(); h != 0 {
		t.Fatalf("an empty pool holds %d bytes", h)
	}
}

func TestSizes(t *testing.T) {
	drain(t)
	for _, n := range []int{0, 1, 4095, 4096, 4097, 64 << 10, 1<<20 + 1, 256 << 20} {
		b := Get(n)
		if len(*b) != n {
			t.Fatalf("Get(%d): length %d", n, len(*b))
		}
		if c := cap(*b); c < n || c&(c-1) != 0 || c < 1<<minShift {
			t.Fatalf("Get(%d): capacity %d, want the power of two ≥ max(n, 4 KiB)", n, c)
		}
		Put(b)
	}
	// Past the largest class: a plain allocation, never kept.
	b := Get(256<<20 + 1)
	if len(*b) != 256<<20+1 {
		t.Fatalf("oversize Get: length %d", len(*b))
	}
	before := Held()
	Put(b)
	if Held() != before {
		t.Fatal("the pool kept a buffer past its largest class")
	}
	// A buffer whose capacity is not a class (not from Get) is not kept.
	odd := make([]byte, 5000)
	Put(&odd)
	if Held() != before {
		t.Fatal("the pool kept a buffer of a capacity it does not hand out")
	}
	drain(t)
}

func TestReuseAndHeld(t *testing.T) {
	drain(t)
	a := Get(100 << 10) // 128 KiB class
	(*a)[0] = 42
	Put(a)
	if h := Held(); h != 128<<10 {
		t.Fatalf("after one Put of a 128 KiB buffer the pool holds %d bytes", h)
	}
	b := Get(128 << 10)
	if &(*b)[:1][0] != &(*a)[:1][0] {
		t.Fatal("Get did not reuse the free buffer of its class")
	}
	if len(*b) != 128<<10 {
		t.Fatalf("reused buffer has length %d", len(*b))
	}
	if h := Held(); h != 0 {
		t.Fatalf("after taking it back the pool holds %d bytes", h)
	}
	Put(b)
	drain(t)
}

// TestBounded: each class keeps a bounded number of buffers; what is past
// the bound goes to the GC and is not counted.
func TestBounded(t *testing.T) {
	drain(t)
	const s = 22 // 4 MiB class: keeps keepBytes>>22 = 64 buffers
	kept := cap(free[s])
	bufs := make([]*[]byte, kept+10)
	for i := range bufs {
		bufs[i] = Get(1 << s)
	}
	for _, b := range bufs {
		Put(b)
	}
	if h := Held(); h != int64(kept)<<s {
		t.Fatalf("the 4 MiB class holds %d bytes, want %d (%d buffers)", h, int64(kept)<<s, kept)
	}
	drain(t)
}

func TestConcurrentHeld(t *testing.T) {
	drain(t)
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 500; i++ {
				b := Get(4096 << (i % 6))
				(*b)[len(*b)-1] = byte(i)
				Put(b)
			}
		}()
	}
	wg.Wait()
	var want int64
	for s := minShift; s <= maxShift; s++ {
		want += int64(len(free[s])) << s
	}
	if h := Held(); h != want {
		t.Fatalf("Held %d bytes, but the free lists hold %d", h, want)
	}
	drain(t)
}

// TestBuffers: a buffer comes back empty, and one grown past the bound is
// not kept.
func TestBuffers(t *testing.T) {
	p := NewBuffers(64)
	b := p.Get()
	b.WriteString("left from the last use")
	p.Put(b)
	if got := p.Get(); got.Len() != 0 {
		t.Fatalf("Get returned %d bytes of an earlier use", got.Len())
	}
	big := p.Get()
	big.Grow(1 << 10)
	p.Put(big)
	for range 8 {
		if got := p.Get(); got == big {
			t.Fatal("a buffer past the bound was kept")
		}
	}
}
