package client_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/gd2fs/gd2fs/client"
	"github.com/gd2fs/gd2fs/internal/master"
	"github.com/gd2fs/gd2fs/internal/meta"
	"github.com/gd2fs/gd2fs/internal/meta/metatest"
	"github.com/gd2fs/gd2fs/internal/server"
	"github.com/gd2fs/gd2fs/internal/store"
	"github.com/gd2fs/gd2fs/internal/testutil"
)

// TestMasterFailover runs two masters on one PostgreSQL database: one leads,
// the other answers as a standby. When the leader stops, the standby takes
// over; servers and clients that list both masters carry on, and nothing
// stored is lost.
func TestMasterFailover(t *testing.T) {
	dsn := metatest.PostgresDSN(t)
	ctx := context.Background()
	start := func() (*master.Master, meta.Store) {
		ms, err := meta.Open(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ms.Close() })
		m, err := master.New(ctx, master.Config{Listen: "127.0.0.1:0", Meta: ms, DownAfter: time.Second, RepairAfter: -1, Log: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		go m.Run(ctx)
		t.Cleanup(func() { m.Close() })
		return m, ms
	}
	m1, ms1 := start()
	m2, _ := start()
	if !m1.Leader() || m2.Leader() {
		t.Fatalf("leader m1=%v m2=%v", m1.Leader(), m2.Leader())
	}
	masters := m2.URL() + "," + m1.URL() // the standby first: the client must move on
	for i := 0; i < 3; i++ {
		s, err := server.New(server.Config{Listen: "127.0.0.1:0", Master: masters, Heartbeat: 100 * time.Millisecond,
			Store: store.Config{MemBytes: 16 << 20, Dir: filepath.Join(t.TempDir(), "s"), DiskBytes: 64 << 20}})
		if err != nil {
			t.Fatal(err)
		}
		go s.Run(ctx)
		t.Cleanup(func() { s.Close() })
	}
	cl, err := client.New(client.Config{Master: masters, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	waitServersUp(t, cl, 3)
	data := rnd(3<<20, 99)
	writeFile(t, cl, "/ha/file", "ha", data)
	// A session's turns, on framed connections to the leader (the standby,
	// first in the list, refuses the upgrade as it refuses any call).
	ss := cl.Sessions()
	if err := ss.SetLayout(ctx, tiny); err != nil {
		t.Fatal(err)
	}
	turn := func(tokens int64) client.Plan {
		t.Helper()
		p, err := ss.Plan(ctx, "chat", client.PlanRequest{Model: "tiny", TokenIDs: seq(1, tokens)})
		if err != nil {
			t.Fatal(err)
		}
		var fresh []byte
		for _, fr := range p.Fresh {
			fresh = append(fresh, kvBytes("chat", fr.TokenStart, fr.TokenLength)...)
		}
		if _, err := ss.WriteAndCommit(ctx, "chat", p, fresh); err != nil {
			t.Fatal(err)
		}
		return p
	}
	turn(40)

	m1.Close() // the leader goes away, and with its process its database session and lock
	ms1.Close()
	// The standby takes over within a few of its ticks; the servers find it.
	testutil.Eventually(t, 20*time.Second, func() (bool, string) { return m2.Leader(), "standby did not take over" })
	waitServersUp(t, cl, 3)
	if got, err := readFile(t, cl, "/ha/file"); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read after failover: %v", err)
	}
	writeFile(t, cl, "/ha/after", "perf", data[:1000])
	// The framed connections to the old leader are gone; the next turn
	// goes to the new one and finds the first turn's KV.
	if p := turn(80); p.CachedTokens != 40 {
		t.Fatalf("a turn after the failover: %d tokens cached, want the first turn's 40", p.CachedTokens)
	}
}

func waitServersUp(t *testing.T, cl *client.Client, n int) {
	t.Helper()
	testutil.Eventually(t, 20*time.Second, func() (bool, string) {
		st, err := cl.Status(context.Background())
		up := testutil.UpServers(st)
		return err == nil && up >= n, fmt.Sprintf("%d servers up, want %d (%v)", up, n, err)
	})
}
