package bridge

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/gd2fs/gd2fs/client"
	"github.com/gd2fs/gd2fs/errs"
	"github.com/gd2fs/gd2fs/internal/cluster"
	"golang.org/x/sys/unix"
)

func start(t *testing.T) *cluster.Cluster {
	t.Helper()
	c, err := cluster.Start(context.Background(), cluster.Config{Dir: t.TempDir(), Cluster: "bt", MemBytes: 64 << 20, KVMemBytes: 16 << 20})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func newEngine(t *testing.T, c *cluster.Cluster, iothreads int) *Engine {
	t.Helper()
	e, err := New(Config{CPAddr: "gd2fs://" + strings.TrimPrefix(c.Master.URL(), "http://"), DPAddr: "tcp://127.0.0.1",
		Cluster: "bt", IOThreads: iothreads, MemThreads: 1, Streams: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

func ptr(b []byte) unsafe.Pointer { return unsafe.Pointer(&b[0]) }

func TestParseAddresses(t *testing.T) {
	ms, err := ParseMasters("gd2fs://a:1, b:2,http://c:3,https://d:4")
	if err != nil || strings.Join(ms, " ") != "http://a:1 http://b:2 http://c:3 https://d:4" {
		t.Fatalf("%v %v", ms, err)
	}
	for _, bad := range []string{"", "gd2fs://a", "gd2fs://a:1/path", "rdma://a:1", ","} {
		if _, err := ParseMasters(bad); !errors.Is(err, errs.ErrBadRequest) {
			t.Errorf("ParseMasters(%q) = %v", bad, err)
		}
	}
	// Loopback addresses are kept (bound for loopback servers only), the
	// unspecified one leaves the choice to the kernel.
	if l, err := ParseDataPlane("tcp://127.0.0.1, tcp://0.0.0.0:0,tcp://127.0.0.2"); err != nil || strings.Join(l, " ") != "127.0.0.1 127.0.0.2" {
		t.Fatalf("%v %v", l, err)
	}
	_, err = ParseDataPlane("rdma://10.0.0.1")
	if err == nil || !strings.Contains(err.Error(), "RDMA data plane not available in this build") {
		t.Fatal(err)
	}
	for _, bad := range []string{"", "10.0.0.1", "udp://127.0.0.1", "tcp://nohost", "tcp://203.0.113.9"} {
		if _, err := ParseDataPlane(bad); !errors.Is(err, errs.ErrBadRequest) {
			t.Errorf("ParseDataPlane(%q) = %v", bad, err)
		}
	}
}

func TestClusterName(t *testing.T) {
	c := start(t)
	_, err := New(Config{CPAddr: c.Master.URL(), DPAddr: "tcp://127.0.0.1", Cluster: "prod", IOThreads: 1, MemThreads: 1, Streams: 1})
	if err == nil || !strings.Contains(err.Error(), `serves cluster "bt"`) {
		t.Fatal(err)
	}
}

func wait1(t *testing.T, e *Engine, q int) Result {
	t.Helper()
	rs, err := e.Wait(q, -1, 16)
	if err != nil || len(rs) != 1 {
		t.Fatalf("Wait: %v %v", rs, err)
	}
	return rs[0]
}

func TestSubmitRoundTripAndQueues(t *testing.T) {
	e := newEngine(t, start(t), 4)
	src := bytes.Repeat([]byte("0123456789abcdef"), 64<<10) // 1 MiB
	dst := make([]byte, len(src))
	sid, _ := e.RegIOMEM(ptr(src), int64(len(src)))
	did, _ := e.RegIOMEM(ptr(dst), int64(len(dst)))
	half := int64(len(src) / 2)
	// Two SGEs, swapped halves: file = src[half:] + src[:half].
	id, err := e.Submit(OpWrite, "/b/x", 0, []Seg{{unsafe.Add(ptr(src), half), half, sid}, {ptr(src), half, sid}}, 0, "", QueueWait)
	if err != nil {
		t.Fatal(err)
	}
	if r := wait1(t, e, QueueWait); r.ID != id || r.Status != OK || r.Value != 2*half {
		t.Fatalf("%+v", r)
	}
	fd, _ := e.Fd(QueueAsync)
	id, err = e.Submit(OpRead, "/b/x", 0, []Seg{{ptr(dst), 2 * half, did}}, 0, "", QueueAsync)
	if err != nil {
		t.Fatal(err)
	}
	pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	if n, err := unix.Poll(pfd, 30000); n != 1 || err != nil {
		t.Fatalf("the async eventfd never turned readable: %d %v", n, err)
	}
	if rs, _ := e.Wait(QueueWait, 0, 16); len(rs) != 0 {
		t.Fatalf("an async completion reached the Wait queue: %v", rs)
	}
	if r := wait1(t, e, QueueAsync); r.ID != id || r.Status != OK {
		t.Fatalf("%+v", r)
	}
	if n, _ := unix.Poll(pfd, 0); n != 0 {
		// revents tells a readable eventfd (POLLIN, 0x1) from one closed
		// under the test (POLLNVAL, 0x20): seen once in CI, not since.
		t.Fatalf("the eventfd stays readable with nothing to collect (revents %#x)", pfd[0].Revents)
	}
	if !bytes.Equal(dst[:half], src[half:]) || !bytes.Equal(dst[half:], src[:half]) {
		t.Fatal("bytes differ")
	}
	// Nothing in flight: Wait(-1) returns at once instead of hanging.
	if rs, _ := e.Wait(QueueWait, -1, 16); len(rs) != 0 {
		t.Fatal(rs)
	}
	// Failures complete with a status and a message naming path and range.
	id, _ = e.Submit(OpRead, "/b/x", half, []Seg{{ptr(dst), 2 * half, did}}, 0, "", QueueWait)
	if r := wait1(t, e, QueueWait); r.ID != id || r.Status != CodeRange || !strings.Contains(r.Err, "/b/x [524288, 1572864)") {
		t.Fatalf("%+v", r)
	}
	e.Submit(OpRead, "/b/none", 0, []Seg{{ptr(dst), 1, did}}, 0, "", QueueWait)
	if r := wait1(t, e, QueueWait); r.Status != CodeNotFound {
		t.Fatalf("%+v", r)
	}
}

func TestBadInput(t *testing.T) {
	e := newEngine(t, start(t), 1)
	// The IOMEM is the middle of a larger allocation, so addresses just
	// outside it are still valid Go pointers (checkptr, under -race).
	big := make([]byte, 3*4096)
	buf := big[4096 : 2*4096]
	id, err := e.RegIOMEM(ptr(buf), 4096)
	if err != nil {
		t.Fatal(err)
	}
	for name, seg := range map[string]Seg{
		"before":   {ptr(big[4095:]), 1, id},
		"past end": {ptr(big[4096+4000:]), 97, id},
		"zero":     {ptr(buf), 0, id},
		"negative": {ptr(buf), -1, id},
		"huge":     {ptr(buf), 1 << 62, id},
		"no iomem": {ptr(buf), 1, 77},
	} {
		if _, err := e.Submit(OpRead, "/x", 0, []Seg{seg}, 0, "", QueueWait); !errors.Is(err, errs.ErrBadRequest) {
			t.Errorf("%s: %v", name, err)
		}
	}
	ok := []Seg{{ptr(buf), 16, id}}
	for name, f := range map[string]func() error{
		"offset":   func() error { _, err := e.Submit(OpRead, "/x", -1, ok, 0, "", QueueWait); return err },
		"flags":    func() error { _, err := e.Submit(OpRead, "/x", 0, ok, 8, "", QueueWait); return err },
		"opts":     func() error { _, err := e.Submit(OpWrite, "/x", 0, ok, 0, "pool", QueueWait); return err },
		"path":     func() error { _, err := e.Submit(OpRead, "x", 0, ok, 0, "", QueueWait); return err },
		"queue":    func() error { _, err := e.Submit(OpRead, "/x", 0, ok, 0, "", 7); return err },
		"empty":    func() error { _, err := e.Submit(OpRead, "/x", 0, nil, 0, "", QueueWait); return err },
		"reg nil":  func() error { _, err := e.RegIOMEM(nil, 1); return err },
		"reg zero": func() error { _, err := e.RegIOMEM(ptr(buf), 0); return err },
		"dereg":    func() error { return e.DeregIOMEM(99) },
	} {
		if err := f(); !errors.Is(err, errs.ErrBadRequest) {
			t.Errorf("%s: %v", name, err)
		}
	}
	if err := e.DeregIOMEM(id); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Submit(OpRead, "/x", 0, ok, 0, "", QueueWait); !errors.Is(err, errs.ErrBadRequest) {
		t.Fatal("a deregistered IOMEM was accepted")
	}
}

// DeregIOMEM must not return while a transfer still holds the memory.
func TestDeregWaitsForUsers(t *testing.T) {
	e := newEngine(t, start(t), 1)
	buf := make([]byte, 64)
	id, _ := e.RegIOMEM(ptr(buf), 64)
	_, held, _, err := e.mem.acquire([]Seg{{ptr(buf), 64, id}})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { e.DeregIOMEM(id); close(done) }()
	for { // until DeregIOMEM has marked it dead and waits
		e.mem.mu.Lock()
		dead := held[0].dead
		e.mem.mu.Unlock()
		if dead {
			break
		}
		runtime.Gosched()
	}
	select {
	case <-done:
		t.Fatal("DeregIOMEM returned while a transfer held the IOMEM")
	default:
	}
	e.mem.release(held)
	<-done
}

func TestConcurrentTransfers(t *testing.T) {
	e := newEngine(t, start(t), 8)
	const workers, rounds, size = 8, 10, 64 << 10
	var wg sync.WaitGroup
	errc := make(chan error, workers)
	var mu sync.Mutex
	done := map[uint64]Result{}
	// collect waits until id has been collected (by any goroutine).
	collect := func(id uint64) Result {
		for {
			mu.Lock()
			r, ok := done[id]
			mu.Unlock()
			if ok {
				return r
			}
			rs, _ := e.Wait(QueueWait, 50*time.Millisecond, 4)
			mu.Lock()
			for _, r := range rs {
				done[r.ID] = r
			}
			mu.Unlock()
		}
	}
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			src := bytes.Repeat([]byte{byte(w)}, size)
			dst := make([]byte, size)
			sid, _ := e.RegIOMEM(ptr(src), size)
			did, _ := e.RegIOMEM(ptr(dst), size)
			for k := range rounds {
				p := fmt.Sprintf("/c/%d/%d", w, k)
				id, err := e.Submit(OpWrite, p, 0, []Seg{{ptr(src), size, sid}}, 0, "", QueueWait)
				if err == nil {
					if r := collect(id); r.Status != OK {
						err = errors.New(r.Err)
					}
				}
				if err == nil {
					id, err = e.Submit(OpRead, p, 0, []Seg{{ptr(dst), size, did}}, 0, "", QueueWait)
				}
				if err == nil {
					if r := collect(id); r.Status != OK {
						err = errors.New(r.Err)
					}
				}
				if err == nil && !bytes.Equal(src, dst) {
					err = fmt.Errorf("%s: bytes differ", p)
				}
				if err != nil {
					errc <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Error(err)
	}
	// Every transfer completed: none is counted as queued any more (the
	// count lengthens the deadline of the transfers submitted after them).
	if q := e.queued.Load(); q != 0 {
		t.Errorf("%d bytes still counted as queued after every transfer completed", q)
	}
}

func TestCloseCancels(t *testing.T) {
	e := newEngine(t, start(t), 1)
	buf := make([]byte, 4<<20)
	id, _ := e.RegIOMEM(ptr(buf), int64(len(buf)))
	e.Submit(OpWrite, "/cl/x", 0, []Seg{{ptr(buf), int64(len(buf)), id}}, 0, "", QueueWait)
	wait1(t, e, QueueWait)
	for range 8 {
		if _, err := e.Submit(OpRead, "/cl/x", 0, []Seg{{ptr(buf), int64(len(buf)), id}}, 0, "", QueueWait); err != nil {
			t.Fatal(err)
		}
	}
	e.Close() // returns only when no transfer touches buf any more
	rs, _ := e.Wait(QueueWait, 0, 64)
	if len(rs) != 8 {
		t.Fatalf("%d of 8 completed", len(rs))
	}
	for _, r := range rs {
		if r.Status != OK && r.Status != CodeCancelled {
			t.Errorf("%+v", r)
		}
	}
	if _, err := e.Submit(OpRead, "/cl/x", 0, []Seg{{ptr(buf), 1, id}}, 0, "", QueueWait); err == nil {
		t.Fatal("submit after Close")
	}
}

func TestPythonicCalls(t *testing.T) {
	e := newEngine(t, start(t), 1)
	if _, err := e.WriteFrom("/p/a", 0, []byte("hello"), "pool=ha"); err != nil {
		t.Fatal(err)
	}
	dst := make([]byte, 8)
	if n, err := e.ReadInto("/p/a", 0, dst); n != 5 || err != nil || string(dst[:5]) != "hello" {
		t.Fatalf("%d %v %q", n, err, dst)
	}
	out, err := e.Call("stat", []byte(`{"path":"/p/a"}`))
	if err != nil || !strings.Contains(string(out), `"Pool":"ha"`) {
		t.Fatalf("%s %v", out, err)
	}
	if _, err := e.Call("nope", nil); !errors.Is(err, errs.ErrBadRequest) {
		t.Fatal(err)
	}
	ns, err := e.KVBatchGetInto("", []string{"k0"}, [][]byte{dst})
	if err != nil || ns[0] != -CodeNotFound {
		t.Fatalf("%v %v", ns, err)
	}
	if rs, err := e.KVBatchPut("", []string{"k0", "k1"}, [][]byte{[]byte("v0"), []byte("v1")}); err != nil || rs[0] != 0 || rs[1] != 0 {
		t.Fatalf("%v %v", rs, err)
	}
	if ns, _ := e.KVBatchGetInto("", []string{"k1", "k0"}, [][]byte{dst[:2], dst[2:4]}); ns[0] != 2 || ns[1] != 2 || string(dst[:4]) != "v1v0" {
		t.Fatalf("%v %q", ns, dst)
	}
}

func TestCode(t *testing.T) {
	for err, want := range map[error]int{
		nil:                                   OK,
		errs.New(errs.ErrSealed, ""):          CodeSealed,
		fmt.Errorf("x: %w", errs.ErrNotFound): CodeNotFound,
		context.Canceled:                      CodeCancelled,
		errors.New("mystery"):                 CodeInternal,
	} {
		if got := Code(err); got != want {
			t.Errorf("Code(%v) = %d, want %d", err, got, want)
		}
	}
}

// TestTransferDeadline: a transfer's deadline grows with its size as the
// client's per-request deadline does, and a write's also covers the master
// failover wait of its Sync (none when GD2FS_MASTER_RETRY=0).
func TestTransferDeadline(t *testing.T) {
	var e Engine
	e.deadline.timeout, e.deadline.minRate, e.deadline.masterRetry = 10*time.Second, 8<<20, 30*time.Second
	for _, c := range []struct {
		op   Op
		n    int64
		want time.Duration
	}{
		{OpRead, 0, 10 * time.Second},
		{OpRead, 8 << 20, 11 * time.Second},
		{OpRead, 80 << 20, 20 * time.Second},
		{OpWrite, 8 << 20, 41 * time.Second},
	} {
		if got := e.transferDeadline(c.op, c.n); got != c.want {
			t.Errorf("%s of %d bytes: deadline %s, want %s", c.op, c.n, got, c.want)
		}
	}
	if got := e.transferDeadline(OpRead, 1<<62); got != 10*time.Second+24*time.Hour {
		t.Errorf("a huge transfer: deadline %s, want 10s + 24h (not an overflow)", got)
	}
	e.deadline.masterRetry = 0
	if got := e.transferDeadline(OpWrite, 0); got != 10*time.Second {
		t.Errorf("write with no failover wait: deadline %s, want 10s", got)
	}
	// A load submitted as many transfers: each waits for those before it.
	for i := range 4 {
		if got, want := e.admit(OpRead, 8<<20), 10*time.Second+time.Duration(i+1)*time.Second; got != want {
			t.Errorf("transfer %d of 8 MiB behind %d queued: deadline %s, want %s", i, i, got, want)
		}
	}
	e.queued.Add(-4 * 8 << 20) // all four completed
	if got := e.admit(OpRead, 8<<20); got != 11*time.Second {
		t.Errorf("a transfer after the others completed: deadline %s, want 11s", got)
	}
}

// TestSessionFileWriteWithoutSync: pygd2fs's Write of a plan's fresh range
// into a session's file sends no Sync to the master (the file is marked
// CommitRecordsSize): the master's size stays where it was until the
// engine's commit, which records it; the bytes load back exact. A Write
// of any other file still Syncs: its size is visible at once.
func TestSessionFileWriteWithoutSync(t *testing.T) {
	c := start(t)
	e := newEngine(t, c, 2)
	cl := c.Client()
	defer cl.Close()
	ctx := context.Background()
	ss := cl.Sessions()
	if err := ss.SetLayout(ctx, client.Layout{Model: "w", Layers: 2, KVHeads: 2, HeadDim: 64, DType: "fp16", PageTokens: 16, Order: "page_first"}); err != nil {
		t.Fatal(err)
	}
	ids := make([]uint32, 100)
	for i := range ids {
		ids[i] = uint32(i * 7)
	}
	p, err := ss.Plan(ctx, "s1", client.PlanRequest{Model: "w", TokenIDs: ids})
	if err != nil {
		t.Fatal(err)
	}
	write := func(path string, off int64, b []byte) {
		t.Helper()
		mid, err := e.RegIOMEM(ptr(b), int64(len(b)))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := e.Submit(OpWrite, path, off, []Seg{{ptr(b), int64(len(b)), mid}}, 0, "", QueueWait); err != nil {
			t.Fatal(err)
		}
		if r := wait1(t, e, QueueWait); r.Status != OK || r.Value != int64(len(b)) {
			t.Fatalf("write of %s: %+v", path, r)
		}
	}
	var kv []byte
	var path string
	for _, r := range p.Fresh {
		u, err := client.ParseURI(r.KVURI)
		if err != nil {
			t.Fatal(err)
		}
		path = u.Path
		b := bytes.Repeat([]byte{byte(len(kv)), 0xa5, 3}, int(r.KVLength)/3+1)[:r.KVLength]
		write(path, r.KVStart, b)
		kv = append(kv, b...)
	}
	if st, err := cl.Stat(ctx, path); err != nil || st.Size != 0 || !st.CommitRecordsSize {
		t.Fatalf("after the engine's write, before its commit: %+v %v (a Sync was sent, or the file is not marked)", st, err)
	}
	if _, err := ss.CommitSaved(ctx, "s1", p.PlanID, p.Fresh); err != nil {
		t.Fatal(err)
	}
	last := p.Fresh[len(p.Fresh)-1]
	if st, err := cl.Stat(ctx, path); err != nil || st.Size != last.KVStart+last.KVLength {
		t.Fatalf("after the commit: %+v %v", st, err)
	}
	q, err := ss.Plan(ctx, "s1", client.PlanRequest{Model: "w", TokenIDs: append(ids, 1, 2, 3)})
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, q.LoadBytes)
	if _, err := ss.LoadStored(ctx, q, buf); err != nil {
		t.Fatal(err)
	}
	if q.CachedTokens != 100 || !bytes.Equal(buf, kv[:q.LoadBytes]) {
		t.Fatalf("%d tokens stored, the bytes as written: %v", q.CachedTokens, bytes.Equal(buf, kv[:q.LoadBytes]))
	}
	write("/b/plain", 0, []byte("plain bytes"))
	if st, err := cl.Stat(ctx, "/b/plain"); err != nil || st.Size != 11 || st.CommitRecordsSize {
		t.Fatalf("a plain file after pygd2fs's Write: %+v %v", st, err)
	}
}
