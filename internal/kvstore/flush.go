package kvstore

import (
	"container/list"
	"errors"

	"github.com/gd2fs/gd2fs/errs"
	"github.com/gd2fs/gd2fs/internal/bufpool"
)

// FlushStats says what Flush did.
type FlushStats struct {
	Written, WrittenBytes int64 // DRAM-only blocks now also on disk
	Left, LeftBytes       int64 // DRAM-only blocks that did not fit in the disk tier's free room
}

// flushBatch bounds the bytes Flush copies out of DRAM before writing them:
// a flush of a large DRAM tier does not double the process's memory.
const flushBatch = 64 << 20

// Flush writes every block that is only in DRAM to the disk tier, into its
// free room only (it evicts nothing from disk: what is there is as worth
// keeping), the most recently used first, and keeps the DRAM copies. A
// server calls it when it stops gracefully, so a restart finds those blocks
// (write-behind otherwise loses them), and their pins, TTLs and priorities
// with them (retain.snap). Without a disk tier it does nothing.
func (s *Store) Flush() (FlushStats, error) {
	var st FlushStats
	if s.disk == nil {
		return st, nil
	}
	done := map[*entry]bool{}
	for {
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			return st, errs.New(errs.ErrUnavailable, "kvstore: flush of a closed store")
		}
		batch := int64(0)
		more := false
		// Pinned blocks first, then main before small, each from its most
		// recently used end.
		var ws []*write
		for _, q := range []*list.List{&s.pinned, &s.main, &s.small} {
			for el := q.Front(); el != nil; el = el.Next() {
				e := el.Value.(*entry)
				if done[e] || e.pages == nil || e.seg != nil || e.pend != nil || e.dead {
					continue
				}
				if batch >= flushBatch {
					more = true
					break
				}
				done[e] = true
				need := int64(recHeader+len(e.key)) + e.size
				if !s.disk.Fits(need) {
					st.Left++
					st.LeftBytes += e.size
					continue
				}
				w, err := s.reserveLocked(e.key, e.size, e.crc, false)
				if err != nil {
					st.Left++
					st.LeftBytes += e.size
					continue
				}
				bp := bufpool.Get(int(e.size))
				s.arena.CopyOut(*bp, e.pages, 0)
				w.e, w.val, w.pooled = e, *bp, bp
				e.pend = w
				batch += e.size
				ws = append(ws, w)
			}
		}
		s.unlockAndWrite()
		var err error
		for _, w := range ws {
			if w.err != nil {
				st.Left++
				st.LeftBytes += w.size
				err = w.err
				continue
			}
			st.Written++
			st.WrittenBytes += w.size
		}
		if err != nil {
			// A disk that fails one write fails the next: stop, but keep
			// the pins and TTLs of what did reach the disk (retain.go).
			return st, errors.Join(err, s.saveRetention())
		}
		if !more {
			// What keeps the blocks goes with them (retain.go).
			return st, s.saveRetention()
		}
	}
}

// minSegments is how many segments a disk tier is cut into at least: the
// tier evicts whole segments, oldest first, and never the one being
// appended to, so with one segment it could never make room.
const minSegments = 4

// segmentSizeFor is the default segment size: 64 MiB or twice the largest
// value, but at most a quarter of a small disk tier (half of it when a
// given largest value needs that room: two segments are the least that works). The largest value,
// when it was not given (defaultMax), shrinks to fit such a segment; when
// it was given and two segments of it do not fit the disk tier, the store
// is refused here, at start, with what to change, rather than failing
// every put later ("nothing can be evicted").
func segmentSizeFor(cfg Config, defaultMax bool) (seg, maxValue int64, err error) {
	maxValue = cfg.MaxValue
	seg = max(64<<20, 2*maxValue)
	if cfg.Dir == "" || cfg.DiskBytes <= 0 || cfg.DiskBytes >= minSegments*seg {
		return seg, maxValue, nil
	}
	seg = cfg.DiskBytes / minSegments
	if fit := seg - recHeader - MaxKey; maxValue > fit && !defaultMax {
		// A given largest value that a quarter of the tier cannot hold:
		// two segments still work (the tier needs two to make room).
		if half := cfg.DiskBytes / 2; half-recHeader-MaxKey >= maxValue {
			return half, maxValue, nil
		}
	}
	if fit := seg - recHeader - MaxKey; maxValue > fit {
		if !defaultMax || fit < PageSize {
			least := 2 * (maxValue + recHeader + MaxKey)
			return 0, 0, errs.New(errs.ErrBadRequest, "KV disk tier of %d bytes (--kv-disk) is too small for values of up to %d bytes (--kv-max-value): give --kv-disk at least %d bytes, or a smaller --kv-max-value", cfg.DiskBytes, maxValue, least)
		}
		maxValue = fit
	}
	return seg, maxValue, nil
}
