package server

import (
	"context"
	"testing"
	"time"

	"github.com/gd2fs/gd2fs/internal/kvstore"
	"github.com/gd2fs/gd2fs/internal/store"
	"github.com/gd2fs/gd2fs/internal/wire"
)

// TestRetentionThroughPeers: the retention a server reads of a block
// another server holds, before a membership move copies it, comes through
// its PeerTransport as that server answers it (RetainOf): pin, priority and
// TTL, and "none" for a block without any.
func TestRetentionThroughPeers(t *testing.T) {
	var srv [2]*Server
	for i := range srv {
		s, err := New(Config{Listen: "127.0.0.1:0", Token: "tok", Store: store.Config{MemBytes: 8 << 20}, KV: kvstore.Config{MemBytes: 8 << 20}})
		if err != nil {
			t.Fatal(err)
		}
		go s.Run(context.Background())
		t.Cleanup(func() { s.Close() })
		srv[i] = s
	}
	ref := wire.KVRef{Pool: "perf", Key: []byte("kept")}
	plain := wire.KVRef{Pool: "perf", Key: []byte("plain")}
	kv := srv[1].KV()
	for _, r := range []wire.KVRef{ref, plain} {
		if _, err := kv.Put(kvKey(r), []byte("v"), false); err != nil {
			t.Fatal(err)
		}
	}
	exp := kv.Now().Add(time.Hour)
	if _, err := kv.Retain(kvKey(ref), kvstore.Change{SetPin: true, Pin: kvstore.TierDRAM, SetPriority: true, Priority: 3, SetExpire: true, Expire: exp}); err != nil {
		t.Fatal(err)
	}
	for _, r := range []wire.KVRef{ref, plain} {
		got, err := srv[0].kvRetentionAt(srv[1].Addr(), 0, r)
		if err != nil {
			t.Fatal(err)
		}
		held, _ := kv.Retention(kvKey(r))
		want := RetainOf(held, kv.Now())
		// The TTL left shrinks between the two readings: compare it within
		// the time the test has taken, the rest exactly.
		if got.Set != want.Set || got.Pin != want.Pin || got.Priority != want.Priority ||
			(want.TTL < 0) != (got.TTL < 0) || want.TTL >= 0 && (got.TTL < want.TTL || got.TTL > time.Hour.Milliseconds()) {
			t.Fatalf("retention of %s through the peers: %+v; the holder answers %+v", r.Key, got, want)
		}
	}
	if _, err := srv[0].kvRetentionAt(srv[1].Addr(), 0, wire.KVRef{Pool: "perf", Key: []byte("none")}); err == nil {
		t.Fatal("retention of a block the peer lacks: no error")
	}
}
