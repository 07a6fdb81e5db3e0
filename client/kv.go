package client

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/gd2fs/gd2fs/errs"
	"github.com/gd2fs/gd2fs/internal/api"
	"github.com/gd2fs/gd2fs/internal/limits"
	"github.com/gd2fs/gd2fs/internal/placement"
)

// KV is hash-mode KV cache in one pool: write-once blocks (key → bytes)
// spread over the servers by rendezvous hashing on the membership map. No
// master is on the path: the client computes each key's owners itself and
// refreshes the map only when a server answers "moved".
//
// Keys are opaque (up to 1 KiB); engines put their own grammar in them.
// Batches are pipelined: a batch costs about one round trip per server.
// In batches, a key whose owner is unreachable counts as a miss; single-key
// calls return errs.ErrUnavailable for it.
type KV struct {
	c    *Client
	pool string
}

// KV returns the KV cache of pool ("perf": 1 copy, "ha": 3 copies).
func (c *Client) KV(pool string) *KV {
	if pool == "" {
		pool = "perf"
	}
	return &KV{c: c, pool: pool}
}

// kvConcurrency bounds requests in flight for one batch.
const kvConcurrency = 256

type membership struct {
	mu sync.Mutex
	m  *api.Membership
	at time.Time // when m was fetched
}

// minMembersRefresh: a map fetched this recently is what a refresh would
// fetch. Callers that queued on the lock behind one refresh (a batch of
// puts that all met "moved") share it, and a server answering "moved" to
// everything cannot make the client call the master per request.
const minMembersRefresh = 100 * time.Millisecond

// minUnavailableRefresh: an unreachable owner makes the client fetch the map
// again when it is older than this (a dead server's keys then go to their
// new owners once the master has dropped it).
const minUnavailableRefresh = time.Second

// staleMembers reports whether the map is older than minUnavailableRefresh.
func (c *Client) staleMembers() bool {
	c.ms.mu.Lock()
	defer c.ms.mu.Unlock()
	return c.ms.m != nil && time.Since(c.ms.at) >= minUnavailableRefresh
}

func (c *Client) members(ctx context.Context, refresh bool) (*api.Membership, error) {
	c.ms.mu.Lock()
	defer c.ms.mu.Unlock()
	if c.ms.m != nil && (!refresh || time.Since(c.ms.at) < minMembersRefresh) {
		return c.ms.m, nil
	}
	var m api.Membership
	if err := c.api.Do(ctx, "GET", "/v1/members", nil, &m); err != nil {
		return nil, err
	}
	c.ms.m, c.ms.at = &m, time.Now()
	return &m, nil
}

// owners returns the servers that hold key in this pool, primary first.
func (kv *KV) owners(ctx context.Context, key string, refresh bool) ([]placement.Member, int64, error) {
	if err := checkKey(key); err != nil {
		return nil, 0, err
	}
	m, err := kv.c.members(ctx, refresh)
	if err != nil {
		return nil, 0, err
	}
	n := m.Replicas(kv.pool)
	if len(m.Members) < n && !refresh {
		// A list fetched as a server joined can lag it: the master
		// publishes a new list with its new epoch, a moment after the
		// server is up. Look again, once, before failing.
		select {
		case <-ctx.Done():
			return nil, 0, ctx.Err()
		case <-time.After(minMembersRefresh):
		}
		if m, err = kv.c.members(ctx, true); err != nil {
			return nil, 0, err
		}
		n = m.Replicas(kv.pool)
	}
	if n == 0 {
		return nil, 0, errs.New(errs.ErrNotFound, "no pool %q", kv.pool)
	}
	if len(m.Members) < n {
		return nil, 0, errs.New(errs.ErrUnavailable, "pool %s keeps %d copies but %d servers are up: start more servers", kv.pool, n, len(m.Members))
	}
	return placement.Owners([]byte(key), m.Members, n), m.Epoch, nil
}

func checkKey(key string) error {
	if key == "" {
		return errs.New(errs.ErrBadRequest, "empty key")
	}
	if len(key) > limits.MaxKVKey {
		return errs.New(errs.ErrTooLarge, "key of %d bytes: the limit is %d", len(key), limits.MaxKVKey)
	}
	return nil
}

