package resp_test

import (
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestExpire: Redis's TTL commands on the wire, against a cluster of 3
// (keys on every server, through every door). TTLs are long (100 s) so no
// answer depends on how fast the test runs; expiry itself is tested on a
// controlled clock in internal/kvstore (TestTTLExpiry).
func TestExpire(t *testing.T) {
	c := startCluster(t, 3, "")
	r := dial(t, c.RESP[0].Addr())
	o := dial(t, c.RESP[1].Addr())
	near := func(what, got string, lo, hi int64) {
		t.Helper()
		if !strings.HasPrefix(got, ":") {
			t.Fatalf("%s: %q", what, got)
		}
		n, err := strconv.ParseInt(strings.TrimSpace(got[1:]), 10, 64)
		if err != nil || n < lo || n > hi {
			t.Fatalf("%s: %q, want %d to %d", what, got, lo, hi)
		}
	}
	for i := 0; i < 12; i++ { // several keys: owners on every server
		k := "k" + strconv.Itoa(i)
		eq(t, "SET EX", r.do("SET", k, "v", "EX", "100"), "+OK\r\n")
		near("TTL", o.do("TTL", k), 99, 100)
		near("PTTL", o.do("PTTL", k), 90_000, 100_000)
		now := time.Now().Unix()
		near("EXPIRETIME", o.do("EXPIRETIME", k), now+98, now+101)
		eq(t, "GET", o.do("GET", k), bulk("v"))
	}
	eq(t, "TTL of a key without one", r.do("SET", "plain", "v"), "+OK\r\n")
	eq(t, "TTL -1", o.do("TTL", "plain"), ":-1\r\n")
	eq(t, "TTL -2", o.do("PTTL", "missing"), ":-2\r\n")
	// SET without KEEPTTL clears a TTL; with KEEPTTL keeps it.
	eq(t, "SET again", r.do("SET", "k0", "w"), "+OK\r\n")
	eq(t, "SET cleared the TTL", o.do("TTL", "k0"), ":-1\r\n")
	eq(t, "SET KEEPTTL", r.do("SET", "k1", "w", "KEEPTTL"), "+OK\r\n")
	near("KEEPTTL kept it", o.do("TTL", "k1"), 98, 100)
	eq(t, "the new value", o.do("GET", "k1"), bulk("w"))
	// PX, EXAT, PXAT.
	eq(t, "SET PX", r.do("SET", "px", "v", "PX", "200000"), "+OK\r\n")
	near("PX", o.do("TTL", "px"), 199, 200)
	at := strconv.FormatInt(time.Now().Unix()+300, 10)
	eq(t, "SET EXAT", r.do("SET", "exat", "v", "EXAT", at), "+OK\r\n")
	near("EXAT", o.do("TTL", "exat"), 297, 300)
	eq(t, "SET PXAT in the past", r.do("SET", "gone", "v", "PXAT", "1000"), "+OK\r\n")
	eq(t, "PXAT in the past: gone", o.do("GET", "gone"), "$-1\r\n")
	// EXPIRE and its conditions.
	eq(t, "EXPIRE missing", r.do("EXPIRE", "missing", "10"), ":0\r\n")
	eq(t, "EXPIRE XX without TTL", r.do("EXPIRE", "plain", "100", "XX"), ":0\r\n")
	eq(t, "EXPIRE GT without TTL", r.do("EXPIRE", "plain", "100", "GT"), ":0\r\n")
	eq(t, "EXPIRE NX", r.do("EXPIRE", "plain", "100", "NX"), ":1\r\n")
	eq(t, "EXPIRE NX again", r.do("EXPIRE", "plain", "50", "NX"), ":0\r\n")
	eq(t, "EXPIRE LT longer", r.do("EXPIRE", "plain", "500", "LT"), ":0\r\n")
	eq(t, "EXPIRE GT longer", r.do("EXPIRE", "plain", "500", "GT"), ":1\r\n")
	near("GT applied", o.do("TTL", "plain"), 498, 500)
	eq(t, "PEXPIRE LT shorter", r.do("PEXPIRE", "plain", "400000", "LT"), ":1\r\n")
	near("LT applied", o.do("TTL", "plain"), 398, 400)
	eq(t, "PERSIST", r.do("PERSIST", "plain"), ":1\r\n")
	eq(t, "PERSIST again", r.do("PERSIST", "plain"), ":0\r\n")
	eq(t, "PERSIST missing", r.do("PERSIST", "missing"), ":0\r\n")
	eq(t, "TTL after PERSIST", o.do("TTL", "plain"), ":-1\r\n")
	eq(t, "PEXPIREAT", r.do("PEXPIREAT", "plain", strconv.FormatInt(time.Now().UnixMilli()+600_000, 10)), ":1\r\n")
	near("PEXPIREAT applied", o.do("TTL", "plain"), 597, 600)
	// A time not in the future deletes at once, as Redis does.
	eq(t, "EXPIRE 0", r.do("EXPIRE", "plain", "0"), ":1\r\n")
	eq(t, "deleted", o.do("EXISTS", "plain"), ":0\r\n")
	eq(t, "EXPIREAT past", r.do("EXPIREAT", "k2", "1"), ":1\r\n")
	eq(t, "deleted too", o.do("GET", "k2"), "$-1\r\n")
}
