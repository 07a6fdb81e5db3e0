package kvtrace

import (
	"errors"
	"strconv"
	"time"

	"github.com/gd2fs/gd2fs/errs"
	"github.com/gd2fs/gd2fs/internal/kvstore"
)

// StoreResult is a replay through gd2fs's KV store.
type StoreResult struct {
	Result
	Ops     int64 // store operations (exists, get, put)
	Elapsed time.Duration
	Stats   kvstore.Stats // the store's at the end
}

// Store replays reqs through a fresh in-process kvstore whose DRAM tier holds
// capacity blocks of blockBytes each and which has no disk tier, so a hit is
// a DRAM hit. Each request is served as a connector does: exists on its
// blocks in order up to the first miss (the prefix check, never a read), get
// of the hits, put of the rest (without overwrite).
func Store(reqs []Request, capacity int, blockBytes int) (StoreResult, error) {
	var res StoreResult
	if blockBytes <= 0 || blockBytes > kvstore.PageSize*64 {
		return res, errs.New(errs.ErrBadRequest, "block size %d out of range", blockBytes)
	}
	pages := int64((blockBytes + kvstore.PageSize - 1) / kvstore.PageSize)
	s, err := kvstore.Open(kvstore.Config{MemBytes: int64(max(capacity, 2)) * pages * kvstore.PageSize})
	if err != nil {
		return res, err
	}
	defer s.Close()
	val := make([]byte, blockBytes)
	keys := make([][]byte, 0, 64)
	start := time.Now()
	for _, q := range reqs {
		keys = keys[:0]
		for _, h := range q.HashIDs {
			keys = append(keys, strconv.AppendInt(make([]byte, 0, 20), h, 36))
		}
		run := 0
		for _, k := range keys {
			res.Ops++
			if t, _ := s.Exists(k); t == kvstore.TierNone {
				break
			}
			run++
		}
		hits := 0
		for _, k := range keys[:run] {
			res.Ops++
			if _, err := s.Get(k, func([][]byte, uint32) error { return nil }); err != nil {
				if errors.Is(err, errs.ErrNotFound) {
					break // evicted between the check and the get: the run ends here
				}
				return res, err
			}
			hits++
		}
		for _, k := range keys[hits:] {
			res.Ops++
			if _, err := s.Put(k, val, false); err != nil {
				return res, err
			}
		}
		res.Blocks += int64(len(keys))
		res.PrefixHit += int64(hits)
	}
	res.Elapsed = time.Since(start)
	res.Stats = s.Stats()
	return res, nil
}
