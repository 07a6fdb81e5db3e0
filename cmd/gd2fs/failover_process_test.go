package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gd2fs/gd2fs/client"
	"github.com/gd2fs/gd2fs/errs"
	"github.com/gd2fs/gd2fs/internal/meta/metatest"
	"github.com/gd2fs/gd2fs/internal/testutil"
)

// TestLeaderKillUnderLoad runs two masters on one PostgreSQL schema, three
// servers and two writers copying HA files in a loop (one through the SDK,
// one through `gd2fs cp` processes), and SIGKILLs the leading master while
// they write. No write may fail: the clients wait for the standby to lead,
// and the new leader waits for heartbeats before it places chunks. Every
// acknowledged file must read back identical.
func TestLeaderKillUnderLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs processes")
	}
	dsn := metatest.PostgresDSN(t)
	bin := buildBinary(t)
	dir := t.TempDir()
	m1, m2 := freeAddr(t), freeAddr(t)
	masterArgs := func(addr string) []string {
		return []string{"master", "--listen", addr, "--advertise", "http://" + addr, "--meta", dsn,
			"--down-after", "2s", "--repair-after", "-1s"}
	}
	leader := spawn(t, bin, masterArgs(m1)...)
	masters := "http://" + m1 + ",http://" + m2
	cl, err := client.New(client.Config{Master: masters})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	testutil.Eventually(t, 30*time.Second, func() (bool, string) {
		_, err := cl.Status(context.Background())
		return err == nil, fmt.Sprintf("first master not leading: %v", err)
	})
	spawn(t, bin, masterArgs(m2)...) // the standby
	for i := 0; i < 3; i++ {
		spawn(t, bin, "server", "--master", masters, "--listen", freeAddr(t), "--mem", "64MiB",
			"--disk", filepath.Join(dir, fmt.Sprintf("s%d", i))+":1GiB", "--id", fmt.Sprintf("s%d", i), "--heartbeat", "200ms")
	}
	waitUp(t, cl, 3)

	type result struct {
		path string
		data []byte
		err  error
	}
	var mu sync.Mutex
	var results []result
	var killedAt int // len(results) when the leader was killed
	okAfter := func(prefix string, from int) int {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for _, r := range results[from:] {
			if r.err == nil && strings.Contains(r.path, prefix) {
				n++
			}
		}
		return n
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	writer := func(name string, write func(path string, data []byte) error) {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			p := fmt.Sprintf("/w/%s-%d", name, i)
			data := testutil.RandomBytes(300<<10+i*1000, uint64(len(name)*1000+i))
			err := write(p, data)
			mu.Lock()
			results = append(results, result{p, data, err})
			mu.Unlock()
		}
	}
	wg.Add(2)
	go writer("sdk", func(p string, data []byte) error {
		f, err := cl.Create(context.Background(), p, client.CreateOptions{Pool: "ha", ChunkSize: 128 << 10})
		if err != nil {
			return err
		}
		if _, err := f.Write(data); err != nil {
			return err
		}
		return f.Close()
	})
	go writer("cli", func(p string, data []byte) error {
		local := filepath.Join(dir, "local-"+filepath.Base(p))
		if err := os.WriteFile(local, data, 0o600); err != nil {
			return err
		}
		out, err := exec.Command(bin, "cp", "--master", masters, "--pool", "ha", "--chunk-size", "128KiB", local, "gd2fs://local"+p).CombinedOutput()
		if err != nil {
			return fmt.Errorf("gd2fs cp: %w: %s", err, out)
		}
		return nil
	})
	testutil.Eventually(t, 60*time.Second, func() (bool, string) {
		a, b := okAfter("sdk", 0), okAfter("cli", 0)
		return a >= 5 && b >= 3, fmt.Sprintf("before the kill: %d sdk and %d cli writes done", a, b)
	})

	if err := leader.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	killedAt = len(results)
	mu.Unlock()
	t.Logf("SIGKILLed the leading master after %d writes", killedAt)
	testutil.Eventually(t, 90*time.Second, func() (bool, string) {
		a, b := okAfter("sdk", killedAt), okAfter("cli", killedAt)
		return a >= 10 && b >= 5, fmt.Sprintf("after the kill: %d sdk and %d cli writes done", a, b)
	})
	close(stop)
	wg.Wait()

	failed := 0
	for _, r := range results {
		if r.err != nil {
			failed++
			t.Errorf("write %s failed: %v", r.path, r.err)
		}
	}
	t.Logf("%d writes, %d failed across the leader kill", len(results), failed)
	for _, r := range results {
		if r.err != nil {
			continue
		}
		got, err := readAll(cl, r.path)
		if err != nil || !bytes.Equal(got, r.data) {
			t.Errorf("acknowledged file %s after the failover: %v (equal=%v)", r.path, err, bytes.Equal(got, r.data))
		}
	}
}

