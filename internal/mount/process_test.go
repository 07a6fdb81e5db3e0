package mount

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gd2fs/gd2fs/client"
	"github.com/gd2fs/gd2fs/errs"
	"github.com/gd2fs/gd2fs/internal/master"
	"github.com/gd2fs/gd2fs/internal/testutil"
)

// TestMain runs the mount daemon of the process tests when this test
// binary is started as one (GD2FS_MOUNT_HELPER=<mountpoint>).
func TestMain(m *testing.M) {
	if dir := os.Getenv("GD2FS_MOUNT_HELPER"); dir != "" {
		if err := helperMount(dir); err != nil {
			fmt.Fprintln(os.Stderr, "helper:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func helperMount(dir string) error {
	cl, err := client.New(client.Config{Master: os.Getenv("GD2FS_MASTER")})
	if err != nil {
		return err
	}
	m, err := Mount(dir, Options{Client: cl, Root: os.Getenv("GD2FS_ROOT")})
	if err != nil {
		return err
	}
	fmt.Println("mounted")
	m.Wait()
	return nil
}

// daemon starts a mount daemon in another process and waits until it is
// mounted.
func daemon(t *testing.T, e *env, dir, root string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "GD2FS_MOUNT_HELPER="+dir, "GD2FS_MASTER="+e.c.Master.URL(), "GD2FS_ROOT="+root)
	var logb testutil.SyncBuffer
	cmd.Stderr = &logb
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		Unmount(dir, true) // whatever the test left
		if t.Failed() {
			t.Logf("daemon log:\n%s", logb.String())
		}
	})
	line, err := bufio.NewReader(out).ReadString('\n')
	if strings.TrimSpace(line) != "mounted" {
		t.Fatalf("daemon: %q %v\n%s", line, err, logb.String())
	}
	return cmd
}

func mounted(dir string) bool {
	b, _ := os.ReadFile("/proc/mounts")
	return bytes.Contains(b, []byte(" "+dir+" "))
}

// TestUnmountOpenFilesAndKill9: unmount is refused while a file is open
// (EBUSY, saying what to do) and a lazy one detaches at once while the open
// file keeps reading; a daemon killed with SIGKILL leaves a mountpoint that
// answers ENOTCONN (never hangs) until Unmount clears it.
func TestUnmountOpenFilesAndKill9(t *testing.T) {
	e := setup(t, nil)
	want := testutil.RandomBytes(2<<20, 7)
	e.put(t, "/k/f.bin", want)

	// Lazy unmount of a live daemon with a file open.
	dir := t.TempDir()
	d := daemon(t, e, dir, "/k")
	f, err := os.Open(filepath.Join(dir, "f.bin"))
	if err != nil {
		t.Fatal(err)
	}
	if err := Unmount(dir, false); !errors.Is(err, syscall.EBUSY) || !strings.Contains(err.Error(), "--lazy") {
		t.Fatalf("unmount with a file open: %v, want EBUSY saying --lazy", err)
	}
	if err := Unmount(dir, true); err != nil {
		t.Fatal(err)
	}
	if mounted(dir) {
		t.Fatal("still mounted after a lazy unmount")
	}
	buf := make([]byte, len(want))
	if _, err := f.ReadAt(buf, 0); err != nil || !bytes.Equal(buf, want) {
		t.Fatalf("an open file after a lazy unmount: %v", err)
	}
	f.Close()
	exited := make(chan error, 1)
	go func() { exited <- d.Wait() }()
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("daemon after the last file closed: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the daemon did not exit after a lazy unmount and the last close")
	}

	// SIGKILL of the daemon.
	dir = t.TempDir()
	d = daemon(t, e, dir, "/k")
	f, err = os.Open(filepath.Join(dir, "f.bin"))
	if err != nil {
		t.Fatal(err)
	}
	d.Process.Kill()
	d.Wait()
	_, err = os.Stat(filepath.Join(dir, "not-looked-up-yet"))
	if !errors.Is(err, syscall.ENOTCONN) {
		t.Fatalf("stat under a killed daemon: %v, want ENOTCONN", err)
	}
	if _, err := f.ReadAt(buf[:4096], 1<<20); err == nil {
		t.Fatal("read of an open file under a killed daemon succeeded")
	}
	if err := Unmount(dir, false); !errors.Is(err, syscall.EBUSY) {
		t.Fatalf("unmount with a file open under a killed daemon: %v, want EBUSY", err)
	}
	f.Close()
	if err := Unmount(dir, false); err != nil {
		t.Fatalf("unmount after kill -9: %v", err)
	}
	if mounted(dir) {
		t.Fatal("still mounted")
	}
	if _, err := os.ReadDir(dir); err != nil {
		t.Fatalf("the mountpoint after unmount: %v", err)
	}
}

