package client_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/gd2fs/gd2fs/client"
	"github.com/gd2fs/gd2fs/errs"
	"github.com/gd2fs/gd2fs/internal/cluster"
	"github.com/gd2fs/gd2fs/internal/crc32c"
	"github.com/gd2fs/gd2fs/internal/store"
	"github.com/gd2fs/gd2fs/internal/testutil"
	"github.com/gd2fs/gd2fs/internal/wire"
)

func start(t *testing.T, cfg cluster.Config) *cluster.Cluster {
	t.Helper()
	if cfg.Dir == "" {
		cfg.Dir = t.TempDir()
	}
	if cfg.MemBytes == 0 {
		cfg.MemBytes = 8 << 20
	}
	if cfg.DiskBytes == 0 {
		cfg.DiskBytes = 256 << 20
	}
	c, err := cluster.Start(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func rnd(n int, seed uint64) []byte { return testutil.RandomBytes(n, seed) }

func writeFile(t *testing.T, cl *client.Client, path, pool string, data []byte) {
	t.Helper()
	ctx := context.Background()
	f, err := cl.Create(ctx, path, client.CreateOptions{Pool: pool, ChunkSize: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	// Unaligned appends exercise piece splitting across chunk boundaries.
	for off := 0; off < len(data); {
		n := min(len(data)-off, 700_001)
		if _, err := f.Write(data[off : off+n]); err != nil {
			t.Fatal(err)
		}
		off += n
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

func readFile(t *testing.T, cl *client.Client, path string) ([]byte, error) {
	t.Helper()
	f, err := cl.Open(context.Background(), path)
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	_, err = f.WriteTo(&buf)
	return buf.Bytes(), err
}

func TestFilesRoundTrip(t *testing.T) {
	c := start(t, cluster.Config{})
	cl := c.Client()
	defer cl.Close()
	ctx := context.Background()
	for _, pool := range []string{"perf", "ha"} {
		data := rnd(5<<20+12345, 1)
		path := "/models/m/" + pool + ".bin"
		writeFile(t, cl, path, pool, data)
		got, err := readFile(t, cl, path)
		if err != nil || !bytes.Equal(got, data) {
			t.Fatalf("%s: read back differs (%v)", pool, err)
		}
		st, err := cl.Stat(ctx, path)
		if err != nil || st.Size != int64(len(data)) || !st.Sealed || st.Pool != pool || len(st.Chunks) != 6 {
			t.Fatalf("stat %+v %v", st, err)
		}
		want := map[string]int{"perf": 1, "ha": 3}[pool]
		servers := map[string]bool{}
		for _, ch := range st.Chunks {
			if len(ch.Replicas) != want {
				t.Fatalf("%s chunk has %d replicas", pool, len(ch.Replicas))
			}
			seen := map[string]bool{}
			for _, r := range ch.Replicas {
				if seen[r.Server] {
					t.Fatalf("two replicas on %s", r.Server)
				}
				seen[r.Server] = true
				servers[r.Server] = true
			}
		}
		if len(servers) < 2 {
			t.Errorf("%s: 6 chunks all on one server: placement does not spread", pool)
		}
		// Random ranged reads straight into caller buffers.
		f, _ := cl.Open(ctx, path)
		r := rand.New(rand.NewPCG(3, 3))
		for i := 0; i < 20; i++ {
			off := r.IntN(len(data))
			n := r.IntN(len(data) - off)
			buf := make([]byte, n)
			if _, err := f.ReadAt(buf, int64(off)); err != nil || !bytes.Equal(buf, data[off:off+n]) {
				t.Fatalf("ReadAt(%d, %d): %v", off, n, err)
			}
		}
		if n, err := f.ReadAt(make([]byte, 10), int64(len(data)-5)); n != 5 || err != io.EOF {
			t.Fatalf("read past end: %d %v", n, err)
		}
	}
	ls, err := cl.List(ctx, "/models/m")
	if err != nil || len(ls) != 2 || ls[0].Path != "/models/m/ha.bin" {
		t.Fatalf("list %+v %v", ls, err)
	}
	if root, err := cl.List(ctx, "/"); err != nil || len(root) != 1 || !root[0].IsDir {
		t.Fatalf("list / %+v %v", root, err)
	}
	if err := cl.Remove(ctx, "/models/m/ha.bin"); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.Stat(ctx, "/models/m/ha.bin"); !errors.Is(err, errs.ErrNotFound) {
		t.Fatalf("stat removed: %v", err)
	}
	// The servers drop the removed file's chunks after a heartbeat or two.
	testutil.Eventually(t, 10*time.Second, func() (bool, string) {
		total := 0
		for _, s := range c.Servers {
			total += s.Store().Usage().Chunks
		}
		// The perf file's chunks remain.
		return total == 6, fmt.Sprintf("servers still hold %d chunks after remove", total)
	})
}

func TestSparseWriteAtAndSync(t *testing.T) {
	c := start(t, cluster.Config{})
	cl := c.Client()
	defer cl.Close()
	ctx := context.Background()
	f, err := cl.Create(ctx, "/sparse", client.CreateOptions{Pool: "ha", ChunkSize: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	a, b := rnd(1000, 4), rnd(5000, 5)
	f.WriteAt(b, 3<<20+100) // chunk 3; chunks 1 and 2 stay holes
	f.WriteAt(a, 10)
	if err := f.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	g, err := cl.Open(ctx, "/sparse")
	if err != nil {
		t.Fatal(err)
	}
	want := make([]byte, 3<<20+100+5000)
	copy(want[10:], a)
	copy(want[3<<20+100:], b)
	got := make([]byte, len(want))
	if _, err := g.ReadAt(got, 0); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("sparse read differs: %v", err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("x"), 0); !errors.Is(err, errs.ErrSealed) {
		t.Fatalf("write after close: %v", err)
	}
	h, _ := cl.Open(ctx, "/sparse")
	if _, err := h.WriteAt([]byte("x"), 0); !errors.Is(err, errs.ErrSealed) {
		t.Fatalf("write to sealed file: %v", err)
	}
}

func TestErrors(t *testing.T) {
	c := start(t, cluster.Config{DiskBytes: 4 << 20, MemBytes: 1 << 20})
	cl := c.Client()
	defer cl.Close()
	ctx := context.Background()
	if _, err := cl.Open(ctx, "/nope"); !errors.Is(err, errs.ErrNotFound) {
		t.Fatalf("unknown path: %v", err)
	}
	if _, err := cl.Create(ctx, "/x", client.CreateOptions{Pool: "gold"}); !errors.Is(err, errs.ErrNotFound) {
		t.Fatalf("unknown pool: %v", err)
	}
	if _, err := cl.Create(ctx, "/x", client.CreateOptions{ChunkSize: 1000}); !errors.Is(err, errs.ErrBadRequest) {
		t.Fatalf("bad chunk size: %v", err)
	}
	if _, err := cl.Create(ctx, "/../etc", client.CreateOptions{}); !errors.Is(err, errs.ErrBadRequest) {
		t.Fatalf("dotdot: %v", err)
	}
	writeFile(t, cl, "/keep", "ha", rnd(1<<20, 7))
	if _, err := cl.Create(ctx, "/keep", client.CreateOptions{}); !errors.Is(err, errs.ErrExists) {
		t.Fatalf("existing: %v", err)
	}
	// Fill the disk tiers: a clear no-space error, and nothing stored is lost.
	f, _ := cl.Create(ctx, "/big", client.CreateOptions{Pool: "ha", ChunkSize: 1 << 20})
	_, err := f.WriteAt(rnd(8<<20, 8), 0)
	if !errors.Is(err, errs.ErrNoSpace) && !errors.Is(err, errs.ErrUnavailable) {
		t.Fatalf("full disk: %v", err)
	}
	if got, err := readFile(t, cl, "/keep"); err != nil || !bytes.Equal(got, rnd(1<<20, 7)) {
		t.Fatalf("stored file damaged after a full-disk error: %v", err)
	}
	if err := cl.Remove(ctx, "/"); !errors.Is(err, errs.ErrBadRequest) {
		t.Fatalf("remove root: %v", err)
	}
}

func TestTokenAndHandshake(t *testing.T) {
	c := start(t, cluster.Config{Token: "s3cret"})
	good := c.Client()
	defer good.Close()
	writeFile(t, good, "/t", "perf", []byte("hello"))
	bad, _ := client.New(client.Config{Master: c.Master.URL(), Token: "wrong"})
	defer bad.Close()
	if _, err := bad.Stat(context.Background(), "/t"); !errors.Is(err, errs.ErrUnauthorized) {
		t.Fatalf("master with wrong token: %v", err)
	}
	// Straight to a server with a wrong token, bypassing the master.
	st, _ := good.Stat(context.Background(), "/t")
	addr := st.Chunks[0].Replicas[0].Addr
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	var hb [wire.HeaderSize]byte
	tok := []byte("wrong")
	h := wire.Header{Op: wire.OpHello, PayloadLen: uint32(len(tok)), PayloadCRC: crc32c.Checksum(tok)}
	nc.Write(wire.Encode(hb[:], &h, nil))
	nc.Write(tok)
	r := wire.NewReader(nc, wire.DefaultLimits())
	resp, _, err := r.Next()
	if err != nil || resp.Status != wire.StatusUnauthorized {
		t.Fatalf("server answered %+v %v to a wrong token", resp, err)
	}
	// An older protocol version is refused with a version error.
	nc2, _ := net.Dial("tcp", addr)
	defer nc2.Close()
	h = wire.Header{Op: wire.OpHello, Version: 9}
	nc2.Write(wire.Encode(hb[:], &h, nil))
	resp, _, _ = wire.NewReader(nc2, wire.DefaultLimits()).Next()
	if resp.Status != wire.StatusVersion {
		t.Fatalf("server answered %+v to version 9", resp)
	}
}

func TestBadFramesDoNotHurtOthers(t *testing.T) {
	c := start(t, cluster.Config{})
	cl := c.Client()
	defer cl.Close()
	data := rnd(3<<20, 11)
	writeFile(t, cl, "/d", "perf", data)
	addr := c.Servers[0].Addr()
	garbage := [][]byte{
		[]byte("GD2F garbage that is not a header at all......................"),
		bytes.Repeat([]byte{0xff}, 100),
		{'G', 'D', '2', 'F', 1},
	}
	for _, g := range garbage {
		nc, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		nc.Write(g)
		nc.(*net.TCPConn).CloseWrite()
		io.Copy(io.Discard, nc) // the server answers with an error or closes
		nc.Close()
	}
	// Unknown opcode and oversize read after a good handshake.
	nc, _ := net.Dial("tcp", addr)
	defer nc.Close()
	var hb [wire.HeaderSize]byte
	send := func(h wire.Header, key []byte) wire.Header {
		nc.Write(wire.Encode(hb[:], &h, key))
		nc.Write(key)
		return h
	}
	r := wire.NewReader(nc, wire.DefaultLimits())
	send(wire.Header{Op: wire.OpHello, ReqID: 1}, nil)
	if h, _, err := r.Next(); err != nil || h.Status != wire.StatusOK {
		t.Fatalf("hello: %+v %v", h, err)
	}
	r.Discard()
	key := wire.AppendChunkRef(nil, wire.ChunkRef{ID: 1})
	for _, tc := range []struct {
		h    wire.Header
		want wire.Status
	}{
		{wire.Header{Op: 99, ReqID: 2}, wire.StatusUnknownOp},
		{wire.Header{Op: wire.OpRead, ReqID: 3, Count: 1 << 40}, wire.StatusTooLarge},
		{wire.Header{Op: wire.OpRead, ReqID: 4, Count: 10}, wire.StatusNotFound},
	} {
		send(tc.h, key)
		h, _, err := r.Next()
		if err != nil || h.Status != tc.want || h.ReqID != tc.h.ReqID {
			t.Fatalf("op %v: got %+v %v, want %v", tc.h.Op, h, err, tc.want)
		}
		r.Discard()
	}
	// A write whose payload does not match its CRC is refused and stores nothing.
	payload := []byte("some bytes")
	h := wire.Header{Op: wire.OpWrite, ReqID: 5, PayloadLen: uint32(len(payload)), PayloadCRC: crc32c.Checksum(payload) ^ 1}
	wkey := wire.AppendChunkRef(nil, wire.ChunkRef{ID: 777})
	nc.Write(wire.Encode(hb[:], &h, wkey))
	nc.Write(wkey)
	nc.Write(payload)
	if resp, _, err := r.Next(); err != nil || resp.Status != wire.StatusChecksum {
		t.Fatalf("corrupt write: %+v %v", resp, err)
	}
	r.Discard()
	if _, err := c.Servers[0].Store().Stat(777); !errors.Is(err, errs.ErrNotFound) {
		t.Fatalf("a corrupt write left chunk 777: %v", err)
	}
	if got, err := readFile(t, cl, "/d"); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("server stopped serving after bad frames: %v", err)
	}
}

func TestReadFailoverAndPerfLoss(t *testing.T) {
	c := start(t, cluster.Config{Servers: 4})
	cl := c.Client()
	defer cl.Close()
	ctx := context.Background()
	ha, perf := rnd(4<<20, 21), rnd(4<<20, 22)
	writeFile(t, cl, "/ha", "ha", ha)
	writeFile(t, cl, "/perf", "perf", perf)
	st, _ := cl.Stat(ctx, "/perf")
	victim := st.Chunks[0].Replicas[0].Server
	for _, s := range c.Servers {
		if s.ID() == victim {
			s.Close()
		}
	}
	if got, err := readFile(t, cl, "/ha"); err != nil || !bytes.Equal(got, ha) {
		t.Fatalf("HA read with a server down: %v", err)
	}
	_, err := readFile(t, cl, "/perf")
	if !errors.Is(err, errs.ErrUnavailable) {
		t.Fatalf("perf read with its server down: %v", err)
	}
}

func TestRestartLosesNothing(t *testing.T) {
	dir := t.TempDir()
	c := start(t, cluster.Config{Dir: dir})
	cl := c.Client()
	data := rnd(3<<20, 31)
	writeFile(t, cl, "/keep/ha", "ha", data)
	writeFile(t, cl, "/keep/perf", "perf", data)
	cl.Close()
	c.Close()
	// While the cluster is down, a chunk no file uses appears on server-0's
	// disk (a copy abandoned half-way, a lost tombstone...).
	orphanDir := filepath.Join(dir, "server-0")
	st, err := store.Open(store.Config{Dir: orphanDir, DiskBytes: 256 << 20})
	if err != nil {
		t.Fatal(err)
	}
	st.Write(424242, 0, []byte("nobody's bytes"))
	st.Close()
	// A new master on the same SQLite file and servers on the same disk tiers.
	c2 := start(t, cluster.Config{Dir: dir})
	cl2 := c2.Client()
	defer cl2.Close()
	for _, p := range []string{"/keep/ha", "/keep/perf"} {
		if got, err := readFile(t, cl2, p); err != nil || !bytes.Equal(got, data) {
			t.Fatalf("%s after full restart: %v", p, err)
		}
	}
	// The restarted server reported what it held; the orphan goes.
	testutil.Eventually(t, 10*time.Second, func() (bool, string) {
		_, err := c2.Servers[0].Store().Stat(424242)
		return errors.Is(err, errs.ErrNotFound), "orphan chunk not deleted after restart"
	})
}

func TestRepairRestoresReplicas(t *testing.T) {
	c := start(t, cluster.Config{Servers: 4, DownAfter: 300 * time.Millisecond, RepairAfter: 300 * time.Millisecond})
	cl := c.Client()
	defer cl.Close()
	ctx := context.Background()
	data := rnd(3<<20, 41)
	writeFile(t, cl, "/r", "ha", data)
	st, _ := cl.Stat(ctx, "/r")
	victim := st.Chunks[0].Replicas[0].Server
	for _, s := range c.Servers {
		if s.ID() == victim {
			s.Close()
		}
	}
	testutil.Eventually(t, 20*time.Second, func() (bool, string) {
		st, err := cl.Stat(ctx, "/r")
		healthy := err == nil
		for _, ch := range st.Chunks {
			for _, r := range ch.Replicas {
				healthy = healthy && r.Up && r.Server != victim
			}
			healthy = healthy && len(ch.Replicas) == 3
		}
		return healthy, fmt.Sprintf("replicas not restored: %+v", st.Chunks)
	})
	if got, err := readFile(t, cl, "/r"); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read after repair: %v", err)
	}
}

// TestReconcileWhileRunning: a chunk no file uses that appears on a running
// server (a copy a repair abandoned, a chunk a crashed master's window lost)
// is deleted after at most two reconcile periods, and the chunks files use
// stay, however many periods pass.
func TestReconcileWhileRunning(t *testing.T) {
	c := start(t, cluster.Config{Dir: t.TempDir(), DownAfter: time.Second, Reconcile: 100 * time.Millisecond})
	cl := c.Client()
	defer cl.Close()
	data := rnd(3<<20, 33)
	writeFile(t, cl, "/keep/ha", "ha", data)
	writeFile(t, cl, "/keep/perf", "perf", data)
	if err := c.Servers[0].Store().Write(434343, 0, []byte("nobody's bytes")); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 10*time.Second, func() (bool, string) {
		_, err := c.Servers[0].Store().Stat(434343)
		return errors.Is(err, errs.ErrNotFound), "orphan chunk not deleted by a running server's reconcile"
	})
	// Several more periods: every chunk of the files is still held.
	held := func() int {
		n := 0
		for _, s := range c.Servers {
			n += len(s.Store().IDs())
		}
		return n
	}
	before := held()
	deadline := time.Now().Add(500 * time.Millisecond)
	for time.Now().Before(deadline) {
		if n := held(); n != before {
			t.Fatalf("servers hold %d chunks, %d before: a used chunk was swept", n, before)
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, p := range []string{"/keep/ha", "/keep/perf"} {
		if got, err := readFile(t, cl, p); err != nil || !bytes.Equal(got, data) {
			t.Fatalf("%s after reconciles: %v", p, err)
		}
	}
}