// withOwners runs fn with the key's owners, refreshing the membership map and
// retrying when a server answers "moved" (its map and ours disagree).
func (kv *KV) withOwners(ctx context.Context, key string, fn func(owners []placement.Member, epoch int64) error) error {
	var err error
	for attempt := 0; attempt < 4; attempt++ {
		owners, epoch, oerr := kv.owners(ctx, key, attempt > 0)
		if oerr != nil {
			return oerr
		}
		err = fn(owners, epoch)
		if errors.Is(err, errs.ErrUnavailable) && attempt == 0 && kv.c.staleMembers() {
			// An owner is unreachable and the map is not fresh: the server
			// may have died (the master dropped it) or come back on another
			// address. Ask again, once, at most every minUnavailableRefresh.
			if owners2, _, oerr := kv.owners(ctx, key, true); oerr == nil && !slices.Equal(owners2, owners) {
				continue
			}
			return err
		}
		if !errors.Is(err, errs.ErrMoved) {
			return err
		}
		if attempt > 0 { // both maps may lag a membership change by a heartbeat
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(time.Duration(attempt) * 200 * time.Millisecond):
			}
		}
	}
	return err
}

// ctx bounds one KV request that moves about n bytes (a put's value, a
// get's destination buffer; 0 when unknown): Timeout + n/MinRate, as file
// requests, so a large block on a slow link is not cut at the floor.
func (kv *KV) ctx(ctx context.Context, n int) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, kv.c.reqTimeout(int64(n)))
}

// PutOptions change a put.
type PutOptions struct {
	Overwrite bool // replace an existing block (blocks are write-once otherwise)
	// Retain, when it sets anything, is applied once the put is done (a
	// second request: a read in between sees the block without it).
	Retain RetainOptions
}

// Put stores value under key. A key that exists is left as it is (write-once)
// and Put succeeds; use PutWith and Overwrite to replace it.
func (kv *KV) Put(ctx context.Context, key string, value []byte) error {
	_, err := kv.PutWith(ctx, key, value, PutOptions{})
	return err
}

// PutWith stores value under key and reports whether the key existed (and,
// without Overwrite, was kept). For an HA pool it returns when every copy
// holds the bytes.
func (kv *KV) PutWith(ctx context.Context, key string, value []byte, o PutOptions) (existed bool, err error) {
	tr := kv.c.tr
	if len(value) > limits.MaxPayload {
		return false, errs.New(errs.ErrTooLarge, "value of %d bytes: the protocol limit is %d", len(value), limits.MaxPayload)
	}
	err = kv.withOwners(ctx, key, func(owners []placement.Member, epoch int64) error {
		fwd := make([]string, 0, len(owners)-1)
		for _, m := range owners[1:] {
			fwd = append(fwd, m.Addr)
		}
		rctx, cancel := kv.ctx(ctx, len(value))
		defer cancel()
		var perr error
		existed, perr = tr.KVPut(rctx, owners[0].Addr, KVRef{Pool: kv.pool, Key: []byte(key), Forward: fwd}, epoch, value, o.Overwrite)
		if perr != nil && !errors.Is(perr, errs.ErrMoved) {
			perr = fmt.Errorf("kv put %q on %s: %w", trim(key), owners[0].ID, perr)
		}
		return perr
	})
	if err == nil && o.Retain != (RetainOptions{}) {
		_, _, err = kv.Retain(ctx, key, o.Retain)
	}
	return existed, err
}

func trim(k string) string {
	if len(k) > 64 {
		return k[:64] + "…"
	}
	return k
}

// Get returns key's value, or errs.ErrNotFound on a miss.
func (kv *KV) Get(ctx context.Context, key string) ([]byte, error) {
	return kv.get(ctx, key, nil)
}

// GetInto reads key's value into dst and returns its length. A value larger
// than dst fails with errs.ErrTooLarge; a miss with errs.ErrNotFound.
func (kv *KV) GetInto(ctx context.Context, key string, dst []byte) (int, error) {
	v, err := kv.get(ctx, key, dst)
	return len(v), err
}

