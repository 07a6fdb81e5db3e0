package node

import (
	"context"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/gd2fs/gd2fs/client"
	"github.com/gd2fs/gd2fs/internal/cold"
	"github.com/gd2fs/gd2fs/internal/kvstore"
	"github.com/gd2fs/gd2fs/internal/server"
	"github.com/gd2fs/gd2fs/internal/store"
)

// TestServerConfig: every figure of the description lands in its place of
// the server's configuration.
func TestServerConfig(t *testing.T) {
	cc := &cold.Config{Endpoint: "http://127.0.0.1:9"}
	got := Server{ID: "s1", Listen: "127.0.0.1:0", Advertise: "a:1", Master: "http://m", Token: "t",
		Mem: 1, Dir: "/d", Disk: 2, Sync: store.SyncAlways, Prefault: true,
		KVMem: 3, KVDir: "/k", KVDisk: 4, KVMaxValue: 5, KVPolicy: "lru",
		Cold: cc, Heartbeat: time.Second, ForwardTimeout: 2 * time.Second, MaxConns: 6, MaxConnsPerIP: 7, Debug: true}.Config()
	want := server.Config{ID: "s1", Listen: "127.0.0.1:0", Advertise: "a:1", Master: "http://m", Token: "t",
		Store: store.Config{MemBytes: 1, Dir: "/d", DiskBytes: 2, Sync: store.SyncAlways, Prefault: true},
		KV:    kvstore.Config{MemBytes: 3, Dir: "/k", DiskBytes: 4, MaxValue: 5, Policy: "lru", Prefault: true},
		Cold:  cc, Heartbeat: time.Second, ForwardTimeout: 2 * time.Second, MaxConns: 6, MaxConnsPerIP: 7, Debug: true}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("Config:\n got %+v\nwant %+v", got, want)
	}
}

// TestBuild: a master and a server built from descriptions run, and the
// server registers.
func TestBuild(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	dir := t.TempDir()
	m, ms, err := NewMaster(ctx, Master{Listen: "127.0.0.1:0", Meta: "sqlite://" + filepath.Join(dir, "meta.db"), DownAfter: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer ms.Close()
	defer m.Close()
	go m.Run(ctx)
	s, err := NewServer(Server{Listen: "127.0.0.1:0", Master: m.URL(), Mem: 1 << 20, Dir: filepath.Join(dir, "s"), Disk: 16 << 20,
		KVMem: 1 << 20, Heartbeat: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	go s.Run(ctx)
	cl, err := client.New(client.Config{Master: m.URL()})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	for {
		st, err := cl.Status(ctx)
		if err == nil && len(st.Servers) == 1 && st.Servers[0].ID == s.ID() && st.Servers[0].State == "up" {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the server never registered with the master: %+v, %v", st, err)
		case <-time.After(10 * time.Millisecond): // polling the master, not synchronising goroutines
		}
	}
	if s.KV() == nil {
		t.Fatal("a server described with a KV tier has none")
	}
	if _, _, err := NewMaster(ctx, Master{Meta: "nosuch://x"}); err == nil {
		t.Fatal("a master on an unknown metadata store started")
	}
}