// TestKilledWriter: a writer killed by a signal mid-file leaves the bytes
// it wrote committed and the file unsealed (not passed off as complete; a
// mode of 0644, not 0444, through the mount); the same writer ending
// normally seals its file. (Before, both were sealed: the kernel flushes a
// killed process's descriptors like any close.)
func TestKilledWriter(t *testing.T) {
	if _, err := os.Stat("/usr/bin/python3"); err != nil {
		t.Skipf("the writer is a python3 script: %v", err)
	}
	e := setup(t, nil)
	if err := e.cl.Mkdir(context.Background(), "/w"); err != nil {
		t.Fatal(err)
	}
	m, _ := e.mountFS(t, Options{Root: "/w"})
	const n = 3 << 20
	// One process writes (a descriptor closed anywhere, a dup in a child
	// too, is a close that seals), says so, then waits or ends.
	writer := func(name, end string) *exec.Cmd {
		cmd := exec.Command("/usr/bin/python3", "-c", `import sys, time
f = open(sys.argv[1], "wb", buffering=0)
f.write(bytes(`+fmt.Sprint(n)+`))
print("written", flush=True)
if sys.argv[2] == "wait":
    time.sleep(600)
f.close()`, filepath.Join(m.Dir(), name), end)
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		if line, err := bufio.NewReader(out).ReadString('\n'); line != "written\n" {
			t.Fatalf("writer: %q %v", line, err)
		}
		return cmd
	}
	w := writer("killed.bin", "wait")
	w.Process.Kill()
	if err := w.Wait(); err == nil {
		t.Fatal("the killed writer exited 0")
	}
	// The exit waited for the close (FUSE flush), so the file is settled.
	fi, err := e.cl.Stat(context.Background(), "/w/killed.bin")
	if err != nil {
		t.Fatal(err)
	}
	if fi.Sealed || fi.Size != n {
		t.Fatalf("a killed writer's file: sealed %v, %d bytes; want unsealed with the %d bytes written", fi.Sealed, fi.Size, n)
	}
	st, err := os.Stat(filepath.Join(m.Dir(), "killed.bin"))
	if err != nil || st.Mode().Perm() != 0o644 || st.Size() != n {
		t.Fatalf("the killed writer's file through the mount: %v %v", st, err)
	}

	w = writer("done.bin", "close")
	if err := w.Wait(); err != nil {
		t.Fatal(err)
	}
	if fi, err := e.cl.Stat(context.Background(), "/w/done.bin"); err != nil || !fi.Sealed || fi.Size != n {
		t.Fatalf("a writer that ended: %+v %v, want sealed with %d bytes", fi, err, n)
	}
}

// TestKilledDaemonWriter: kill -9 of the mount daemon while a process
// writes through it. The file is left unsealed on the cluster, with the
// bytes the writer had fsynced; nothing can tell it from a file still
// being written but time, so the master removes it once nothing has
// written to it for --unsealed-ttl, and keeps a file being written now.
func TestKilledDaemonWriter(t *testing.T) {
	if _, err := os.Stat("/usr/bin/python3"); err != nil {
		t.Skipf("the writer is a python3 script: %v", err)
	}
	e := setup(t, nil)
	ctx := context.Background()
	if err := e.cl.Mkdir(ctx, "/kw"); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	d := daemon(t, e, dir, "/kw")
	const n = 3 << 20
	w := exec.Command("/usr/bin/python3", "-c", `import os, sys, time
f = open(sys.argv[1], "wb", buffering=0)
f.write(bytes(`+fmt.Sprint(n)+`))
os.fsync(f.fileno())
f.write(bytes(1000))
print("written", flush=True)
time.sleep(600)`, filepath.Join(dir, "partial.bin"))
	out, err := w.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Process.Kill(); w.Wait() })
	if line, err := bufio.NewReader(out).ReadString('\n'); line != "written\n" {
		t.Fatalf("writer: %q %v", line, err)
	}
	d.Process.Kill()
	d.Wait()
	w.Process.Kill()
	w.Wait()
	if err := Unmount(dir, false); err != nil {
		t.Fatalf("unmount after kill -9: %v", err)
	}

	fi, err := e.cl.Stat(ctx, "/kw/partial.bin")
	if err != nil {
		t.Fatal(err)
	}
	if fi.Sealed || fi.Size != n {
		t.Fatalf("the file of a killed daemon: sealed %v, %d bytes; want unsealed with the %d bytes fsynced", fi.Sealed, fi.Size, n)
	}
	// Shown as partial through a new mount (mode 0644, not a sealed 0444).
	m, _ := e.mountFS(t, Options{Root: "/kw"})
	if st, err := os.Stat(filepath.Join(m.Dir(), "partial.bin")); err != nil || st.Mode().Perm() != 0o644 || st.Size() != n {
		t.Fatalf("the partial file through a new mount: %v %v", st, err)
	}
	// A file being written now, by a live writer.
	live, err := e.cl.Create(ctx, "/kw/live.bin", client.CreateOptions{Pool: "perf"})
	if err != nil {
		t.Fatal(err)
	}
	defer live.Close()
	if _, err := live.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	li, err := e.cl.Stat(ctx, "/kw/live.bin")
	if err != nil {
		t.Fatal(err)
	}
	if !li.Modified.After(fi.Modified) {
		t.Fatalf("the live file (%v) is not newer than the partial one (%v)", li.Modified, fi.Modified)
	}
	// The master's clock, a TTL past the partial file's last write and
	// not past the live one's.
	at := fi.Modified.Add(li.Modified.Sub(fi.Modified)/2 + master.DefaultUnsealedTTL)
	if k, err := e.c.Master.ExpireUnsealed(ctx, at); err != nil || k != 1 {
		t.Fatalf("expiry removed %d files (%v), want 1", k, err)
	}
	if _, err := e.cl.Stat(ctx, "/kw/partial.bin"); !errors.Is(err, errs.ErrNotFound) {
		t.Fatalf("the abandoned file after the expiry: %v", err)
	}
	if _, err := e.cl.Stat(ctx, "/kw/live.bin"); err != nil {
		t.Fatalf("the live file after the expiry: %v", err)
	}
}
