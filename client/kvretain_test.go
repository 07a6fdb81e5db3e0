package client_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/gd2fs/gd2fs/client"
	"github.com/gd2fs/gd2fs/errs"
)

// TestKVRetain: pins, priorities and TTLs through the SDK on a real
// cluster, in a one-copy and a three-copy pool: what Retain sets Retention
// reads back from the owner; a TTL of 0 deletes; a pin beyond a server's
// quota is refused with ErrNoSpace; a prefix pin reaches every server;
// PutWith applies its Retain; Exists never changes retention.
func TestKVRetain(t *testing.T) {
	c := startKV(t, 3)
	cl := c.Client()
	defer cl.Close()
	ctx := context.Background()
	for _, pool := range []string{"perf", "ha"} {
		t.Run(pool, func(t *testing.T) {
			kv := cl.KV(pool)
			if err := kv.Put(ctx, "sys/0", rnd(64<<10, 1)); err != nil {
				t.Fatal(err)
			}
			r, gone, err := kv.Retain(ctx, "sys/0", client.RetainOptions{Pin: "dram", SetPriority: true, Priority: 3, SetTTL: true, TTL: time.Hour})
			if err != nil || gone || r.Pin != "dram" || r.Priority != 3 || r.TTL <= 59*time.Minute || r.TTL > time.Hour {
				t.Fatalf("retain: %+v gone=%v %v", r, gone, err)
			}
			if ok, err := kv.Exists(ctx, "sys/0"); !ok || err != nil {
				t.Fatalf("exists: %v %v", ok, err)
			}
			if r2, err := kv.Retention(ctx, "sys/0"); err != nil || r2.Pin != "dram" || r2.Priority != 3 || r2.TTL <= 0 {
				t.Fatalf("retention after exists: %+v %v", r2, err)
			}
			// The longest Duration would wrap to a negative TTL when rounded
			// up to ms: it is kept as limits.MaxTTL, the block stays.
			if r, gone, err := kv.Retain(ctx, "sys/0", client.RetainOptions{SetTTL: true, TTL: time.Duration(math.MaxInt64)}); err != nil || gone || r.TTL < 50*365*24*time.Hour {
				t.Fatalf("longest TTL: %+v gone=%v %v", r, gone, err)
			}
			if r, _, err := kv.Retain(ctx, "sys/0", client.RetainOptions{Pin: "none", Persist: true}); err != nil || r.Pin != "" || r.TTL != 0 {
				t.Fatalf("unpin and persist: %+v %v", r, err)
			}
			if _, gone, err := kv.Retain(ctx, "sys/0", client.RetainOptions{SetTTL: true, TTL: 0}); err != nil || !gone {
				t.Fatalf("TTL 0: gone=%v %v", gone, err)
			}
			if _, err := kv.Get(ctx, "sys/0"); !errors.Is(err, errs.ErrNotFound) {
				t.Fatalf("get after TTL 0: %v", err)
			}
			if _, _, err := kv.Retain(ctx, "nope", client.RetainOptions{Pin: "disk"}); !errors.Is(err, errs.ErrNotFound) {
				t.Fatalf("retain of a missing key: %v", err)
			}
			if _, _, err := kv.Retain(ctx, "x", client.RetainOptions{Pin: "ssd"}); !errors.Is(err, errs.ErrBadRequest) {
				t.Fatalf("bad pin tier: %v", err)
			}
			// 8 MiB of DRAM per server: a quarter (2 MiB) may be pinned.
			// 40 blocks of 256 KiB over 3 servers: some server's quota fills.
			var full error
			for i := 0; i < 40 && full == nil; i++ {
				k := fmt.Sprint("big/", i)
				_, full = kv.PutWith(ctx, k, rnd(256<<10, uint64(i)), client.PutOptions{Retain: client.RetainOptions{Pin: "dram"}})
			}
			if !errors.Is(full, errs.ErrNoSpace) {
				t.Fatalf("pins past every quota: %v, want ErrNoSpace", full)
			}
			if _, err := kv.RetainPrefix(ctx, "big/", client.RetainOptions{Pin: "none"}); err != nil {
				t.Fatal(err)
			}
			for i := 0; i < 5; i++ {
				if err := kv.Put(ctx, fmt.Sprint("chain/", i), rnd(1000, uint64(i))); err != nil {
					t.Fatal(err)
				}
			}
			n, err := kv.RetainPrefix(ctx, "chain/", client.RetainOptions{Pin: "disk"})
			want := int64(5)
			if pool == "ha" {
				want = 15 // every copy
			}
			if err != nil || n != want {
				t.Fatalf("prefix pin: %d blocks, %v; want %d", n, err, want)
			}
			if r, err := kv.Retention(ctx, "chain/3"); err != nil || r.Pin != "disk" {
				t.Fatalf("chain/3 after the prefix pin: %+v %v", r, err)
			}
		})
	}
}