func (kv *KV) get(ctx context.Context, key string, dst []byte) ([]byte, error) {
	tr := kv.c.tr
	var out []byte
	err := kv.withOwners(ctx, key, func(owners []placement.Member, epoch int64) error {
		var last error
		for _, m := range owners {
			rctx, cancel := kv.ctx(ctx, len(dst))
			v, gerr := tr.KVGet(rctx, m.Addr, KVRef{Pool: kv.pool, Key: []byte(key)}, epoch, dst)
			cancel()
			switch {
			case gerr == nil:
				out = v
				return nil
			case errors.Is(gerr, errs.ErrMoved), errors.Is(gerr, errs.ErrTooLarge):
				return gerr
			}
			last = gerr // a miss or a dead replica: try the next copy
		}
		if errors.Is(last, errs.ErrNotFound) {
			return errs.New(errs.ErrNotFound, "kv: no block %q in pool %s", trim(key), kv.pool)
		}
		return errs.New(errs.ErrUnavailable, "kv get %q: no owner answered (last error: %w); the block is back when its server is, or recompute it", trim(key), last)
	})
	return out, err
}

// BlockInfo describes a stored block.
type BlockInfo struct {
	Key    string
	Size   int64
	Tier   string // "dram" or "disk"
	Server string
}

// Stat describes key's block, or returns errs.ErrNotFound.
func (kv *KV) Stat(ctx context.Context, key string) (BlockInfo, error) {
	tr := kv.c.tr
	var info BlockInfo
	err := kv.withOwners(ctx, key, func(owners []placement.Member, epoch int64) error {
		var last error
		for _, m := range owners {
			rctx, cancel := kv.ctx(ctx, 0)
			size, tier, serr := tr.KVExists(rctx, m.Addr, KVRef{Pool: kv.pool, Key: []byte(key)}, epoch)
			cancel()
			if serr == nil {
				info = BlockInfo{Key: key, Size: size, Tier: [...]string{"none", "dram", "disk"}[min(tier, 2)], Server: m.ID}
				return nil
			}
			if errors.Is(serr, errs.ErrMoved) {
				return serr
			}
			last = serr
		}
		if errors.Is(last, errs.ErrNotFound) {
			return errs.New(errs.ErrNotFound, "kv: no block %q in pool %s", trim(key), kv.pool)
		}
		return last
	})
	return info, err
}

// Exists reports whether key is stored. It never pins or counts as a read.
func (kv *KV) Exists(ctx context.Context, key string) (bool, error) {
	_, err := kv.Stat(ctx, key)
	if errors.Is(err, errs.ErrNotFound) {
		return false, nil
	}
	return err == nil, err
}

// Delete removes key from every copy. Deleting a missing key is not an error.
func (kv *KV) Delete(ctx context.Context, key string) error {
	tr := kv.c.tr
	return kv.withOwners(ctx, key, func(owners []placement.Member, epoch int64) error {
		for _, m := range owners {
			rctx, cancel := kv.ctx(ctx, 0)
			_, derr := tr.KVDelete(rctx, m.Addr, KVRef{Pool: kv.pool, Key: []byte(key)}, epoch, false)
			cancel()
			if derr != nil {
				return derr
			}
		}
		return nil
	})
}

// DeleteByPrefix removes every key of this pool that starts with prefix, on
// every server, and returns how many blocks went.
func (kv *KV) DeleteByPrefix(ctx context.Context, prefix string) (int64, error) {
	tr := kv.c.tr
	return kv.onEveryServer(ctx, "delete prefix", func(rctx context.Context, addr string, epoch int64) (int64, error) {
		return tr.KVDelete(rctx, addr, KVRef{Pool: kv.pool, Key: []byte(prefix)}, epoch, true)
	})
}

// onEveryServer runs fn once per server of the map, draining ones included
// (they hold blocks until those moved), at once, and sums what they count;
// the first error is returned, named by op and the server.
func (kv *KV) onEveryServer(ctx context.Context, op string, fn func(ctx context.Context, addr string, epoch int64) (int64, error)) (int64, error) {
	m, err := kv.c.members(ctx, true)
	if err != nil {
		return 0, err
	}
	var total int64
	var mu sync.Mutex
	var first error
	var wg sync.WaitGroup
	for _, mem := range append(slices.Clone(m.Members), m.Draining...) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rctx, cancel := kv.ctx(ctx, 0)
			defer cancel()
			n, ferr := fn(rctx, mem.Addr, m.Epoch)
			mu.Lock()
			defer mu.Unlock()
			total += n
			if ferr != nil && first == nil {
				first = fmt.Errorf("%s on %s: %w", op, mem.ID, ferr)
			}
		}()
	}
	wg.Wait()
	return total, first
}

