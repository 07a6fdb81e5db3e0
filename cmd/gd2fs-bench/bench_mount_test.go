package main

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"

	"github.com/gd2fs/gd2fs/internal/mount"
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
