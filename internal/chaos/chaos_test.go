package chaos

import (
	"bytes"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/gd2fs/gd2fs/errs"
)

// The content model must give the same bytes for a range whatever offset a
// read starts at, and firstDiff must find the first changed byte.
func TestContentModel(t *testing.T) {
	whole := make([]byte, 1000)
	fill(7, "/a", 0, whole)
	for _, off := range []int64{0, 1, 7, 8, 9, 500, 993} {
		part := make([]byte, 1000-off)
		fill(7, "/a", off, part)
		if !bytes.Equal(part, whole[off:]) {
			t.Fatalf("fill at %d differs from the whole", off)
		}
		if i := firstDiff(7, "/a", off, part); i != -1 {
			t.Fatalf("firstDiff of right bytes at %d = %d", off, i)
		}
	}
	bad := append([]byte(nil), whole...)
	bad[321] ^= 1
	if i := firstDiff(7, "/a", 0, bad); i != 321 {
		t.Fatalf("firstDiff = %d, want 321", i)
	}
	other := make([]byte, 64)
	fill(7, "/b", 0, other)
	if bytes.Equal(other, whole[:64]) {
		t.Fatal("two keys have the same content")
	}
	for i := 0; i < 100; i++ {
		if n := sizeOf(1, string(rune('a'+i)), 10, 20); n < 10 || n > 20 {
			t.Fatalf("sizeOf out of range: %d", n)
		}
	}
}

func echoServer(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { io.Copy(c, c); c.Close() }()
		}
	}()
	return ln.Addr().String()
}

// The proxy forwards, holds bytes while blackholed and lets them through on
// heal, and resets connections when told to.
func TestProxy(t *testing.T) {
	p, err := NewProxy("127.0.0.1:0", echoServer(t))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	roundTrip := func(msg string) {
		t.Helper()
		if _, err := c.Write([]byte(msg)); err != nil {
			t.Fatal(err)
		}
		got := make([]byte, len(msg))
		if _, err := io.ReadFull(c, got); err != nil || string(got) != msg {
			t.Fatalf("echo %q: %q %v", msg, got, err)
		}
	}
	roundTrip("hello")

	p.SetBlackhole(true)
	c.Write([]byte("held"))
	c.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	if n, err := c.Read(make([]byte, 4)); err == nil {
		t.Fatalf("read %d bytes through a blackhole", n)
	}
	c.SetReadDeadline(time.Time{})
	p.Heal()
	got := make([]byte, 4)
	if _, err := io.ReadFull(c, got); err != nil || string(got) != "held" {
		t.Fatalf("after heal: %q %v", got, err)
	}

	p.SetDelay(time.Millisecond)
	roundTrip("slow")
	p.SetResetRate(1)
	c.Write([]byte("x"))
	if _, err := io.ReadFull(c, make([]byte, 1)); err == nil {
		t.Fatal("a reset connection answered")
	}
	if p.Resets.Load() == 0 {
		t.Fatal("no reset counted")
	}
}

func TestSchedule(t *testing.T) {
	a := schedule([]string{"kill", "pause", "loss"}, 4, 9, time.Minute, 5*time.Second, 3*time.Second)
	b := schedule([]string{"kill", "pause", "loss"}, 4, 9, time.Minute, 5*time.Second, 3*time.Second)
	if len(a) != 7 {
		t.Fatalf("%d steps in a minute of 8 s steps, want 7", len(a))
	}
	for i := range a {
		if a[i].fault != b[i].fault || a[i].victim != b[i].victim {
			t.Fatalf("step %d differs between runs with one seed", i)
		}
	}
	if a[0].fault != "kill" || a[3].fault != "kill" || a[2].victim != "all servers" {
		t.Fatalf("schedule %+v", a[:4])
	}
}

// TestTopErrorsNamesRareKinds: the report's error table names the most
// frequent messages and also the most frequent one of every other kind and
// outcome, with the fault it was first seen in (issue 29: one failed
// session turn among hundreds of KV errors was counted but never named).
func TestTopErrorsNamesRareKinds(t *testing.T) {
	s := newStats()
	now := time.Now()
	for i := range 30 { // 30 different KV messages, each more frequent than the turn
		for range 2 {
			s.record(KVGet, Unavailable, now, errs.New(errs.ErrUnavailable, "no owner answered %s", strings.Repeat("x", i)), "")
		}
	}
	s.faultStart("10. kill s3")
	s.record(SessionPlan, Unavailable, now, errors.New("load: server gone"), "")
	rows := s.topErrors(25)
	if len(rows) != 26 {
		t.Fatalf("%d rows, want the 25 most frequent and the session turn", len(rows))
	}
	last := rows[25]
	if last[0] != "session plan+load" || last[1] != "unavailable" || last[3] != "1" || last[4] != "during 10. kill s3" {
		t.Fatalf("the rare kind's row: %q", last)
	}
	for _, r := range rows[:25] {
		if r[0] != "kv get" || r[3] != "2" || r[4] != "before any fault" {
			t.Fatalf("a top row: %q", r)
		}
	}
}
