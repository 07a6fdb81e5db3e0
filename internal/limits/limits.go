// Package limits holds the explicit maxima of every size, count and token
// figure a request can carry, and checked arithmetic for turning such figures
// into byte counts. A request figure is compared with its maximum before any
// arithmetic or allocation; products of several figures go through Mul, which
// reports overflow instead of wrapping (docs/security.md lists every limit).
package limits

import (
	"math"
	"time"
)

// Maxima of request figures. They are far above any real use and far below
// int64 overflow, so sums of a few of them stay exact.
const (
	// MaxFileSize is the largest file size a commit or link may record
	// (1 PiB). Sums over many files are computed in floating point
	// (meta.Totals), so no number of such files overflows /v1/status.
	MaxFileSize = 1 << 50
	// MaxChunksPerRequest bounds the chunks one alloc or link places (and
	// holds in memory): 65536 chunks of 16 MiB is 1 TiB; larger linked
	// files need a larger chunk size.
	MaxChunksPerRequest = 65536
	// MaxTokens bounds prompt, decode and prefix token counts (64 Mi).
	MaxTokens = 1 << 26
	// Layout fields.
	MaxLayers     = 65536
	MaxKVHeads    = 65536
	MaxHeadDim    = 65536
	MaxPageTokens = 1 << 20
	// MaxPageBytes bounds one KV page (1 GiB).
	MaxPageBytes = 1 << 30
	// MaxListLimit bounds ?limit= of list endpoints.
	MaxListLimit = 10000
	// MaxJSONBody bounds an HTTP request body (4 MiB).
	MaxJSONBody = 4 << 20
	// MaxSavedSegments bounds the saved segments of one session commit
	// (kvcache_params or fresh_kvcache): the master asks the servers about
	// each before the commit, so a body of tiny segments must not fan out
	// without end. Engines send one segment per run of saved pages, a few
	// per commit.
	MaxSavedSegments = 4096
	// MaxKVKey is the longest hash-mode KV key, in bytes, everywhere: the
	// client, the CLI and the server all check this same figure.
	MaxKVKey = 1024
)

// Mul returns a*b and whether it is exact: false when either factor is
// negative or the product overflows int64.
func Mul(a, b int64) (int64, bool) {
	if a < 0 || b < 0 {
		return 0, false
	}
	if a == 0 || b == 0 {
		return 0, true
	}
	if a > math.MaxInt64/b {
		return 0, false
	}
	return a * b, true
}

// MulAll multiplies every factor with Mul; false on any overflow.
func MulAll(xs ...int64) (int64, bool) {
	p := int64(1)
	for _, x := range xs {
		var ok bool
		if p, ok = Mul(p, x); !ok {
			return 0, false
		}
	}
	return p, true
}

// Add returns a+b and whether it is exact, for non-negative a and b.
func Add(a, b int64) (int64, bool) {
	if a < 0 || b < 0 || a > math.MaxInt64-b {
		return 0, false
	}
	return a + b, true
}

// CeilDiv returns ceil(a/b) for a >= 0, b > 0 without overflowing on a+b-1.
func CeilDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 {
		q++
	}
	return q
}

// MaxTTL bounds a block's or key's time to live. Longer TTLs (Redis takes
// any whose milliseconds fit an int64) are kept as MaxTTL, which is forever
// in practice, so that now+TTL stays inside time.Duration and
// time.Time.UnixNano (both end in 2262); an overflowed TTL would wrap to a
// past time and delete the key at once.
const MaxTTL = 100 * 365 * 24 * time.Hour

// TTLMillis is a TTL of ms milliseconds (ms >= 0) as a Duration, at most
// MaxTTL; it clamps before it multiplies.
func TTLMillis(ms int64) time.Duration {
	if ms >= int64(MaxTTL/time.Millisecond) {
		return MaxTTL
	}
	return time.Duration(ms) * time.Millisecond
}

// ClampExpiry is at, or now+MaxTTL where at is later than that.
func ClampExpiry(at, now time.Time) time.Time {
	if lim := now.Add(MaxTTL); at.After(lim) {
		return lim
	}
	return at
}
