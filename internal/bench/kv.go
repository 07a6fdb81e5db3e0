package bench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sort"
	"sync"
	"sync/atomic"
	"time"
)

// KVTarget is a KV store under test: gd2fs or the Redis reference.
type KVTarget interface {
	Set(ctx context.Context, key string, v []byte) error
	Get(ctx context.Context, key string, dst []byte) (int, error)
	MGet(ctx context.Context, keys []string, dsts [][]byte) error
	Clear(ctx context.Context) error
}

// KVResult is one measured case.
type KVResult struct {
	BytesPerSec float64
	Bytes       int64 // value bytes moved
	P50, P99    time.Duration
	Ops         int
}

// KVCase describes one workload.
type KVCase struct {
	Op          string // "set", "get", "mget"
	ValueSize   int
	Concurrency int
	Keys        int // distinct keys in the data set
	Batch       int // keys per mget
}

// RunKV runs c against t: "set" writes Keys distinct keys, "get" and "mget"
// read them back at random (after a set phase, which they need).
func RunKV(ctx context.Context, t KVTarget, c KVCase, prefix string) (KVResult, error) {
	value := make([]byte, c.ValueSize)
	for i := range value {
		value[i] = byte(i*131 + 7)
	}
	key := func(i int) string { return fmt.Sprintf("%s/%d/%d", prefix, c.ValueSize, i) }
	ops := c.Keys
	if c.Op == "mget" {
		ops = max(4, c.Keys/c.Batch)
	}
	var next atomic.Int64
	lat := make([]time.Duration, ops)
	var wg sync.WaitGroup
	errc := make(chan error, c.Concurrency)
	start := time.Now()
	for w := 0; w < c.Concurrency; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), 99))
			dst := make([]byte, c.ValueSize)
			var keys []string
			var dsts [][]byte
			if c.Op == "mget" {
				keys = make([]string, c.Batch)
				dsts = make([][]byte, c.Batch)
				for i := range dsts {
					dsts[i] = make([]byte, c.ValueSize)
				}
			}
			for {
				i := int(next.Add(1) - 1)
				if i >= ops {
					return
				}
				t0 := time.Now()
				var err error
				switch c.Op {
				case "set":
					err = t.Set(ctx, key(i), value)
				case "get":
					var n int
					n, err = t.Get(ctx, key(r.IntN(c.Keys)), dst)
					if err == nil && n != c.ValueSize {
						err = fmt.Errorf("get returned %d bytes, want %d", n, c.ValueSize)
					}
				case "mget":
					for k := range keys {
						keys[k] = key(r.IntN(c.Keys))
					}
					err = t.MGet(ctx, keys, dsts)
				}
				lat[i] = time.Since(t0)
				if err != nil {
					errc <- err
					return
				}
			}
		}(w)
	}
	wg.Wait()
	el := time.Since(start)
	select {
	case err := <-errc:
		return KVResult{}, err
	default:
	}
	per := int64(c.ValueSize)
	if c.Op == "mget" {
		per *= int64(c.Batch)
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	return KVResult{BytesPerSec: float64(per*int64(ops)) / el.Seconds(), Bytes: per * int64(ops), P50: lat[len(lat)/2], P99: lat[len(lat)*99/100], Ops: ops}, nil
}