// forEach runs fn(i) for i in [0, n) with bounded concurrency. The requests
// are pipelined on the per-server connections, so a batch costs about one
// round trip per server involved, not one per key.
func forEach(n int, fn func(i int)) {
	sem := make(chan struct{}, kvConcurrency)
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			fn(i)
		}()
	}
	wg.Wait()
}

// BatchError reports the keys of a batch that failed.
type BatchError struct {
	Errs []error // per key; nil where the key succeeded
}

func (e *BatchError) Error() string {
	n, first := 0, error(nil)
	for _, err := range e.Errs {
		if err != nil {
			if first == nil {
				first = err
			}
			n++
		}
	}
	return fmt.Sprintf("%d of %d keys failed; first: %v", n, len(e.Errs), first)
}

// Unwrap returns the first failure, so errors.Is works on the batch.
func (e *BatchError) Unwrap() error {
	for _, err := range e.Errs {
		if err != nil {
			return err
		}
	}
	return nil
}

func batchErr(es []error) error {
	for _, e := range es {
		if e != nil {
			return &BatchError{Errs: es}
		}
	}
	return nil
}

// BatchPut stores values[i] under keys[i] (write-once, as Put), pipelined.
// It returns nil or a *BatchError naming the keys that failed.
func (kv *KV) BatchPut(ctx context.Context, keys []string, values [][]byte) error {
	if len(keys) != len(values) {
		return errs.New(errs.ErrBadRequest, "BatchPut: %d keys but %d values", len(keys), len(values))
	}
	es := make([]error, len(keys))
	forEach(len(keys), func(i int) { es[i] = kv.Put(ctx, keys[i], values[i]) })
	return batchErr(es)
}

// BatchGet returns the values of keys, nil for misses (and for keys whose
// owner is unreachable).
func (kv *KV) BatchGet(ctx context.Context, keys []string) ([][]byte, error) {
	out := make([][]byte, len(keys))
	es := make([]error, len(keys))
	forEach(len(keys), func(i int) {
		v, err := kv.Get(ctx, keys[i])
		if err == nil {
			out[i] = v
		} else if !isMiss(err) {
			es[i] = err
		}
	})
	return out, batchErr(es)
}

// BatchGetInto reads each key's value into dsts[i] and returns its length,
// or -1 for a miss.
func (kv *KV) BatchGetInto(ctx context.Context, keys []string, dsts [][]byte) ([]int, error) {
	if len(keys) != len(dsts) {
		return nil, errs.New(errs.ErrBadRequest, "BatchGetInto: %d keys but %d buffers", len(keys), len(dsts))
	}
	ns := make([]int, len(keys))
	es := make([]error, len(keys))
	forEach(len(keys), func(i int) {
		n, err := kv.GetInto(ctx, keys[i], dsts[i])
		ns[i] = n
		if err != nil {
			ns[i] = -1
			if !isMiss(err) {
				es[i] = err
			}
		}
	})
	return ns, batchErr(es)
}

// BatchExists answers, for each key, whether it is stored, and the number of
// leading keys that are all stored: with keys being a prompt's chunk hashes
// in order, that is how many prefix chunks are cached.
func (kv *KV) BatchExists(ctx context.Context, keys []string) (hits []bool, prefix int, err error) {
	hits = make([]bool, len(keys))
	es := make([]error, len(keys))
	forEach(len(keys), func(i int) {
		ok, err := kv.Exists(ctx, keys[i])
		hits[i] = ok
		if err != nil && !isMiss(err) {
			es[i] = err
		}
	})
	for prefix < len(hits) && hits[prefix] {
		prefix++
	}
	return hits, prefix, batchErr(es)
}

// isMiss: misses and unreachable owners are both "not cached" in a batch.
func isMiss(err error) bool {
	return errors.Is(err, errs.ErrNotFound) || errors.Is(err, errs.ErrUnavailable)
}
