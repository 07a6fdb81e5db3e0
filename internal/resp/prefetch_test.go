package resp_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/gd2fs/gd2fs/internal/cluster"
	"github.com/gd2fs/gd2fs/internal/kvstore"
	"github.com/gd2fs/gd2fs/internal/testutil"
)

// TestEXISTSPrefetch: LMCache's pattern (EXISTS <chunk>metadata, then GET
// of <chunk>metadata and <chunk>kv_bytes) against a server whose DRAM tier
// holds a fraction of the chunks. With the door's prefetch "lmcache" an
// EXISTS hit brings the chunk's kv_bytes from disk to DRAM and the GET is
// a DRAM hit; with "off" the block stays on disk. Prefetch pins nothing
// and counts no read.
func TestEXISTSPrefetch(t *testing.T) {
	for _, mode := range []string{"off", "lmcache"} {
		t.Run(mode, func(t *testing.T) {
			ctx := context.Background()
			c, err := cluster.Start(ctx, cluster.Config{Dir: t.TempDir(), Servers: 1, MemBytes: 8 << 20, KVMemBytes: 4 << 20,
				KVDiskBytes: 256 << 20, RESP: true, RESPPrefetch: mode})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { c.Close() })
			r := dial(t, c.RESP[0].Addr())
			big := strings.Repeat("x", 256<<10)
			for i := 0; i < 64; i++ { // 16 MiB of kv_bytes through 4 MiB of DRAM
				eq(t, "SET metadata", r.do("SET", fmt.Sprintf("c%dmetadata", i), "m"), "+OK\r\n")
				eq(t, "SET kv_bytes", r.do("SET", fmt.Sprintf("c%dkv_bytes", i), big), "+OK\r\n")
			}
			kv := c.Servers[0].KV()
			tier := func(k string) kvstore.Tier {
				tr, _ := kv.Exists(append([]byte("perf\x00"), k...))
				return tr
			}
			if tier("c0kv_bytes") != kvstore.TierDisk {
				t.Fatalf("c0kv_bytes in %v before the probe: the test needs it on disk", tier("c0kv_bytes"))
			}
			before := kv.Stats()
			eq(t, "EXISTS", r.do("EXISTS", "c0metadata"), ":1\r\n")
			if mode == "off" {
				if got := tier("c0kv_bytes"); got != kvstore.TierDisk {
					t.Fatalf("without prefetch c0kv_bytes moved to %v", got)
				}
				return
			}
			testutil.Eventually(t, 10*time.Second, func() (bool, string) {
				return tier("c0kv_bytes") == kvstore.TierDRAM, fmt.Sprintf("c0kv_bytes in %v", tier("c0kv_bytes"))
			})
			mid := kv.Stats()
			if mid.MemHits != before.MemHits || mid.DiskHits != before.DiskHits || mid.PinnedKeys != 0 {
				t.Fatalf("the prefetch counted a read or pinned: %+v -> %+v", before, mid)
			}
			eq(t, "GET kv_bytes", r.do("GET", "c0kv_bytes"), bulk(big))
			if after := kv.Stats(); after.MemHits != mid.MemHits+1 || after.DiskHits != mid.DiskHits {
				t.Fatalf("the GET after the prefetch: %d DRAM and %d disk hits, want one DRAM hit", after.MemHits-mid.MemHits, after.DiskHits-mid.DiskHits)
			}
		})
	}
}