// TestStoppedServer SIGSTOPs a server that holds replicas of an HA file: a
// slow server is not a dead one to the master, but clients must not wait on
// it past their deadline. Reads complete from the other replicas; a write
// whose chunk has a replica on it fails, retryably, naming it; once the
// master declares it down (--down-after) new files avoid it and repair
// re-replicates its chunks; after SIGCONT it serves again.
func TestStoppedServer(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs processes")
	}
	bin := buildBinary(t)
	dir := t.TempDir()
	maddr := freeAddr(t)
	murl := "http://" + maddr
	spawn(t, bin, "master", "--listen", maddr, "--meta", "sqlite://"+filepath.Join(dir, "meta.db"),
		"--down-after", "2s", "--repair-after", "2s")
	servers := make([]*exec.Cmd, 4)
	addrs := make([]string, 4)
	for i := range servers {
		addrs[i] = freeAddr(t)
		servers[i] = spawn(t, bin, "server", "--master", murl, "--listen", addrs[i], "--mem", "64MiB",
			"--disk", filepath.Join(dir, fmt.Sprintf("s%d", i))+":1GiB", "--id", fmt.Sprintf("s%d", i),
			"--heartbeat", "200ms", "--forward-timeout", "3s")
	}
	// The documented rule, made short for the test: a request may take
	// Timeout + bytes/MinRate before its server counts as not answering.
	const timeout = 5 * time.Second
	// Pieces of 256 KiB: a read rotates each chunk's pieces over all its
	// replicas, so some go to the stopped server first.
	cl, err := client.New(client.Config{Master: murl, Timeout: timeout, PieceSize: 256 << 10})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx := context.Background()
	waitUp(t, cl, 4)

	data := testutil.RandomBytes(8<<20, 61)
	f, err := cl.Create(ctx, "/s/a", client.CreateOptions{Pool: "ha", ChunkSize: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(data); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	// An open file whose chunks are allocated; the victim is a forward
	// target (not the primary) of its chunk 4, so rewriting that chunk is
	// sure to meet the stopped server on the replication path.
	w, err := cl.Create(ctx, "/s/open", client.CreateOptions{Pool: "ha", ChunkSize: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.WriteAt(data, 0); err != nil {
		t.Fatal(err)
	}
	st, err := cl.Stat(ctx, "/s/open")
	if err != nil || len(st.Chunks) != 8 {
		t.Fatalf("stat /s/open: %v", err)
	}
	t0 := time.Now()
	if got, err := readAll(cl, "/s/a"); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read with every server up: %v", err)
	}
	t.Logf("read of 8 MiB with every server up: %v", time.Since(t0).Round(time.Millisecond))
	vid := st.Chunks[4].Replicas[1].Server
	victim := int(vid[1] - '0')
	vaddr := addrs[victim]
	if err := servers[victim].Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := true
	defer func() {
		if stopped {
			servers[victim].Process.Signal(syscall.SIGCONT)
		}
	}()

	// Reads: every byte right, without waiting on the stopped server for
	// much more than one deadline (a 256 KiB piece: 5s + 1/32 s; generous slack
	// for a loaded machine, far below what an unbounded wait would be).
	for round := 0; round < 2; round++ {
		t0 := time.Now()
		got, err := readAll(cl, "/s/a")
		el := time.Since(t0)
		if err != nil || !bytes.Equal(got, data) {
			t.Fatalf("read %d with %s stopped: %v (equal=%v)", round, vid, err, bytes.Equal(got, data))
		}
		t.Logf("read %d of 8 MiB with a stopped replica: %v", round, el.Round(time.Millisecond))
		if el > 40*time.Second {
			t.Fatalf("read %d waited %v with a stopped replica: the deadline does not hold", round, el)
		}
	}

	// Writes: a chunk with a replica on the stopped server fails, with a
	// retryable error, and does not hang.
	t0 = time.Now()
	_, err = w.WriteAt(data[4<<20:], 4<<20)
	t.Logf("write meeting the stopped replica: %v after %v", err, time.Since(t0).Round(time.Millisecond))
	if !errors.Is(err, errs.ErrUnavailable) || !strings.Contains(err.Error(), vaddr) {
		t.Fatalf("write to a chunk with a replica on the stopped server %s: %v, want a retryable unavailable error naming it", vaddr, err)
	}

	// The master declares the silent server down; new files avoid it.
	waitUp(t, cl, 3)
	fresh := testutil.RandomBytes(3<<20, 62)
	g, err := cl.Create(ctx, "/s/fresh", client.CreateOptions{Pool: "ha", ChunkSize: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := g.Write(fresh); err != nil {
		t.Fatalf("write of a new HA file with %s down: %v", vid, err)
	}
	if err := g.Close(); err != nil {
		t.Fatal(err)
	}
	// Repair re-replicates the stopped server's HA chunks elsewhere.
	testutil.Eventually(t, 60*time.Second, func() (bool, string) {
		st, err := cl.Stat(ctx, "/s/a")
		if err != nil {
			return false, err.Error()
		}
		for _, c := range st.Chunks {
			for _, r := range c.Replicas {
				if r.Server == vid {
					return false, fmt.Sprintf("chunk %d still has a replica on %s", c.Index, vid)
				}
			}
		}
		return true, ""
	})

	// SIGCONT: it heartbeats again and serves.
	if err := servers[victim].Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	stopped = false
	waitUp(t, cl, 4)
	for p, want := range map[string][]byte{"/s/a": data, "/s/fresh": fresh} {
		if got, err := readAll(cl, p); err != nil || !bytes.Equal(got, want) {
			t.Fatalf("%s after SIGCONT: %v", p, err)
		}
	}
}
