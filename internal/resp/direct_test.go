package resp_test

import (
	"bytes"
	"context"
	"fmt"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/gd2fs/gd2fs/internal/testutil"
)

// infoInt reads one integer field of INFO.
func infoInt(t *testing.T, r *rconn, field string) int64 {
	t.Helper()
	m := regexp.MustCompile(field + `:(\d+)`).FindStringSubmatch(r.do("INFO"))
	if m == nil {
		t.Fatalf("INFO has no %s", field)
	}
	n, _ := strconv.ParseInt(m[1], 10, 64)
	return n
}

// TestSetIntoDRAM: a plain SET of a large value is read from the socket
// straight into the store's DRAM pages (INFO's gd2fs_sets_into_dram
// counts it) and reads back as sent, through RESP and through the binary
// protocol, whose client checks the CRC stored with it; pipelined with
// other commands in one write; with NX over an existing key (kept) and
// without (replaced); inside MULTI (the ordinary path, the value kept
// for EXEC). A client that goes away in the middle of a value, or breaks
// the protocol after it, leaves nothing stored and no memory held.
func TestSetIntoDRAM(t *testing.T) {
	c := startCluster(t, 1, "")
	r := dial(t, c.RESP[0].Addr())
	kv := c.Client().KV("perf")
	ctx := context.Background()
	v1 := string(testutil.RandomBytes(1<<20+7, 1))
	v2 := string(testutil.RandomBytes(300<<10+1, 2))
	check := func(key, want string) {
		t.Helper()
		if got := r.do("GET", key); got != fmt.Sprintf("$%d\r\n%s\r\n", len(want), want) {
			t.Fatalf("GET %s: %d bytes, not the value set", key, len(got))
		}
		got, err := kv.Get(ctx, key) // the binary protocol: the stored CRC is checked
		if err != nil || !bytes.Equal(got, []byte(want)) {
			t.Fatalf("binary get of %s: %v", key, err)
		}
	}

	if got := r.do("SET", "k", v1); got != "+OK\r\n" {
		t.Fatalf("SET: %q", got)
	}
	if n := infoInt(t, r, "gd2fs_sets_into_dram"); n != 1 {
		t.Fatalf("gd2fs_sets_into_dram = %d after one large SET, want 1", n)
	}
	check("k", v1)

	// Pipelined: two SETs and a GET in one write, the second value
	// followed at once by the next command in the same bytes.
	r.send(append(append(encode("SET", "a", v2), encode("SET", "b", v1)...), encode("GET", "a")...))
	for i, want := range []string{"+OK\r\n", "+OK\r\n", fmt.Sprintf("$%d\r\n%s\r\n", len(v2), v2)} {
		if got := r.reply(); got != want {
			t.Fatalf("pipelined reply %d: %d bytes, not %q...", i, len(got), want[:min(len(want), 8)])
		}
	}
	check("b", v1)

	// NX keeps an existing key; a plain SET replaces it.
	if got := r.do("SET", "k", v2, "NX"); got != "$-1\r\n" {
		t.Fatalf("SET NX over a key: %q", got)
	}
	check("k", v1)
	if got := r.do("SET", "k", v2); got != "+OK\r\n" {
		t.Fatalf("SET over a key: %q", got)
	}
	check("k", v2)

	// MULTI: queued, stored at EXEC.
	for _, args := range [][]string{{"MULTI"}, {"SET", "m", v1}} {
		r.do(args...)
	}
	if got := r.do("EXEC"); got != "*1\r\n+OK\r\n" {
		t.Fatalf("EXEC: %q", got)
	}
	check("m", v1)
	if n := infoInt(t, r, "gd2fs_sets_into_dram"); n != 4 {
		t.Fatalf("gd2fs_sets_into_dram = %d, want 4 (k, a, b, k; not NX's, not MULTI's)", n)
	}

	used := infoInt(t, r, "used_memory")
	// Gone in the middle of the value.
	g := dial(t, c.RESP[0].Addr())
	raw := encode("SET", "half", v1)
	g.send(raw[:len(raw)/2])
	g.nc.Close()
	// The protocol broken after the value: no CRLF.
	b := dial(t, c.RESP[0].Addr())
	raw = encode("SET", "nocrlf", v1)
	raw[len(raw)-2] = 'x'
	b.send(raw)
	if got := b.reply(); got[0] != '-' {
		t.Fatalf("a value not followed by CRLF: %q", got)
	}
	testutil.Eventually(t, 10*time.Second, func() (bool, string) {
		now := infoInt(t, r, "used_memory")
		return now == used, fmt.Sprintf("used_memory %d, %d before the broken SETs", now, used)
	})
	for _, k := range []string{"half", "nocrlf"} {
		if got := r.do("EXISTS", k); got != ":0\r\n" {
			t.Fatalf("EXISTS %s after a broken SET: %q", k, got)
		}
	}
}
