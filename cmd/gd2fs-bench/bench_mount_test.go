package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gd2fs/gd2fs/client"
	"github.com/gd2fs/gd2fs/internal/cluster"
	"github.com/gd2fs/gd2fs/internal/mount"
	"github.com/gd2fs/gd2fs/internal/testutil"
	"github.com/gd2fs/gd2fs/internal/weights"
)

// envRunMain makes the test binary run gd2fs-bench's main with its
// arguments, so a test can run the bench as its own process.
const envRunMain = "GD2FS_BENCH_RUN_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(envRunMain) != "" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestMountBenchSignal: a `gd2fs-bench mount` ended by SIGTERM (timeout(1))
// or SIGINT (Ctrl-C) while its mount is up unmounts it and removes its
// folder. It used to die at once and leave the mount in the mount table
// with no daemon behind it ("Transport endpoint is not connected").
func TestMountBenchSignal(t *testing.T) {
	if _, err := os.Stat("/dev/fuse"); err != nil || os.Geteuid() != 0 {
		t.Skipf("needs /dev/fuse and root (have /dev/fuse: %v, euid %d)", err == nil, os.Geteuid())
	}
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT} {
		t.Run(sig.String(), func(t *testing.T) {
			tmp := t.TempDir()
			cmd := exec.Command(os.Args[0], "mount", "--size", "4MiB", "--only", "hot")
			cmd.Env = append(os.Environ(), envRunMain+"=1", envPauseMounted+"=1", "TMPDIR="+tmp)
			out, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			var stderr strings.Builder
			cmd.Stderr = &stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				cmd.Process.Kill()
				cmd.Wait()
				for _, mp := range mountedUnder(tmp) { // what the bench left
					mount.Unmount(mp, true)
				}
			})
			var mp string
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				if _, err := fmt.Sscanf(sc.Text(), "mounted %s", &mp); err == nil {
					break
				}
			}
			if mp == "" {
				t.Fatalf("the bench never said it mounted: %v\n%s", sc.Err(), stderr.String())
			}
			if left := mountedUnder(tmp); len(left) != 1 || left[0] != mp {
				t.Fatalf("mounted %s, the mount table has %v", mp, left)
			}
			if err := cmd.Process.Signal(sig); err != nil {
				t.Fatal(err)
			}
			err = cmd.Wait()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != 128+int(sig) {
				t.Errorf("the bench after %v: %v, want exit status %d\n%s", sig, err, 128+int(sig), stderr.String())
			}
			if left := mountedUnder(tmp); len(left) > 0 {
				t.Fatalf("mounts left behind after %v: %v\n%s", sig, left, stderr.String())
			}
			if ents, err := os.ReadDir(tmp); err != nil || len(ents) != 0 {
				t.Fatalf("the bench's folder is still there after %v: %v %v", sig, ents, err)
			}
		})
	}
}

// TestWaitCachedAsksAgain: the hot part of the bench stat'ed the file
// once, right after reading it through the mount; when that came before
// the fill recorded the file's sha256 (which names the blob), it waited
// out its 10 minutes and timeout(1) killed it. The first stat here is
// answered before the fill, as it was then.
func TestWaitCachedAsksAgain(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := cluster.Start(ctx, cluster.Config{Dir: t.TempDir(), MemBytes: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cl := c.Client()
	defer cl.Close()
	data := testutil.RandomBytes(1<<20+5, 3)
	f, err := cl.Create(ctx, benchRemote, client.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(data); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	cache := &weights.Cache{Dir: t.TempDir()}
	stats := 0
	stat := func(ctx context.Context) (client.FileInfo, error) {
		fi, err := cl.Stat(ctx, benchRemote)
		if stats++; stats == 1 && err == nil {
			if fi.Attrs["sha256"] != "" {
				t.Errorf("the file has a sha256 before any fill: the test shows nothing")
			}
			fill := cache.StartFill(ctx, cl, fi) // the mount's fill, finishing after the stat
			<-fill.Done()
			if _, ferr := fill.Result(); ferr != nil {
				t.Errorf("fill: %v", ferr)
			}
		}
		return fi, err
	}
	blob, err := waitCached(ctx, stat, cache)
	if err != nil {
		t.Fatalf("waitCached after %d stats: %v", stats, err)
	}
	if b, err := os.ReadFile(blob); err != nil || !bytes.Equal(b, data) {
		t.Fatalf("the blob %s: %v", blob, err)
	}
}
