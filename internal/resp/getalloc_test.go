package resp_test

import (
	"bytes"
	"fmt"
	"io"
	"runtime"
	"strconv"
	"testing"
	"time"
)

// TestRemoteGetNoAlloc: a GET of a value another server owns is read into
// a pooled buffer, not a new slice per request (1 MiB values: a new slice
// each is 1 MiB allocated, zeroed and collected per GET, which cost more
// than the copy off the socket). Allocation is counted, not timed.
func TestRemoteGetNoAlloc(t *testing.T) {
	c := startCluster(t, 2, "")
	r := dial(t, c.RESP[0].Addr())
	value := bytes.Repeat([]byte("0123456789abcdef"), 1<<16) // 1 MiB
	const keys = 16
	for i := range keys {
		if got := r.do("SET", fmt.Sprintf("k%d", i), string(value)); got != "+OK\r\n" {
			t.Fatalf("SET k%d: %q", i, got)
		}
	}
	buf := make([]byte, len(value)+2)
	get := func(i int) {
		t.Helper()
		r.send(encode("GET", fmt.Sprintf("k%d", i)))
		r.nc.SetDeadline(time.Now().Add(60 * time.Second))
		line, err := r.br.ReadSlice('\n')
		if err != nil {
			t.Fatal(err)
		}
		if n, err := strconv.Atoi(string(bytes.TrimSpace(line[1:]))); line[0] != '$' || err != nil || n != len(value) {
			t.Fatalf("GET k%d answered %q", i, line)
		}
		if _, err := io.ReadFull(r.br, buf); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(buf[:len(value)], value) || string(buf[len(value):]) != "\r\n" {
			t.Fatalf("GET k%d returned other bytes", i)
		}
	}
	for i := range keys { // the first read of a size learns it
		get(i)
	}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	const rounds = 3
	for range rounds {
		for i := range keys {
			get(i)
		}
	}
	runtime.ReadMemStats(&after)
	// About half the keys live on the other server; a slice per GET of
	// those would be at least rounds*keys/2 MiB.
	if got, limit := after.TotalAlloc-before.TotalAlloc, uint64(rounds*keys)<<20/8; got > limit {
		t.Fatalf("%d GETs of 1 MiB values allocated %d bytes (more than %d): remote values are read into new slices", rounds*keys, got, limit)
	}
}
