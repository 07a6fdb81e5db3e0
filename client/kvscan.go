package client

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/gd2fs/gd2fs/errs"
	"github.com/gd2fs/gd2fs/internal/limits"
	"github.com/gd2fs/gd2fs/internal/placement"
)

// Scan lists keys of this pool across the cluster, Redis SCAN style: start
// with cursor 0 and call again with the returned cursor until it is 0. A
// call returns about count keys (more or fewer: count is a hint). A key
// stored for the whole scan is returned at least once while the set of
// servers does not change; in a pool with several copies a key is returned
// once per copy.
//
// The cursor's top 8 bits are the server's index in the membership map
// sorted by id, the low 56 bits a position in that server's hash order
// (the server store's scan hash).
func (kv *KV) Scan(ctx context.Context, cursor uint64, count int) (keys []string, next uint64, err error) {
	tr := kv.c.tr
	ms, err := kv.sortedMembers(ctx)
	if err != nil {
		return nil, 0, err
	}
	if len(ms) > 255 {
		return nil, 0, errs.New(errs.ErrBadRequest, "kv scan: %d servers; a scan cursor covers 255", len(ms))
	}
	i, pos := int(cursor>>limits.ScanBits), cursor&(1<<limits.ScanBits-1)
	count = max(count, 1)
	for ; i < len(ms) && len(keys) < count; i, pos = i+1, 0 {
		rctx, cancel := kv.ctx(ctx, 0)
		got, nx, _, serr := tr.KVScan(rctx, ms[i].Addr, kv.pool, pos, count-len(keys))
		cancel()
		if serr != nil {
			return nil, 0, fmt.Errorf("kv scan on %s: %w", ms[i].ID, serr)
		}
		keys = append(keys, got...)
		if nx != 0 {
			return keys, uint64(i)<<limits.ScanBits | nx, nil
		}
	}
	if i >= len(ms) {
		return keys, 0, nil
	}
	return keys, uint64(i) << limits.ScanBits, nil
}

// Count returns the number of keys of this pool over all servers (a key
// with several copies counts once per copy).
func (kv *KV) Count(ctx context.Context) (int64, error) {
	tr := kv.c.tr
	ms, err := kv.sortedMembers(ctx)
	if err != nil {
		return 0, err
	}
	var mu sync.Mutex
	var total int64
	var first error
	var wg sync.WaitGroup
	for _, m := range ms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rctx, cancel := kv.ctx(ctx, 0)
			defer cancel()
			_, _, n, err := tr.KVScan(rctx, m.Addr, kv.pool, 0, 0)
			mu.Lock()
			defer mu.Unlock()
			total += n
			if err != nil && first == nil {
				first = fmt.Errorf("kv count on %s: %w", m.ID, err)
			}
		}()
	}
	wg.Wait()
	return total, first
}

func (kv *KV) sortedMembers(ctx context.Context) ([]placement.Member, error) {
	m, err := kv.c.members(ctx, false)
	if err != nil {
		return nil, err
	}
	ms := slices.Clone(m.Members)
	slices.SortFunc(ms, func(a, b placement.Member) int { return strings.Compare(a.ID, b.ID) })
	return ms, nil
}

// RefreshMembers fetches the membership map from the master now. The KV
// methods refresh it by themselves when a server answers "moved"; a long
// running front end calls this after a server stopped answering, so keys
// move to the servers that are up.
func (c *Client) RefreshMembers(ctx context.Context) error {
	_, err := c.members(ctx, true)
	return err
}

// DeleteFound is Delete that also reports whether key was stored (on any
// of its copies): what Redis's DEL counts.
func (kv *KV) DeleteFound(ctx context.Context, key string) (bool, error) {
	tr := kv.c.tr
	found := false
	err := kv.withOwners(ctx, key, func(owners []placement.Member, epoch int64) error {
		for _, m := range owners {
			rctx, cancel := kv.ctx(ctx, 0)
			n, derr := tr.KVDelete(rctx, m.Addr, KVRef{Pool: kv.pool, Key: []byte(key)}, epoch, false)
			cancel()
			if derr != nil {
				return derr
			}
			found = found || n > 0
		}
		return nil
	})
	return found, err
}

// Owners returns the ids of the servers holding key in this pool, primary
// first, by the client's membership map (no request is sent).
func (kv *KV) Owners(ctx context.Context, key string) ([]string, error) {
	ms, _, err := kv.owners(ctx, key, false)
	if err != nil {
		return nil, err
	}
	ids := make([]string, len(ms))
	for i, m := range ms {
		ids[i] = m.ID
	}
	return ids, nil
}
