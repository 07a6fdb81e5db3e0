package resp

import (
	"math"
	"strconv"
	"time"

	"github.com/gd2fs/gd2fs/client"
	"github.com/gd2fs/gd2fs/internal/limits"
)

// TTLs as Redis has them (expire.c): SET's EX, PX, EXAT, PXAT and KEEPTTL;
// EXPIRE, PEXPIRE, EXPIREAT, PEXPIREAT with NX, XX, GT, LT; TTL, PTTL,
// EXPIRETIME, PEXPIRETIME, PERSIST. A gd2fs key's TTL lives on its owners
// (kvstore's retention, docs/kv-cache.md); these commands set it with a
// second request after the put or after reading the current one, so they
// are not atomic with what other clients do meanwhile (docs/resp.md).

var timeNow = time.Now

// expireAt parses a SET or EXPIRE time argument of unit ms (1000 for
// seconds) from base (0 for the *AT forms) into unix ms, checking for
// overflow as Redis does; ok=false once the error reply is written.
func (c *conn) expireAt(arg []byte, unit, base int64, cmd string, positive bool) (int64, bool) {
	n, err := strconv.ParseInt(string(arg), 10, 64)
	if err != nil {
		c.w.error("ERR value is not an integer or out of range")
		return 0, false
	}
	if (positive && n <= 0) || n > math.MaxInt64/unit || n < math.MinInt64/unit || n*unit > math.MaxInt64-base {
		c.w.error("ERR invalid expire time in '" + cmd + "' command")
		return 0, false
	}
	return n*unit + base, true
}

// ttlFrom is the TTL to ask for to expire at unix ms when (0 or less:
// now, which deletes the key), at most limits.MaxTTL: a later time is kept
// as that rather than wrapping time.Duration into the past.
func ttlFrom(when int64) time.Duration {
	now := timeNow().UnixMilli()
	if when <= now {
		return 0
	}
	return limits.TTLMillis(when - now)
}

// expireCmd serves EXPIRE, PEXPIRE, EXPIREAT and PEXPIREAT.
func (c *conn) expireCmd(args [][]byte) error {
	name := lower(args[0])
	unit, base := int64(1000), int64(0)
	if name == "pexpire" || name == "pexpireat" {
		unit = 1
	}
	if name == "expire" || name == "pexpire" {
		base = timeNow().UnixMilli()
	}
	var nx, xx, gt, lt bool
	for _, a := range args[3:] {
		switch o := lower(a); o {
		case "nx":
			nx = true
		case "xx":
			xx = true
		case "gt":
			gt = true
		case "lt":
			lt = true
		default:
			c.w.error("ERR Unsupported option " + string(a))
			return nil
		}
	}
	switch {
	case nx && (xx || gt || lt):
		c.w.error("ERR NX and XX, GT or LT options at the same time are not compatible")
		return nil
	case gt && lt:
		c.w.error("ERR GT and LT options at the same time are not compatible")
		return nil
	}
	when, ok := c.expireAt(args[2], unit, base, name, false)
	if !ok {
		return nil
	}
	key := args[1]
	if keyError(key) != "" {
		c.w.int(0)
		return nil
	}
	cur, err := c.s.cfg.Backend.Retention(c.s.ctx, key)
	switch {
	case miss(err):
		c.w.int(0)
		return nil
	case err != nil:
		c.backendError(err)
		return nil
	}
	// A key without a TTL counts as one that never expires (Redis: GT
	// never applies to it, LT always does).
	has := cur.TTL > 0
	curAt := timeNow().Add(cur.TTL).UnixMilli()
	if (nx && has) || (xx && !has) || (gt && (!has || when <= curAt)) || (lt && has && when >= curAt) {
		c.w.int(0)
		return nil
	}
	c.retainAnswer(key, client.RetainOptions{SetTTL: true, TTL: ttlFrom(when)})
	return nil
}

// ttlCmd serves TTL, PTTL, EXPIRETIME and PEXPIRETIME: -2 for a missing
// key, -1 for one without a TTL.
func (c *conn) ttlCmd(args [][]byte) error {
	name := lower(args[0])
	if keyError(args[1]) != "" {
		c.w.int(-2)
		return nil
	}
	r, err := c.s.cfg.Backend.Retention(c.s.ctx, args[1])
	switch {
	case miss(err):
		c.w.int(-2)
		return nil
	case err != nil:
		c.backendError(err)
		return nil
	case r.TTL <= 0:
		c.w.int(-1)
		return nil
	}
	ms := r.TTL.Milliseconds()
	switch name {
	case "ttl":
		c.w.int((ms + 500) / 1000) // Redis rounds
	case "pttl":
		c.w.int(ms)
	case "expiretime":
		c.w.int((timeNow().UnixMilli() + ms) / 1000)
	default:
		c.w.int(timeNow().UnixMilli() + ms)
	}
	return nil
}

// persist removes a key's TTL: 1 when it had one.
func (c *conn) persist(args [][]byte) error {
	if keyError(args[1]) != "" {
		c.w.int(0)
		return nil
	}
	r, err := c.s.cfg.Backend.Retention(c.s.ctx, args[1])
	switch {
	case miss(err):
		c.w.int(0)
		return nil
	case err != nil:
		c.backendError(err)
		return nil
	case r.TTL <= 0:
		c.w.int(0)
		return nil
	}
	c.retainAnswer(args[1], client.RetainOptions{Persist: true})
	return nil
}

// retainAnswer applies o to key and answers as EXPIRE and PERSIST do: 1
// when it took effect, 0 for a key that is gone.
func (c *conn) retainAnswer(key []byte, o client.RetainOptions) {
	if _, _, err := c.s.cfg.Backend.Retain(c.s.ctx, key, o); err != nil {
		if miss(err) {
			c.w.int(0)
		} else {
			c.backendError(err)
		}
		return
	}
	c.w.int(1)
}
