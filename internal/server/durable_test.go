package server_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"testing"

	"github.com/gd2fs/gd2fs/client"
	"github.com/gd2fs/gd2fs/internal/cluster"
	"github.com/gd2fs/gd2fs/internal/store"
	"github.com/gd2fs/gd2fs/internal/testutil"
)

// TestSyncPolicy runs a 3-server cluster on real sockets and disks under
// each policy and counts the fdatasyncs every server ran for an ha file and
// for a perf file: by default every replica of an ha chunk syncs and a perf
// write syncs nowhere; "always" syncs perf writes too; "never" syncs
// nothing. The files read back either way.
func TestSyncPolicy(t *testing.T) {
	for _, tc := range []struct {
		policy    store.SyncPolicy
		haSyncs   bool // every server that holds an ha chunk synced
		perfSyncs bool
	}{
		{store.SyncReplicated, true, false},
		{store.SyncAlways, true, true},
		{store.SyncNever, false, false},
	} {
		t.Run(tc.policy.String(), func(t *testing.T) {
			c, err := cluster.Start(context.Background(), cluster.Config{Dir: t.TempDir(), MemBytes: 8 << 20, DiskBytes: 256 << 20, Sync: tc.policy})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			cl := c.Client()
			defer cl.Close()
			syncs := func() (n []uint64) {
				for _, s := range c.Servers {
					n = append(n, s.Store().Stats().Syncs)
				}
				return n
			}
			for _, pool := range []string{"perf", "ha"} {
				before := syncs()
				// One chunk: its primary and both replicas must each sync
				// (a primary that did not pass FlagSync on would leave 1).
				data := testutil.RandomBytes(700_001, 9)
				p := "/sync/" + pool
				f, err := cl.Create(context.Background(), p, client.CreateOptions{Pool: pool, ChunkSize: 1 << 20})
				if err != nil {
					t.Fatal(err)
				}
				if _, err := f.Write(data); err != nil {
					t.Fatal(err)
				}
				if err := f.Close(); err != nil {
					t.Fatal(err)
				}
				after := syncs()
				synced := 0
				for i := range after {
					if after[i] > before[i] {
						synced++
					}
				}
				want := 0
				if pool == "ha" && tc.haSyncs {
					want = len(c.Servers) // its 3 replicas are the 3 servers
				}
				if pool == "perf" && tc.perfSyncs {
					want = 1
				}
				if synced != want {
					t.Errorf("%s file: %d servers synced (%v → %v), want %d", pool, synced, before, after, want)
				}
				r, err := cl.Open(context.Background(), p)
				if err != nil {
					t.Fatal(err)
				}
				got, err := io.ReadAll(io.NewSectionReader(r, 0, r.Size()))
				r.Close()
				if err != nil || !bytes.Equal(got, data) {
					t.Fatal(fmt.Errorf("%s file reads back wrong: %v", pool, err))
				}
			}
		})
	}
}
