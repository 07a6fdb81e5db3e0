package kvstore

import (
	"slices"
	"strings"

	"github.com/gd2fs/gd2fs/internal/limits"
)

const scanMask = 1<<limits.ScanBits - 1

// ScanHash is the position of key in the scan order: FNV-1a, cut to
// limits.ScanBits. It is fixed (not seeded) so a cursor stays meaningful across
// calls, and across restarts of the server.
func ScanHash(key string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(key); i++ {
		h ^= uint64(key[i])
		h *= 1099511628211
	}
	return h & scanMask
}

// Scan lists keys that start with prefix (returned without it) in hash
// order, from cursor on: at least count keys when that many are left, and
// every key whose hash equals the last one returned, so resuming at next
// skips nothing. next is 0 when the scan is complete. total is the number
// of keys with the prefix now.
//
// Like Redis's SCAN, a key present for the whole scan is returned exactly
// once, whatever is added or removed meanwhile; keys added or removed during
// the scan may or may not be returned. Each call walks the whole index
// (the hash order is not kept), so a full scan of n keys costs about
// n²/count steps: it is an administrative operation, not a data path.
func (s *Store) Scan(prefix []byte, cursor uint64, count int) (keys []string, next uint64, total int) {
	type hk struct {
		h uint64
		k string
	}
	count = max(count, 1)
	p := string(prefix)
	var cand []hk
	s.mu.Lock()
	for k, e := range s.index {
		if !strings.HasPrefix(k, p) || s.expiredLocked(e) {
			continue
		}
		total++
		if h := ScanHash(k[len(p):]); h >= cursor {
			cand = append(cand, hk{h, k[len(p):]})
		}
	}
	s.mu.Unlock()
	slices.SortFunc(cand, func(a, b hk) int {
		switch {
		case a.h < b.h:
			return -1
		case a.h > b.h:
			return 1
		}
		return strings.Compare(a.k, b.k)
	})
	n := min(count, len(cand))
	for n < len(cand) && n > 0 && cand[n].h == cand[n-1].h {
		n++ // never split keys of one hash between two calls
	}
	keys = make([]string, n)
	for i := range keys {
		keys[i] = cand[i].k
	}
	if n < len(cand) {
		next = cand[n-1].h + 1 // ≤ 2^56: cannot wrap to 0
	}
	return keys, next, total
}
