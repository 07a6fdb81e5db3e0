package resp_test

import (
	"testing"
)

// TestExpireLongTTLKeepsKey: Redis accepts EXPIRE with any time
// whose milliseconds fit in an int64 (here ~295 years); the key must stay
// with a TTL, not be deleted because the TTL overflowed time.Duration.
func TestExpireLongTTLKeepsKey(t *testing.T) {
	c := startCluster(t, 1, "")
	r := dial(t, c.RESP[0].Addr())
	eq(t, "SET", r.do("SET", "long", "v"), "+OK\r\n")
	eq(t, "EXPIRE ~295 years", r.do("EXPIRE", "long", "9300000000"), ":1\r\n")
	eq(t, "still there", r.do("GET", "long"), bulk("v"))
	eq(t, "SET EX ~295 years", r.do("SET", "long2", "v", "EX", "9300000000"), "+OK\r\n")
	eq(t, "still there 2", r.do("GET", "long2"), bulk("v"))
}
