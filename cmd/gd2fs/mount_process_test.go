package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gd2fs/gd2fs/internal/testutil"
)

// TestMountCLI runs `gd2fs mount` as its own process against `gd2fs up`:
// a file copied in with `gd2fs cp` reads back through the mount, one written
// through the mount reads back with `gd2fs cat`, the log says whether
// passthrough is on, and `gd2fs umount` ends the daemon; a second one
// started with --background returns once mounted, and after its kill -9
// `gd2fs umount` clears the mountpoint.
func TestMountCLI(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs processes")
	}
	if _, err := os.Stat("/dev/fuse"); err != nil || os.Geteuid() != 0 {
		t.Skipf("needs /dev/fuse and root (have /dev/fuse: %v, euid %d)", err == nil, os.Geteuid())
	}
	bin := buildBinary(t)
	dir := t.TempDir()
	env, run := upCLI(t, bin, dir, 3, nil, "--mem", "64MiB")
	data := testutil.RandomBytes(5<<20+3, 11)
	src := filepath.Join(dir, "w.bin")
	os.WriteFile(src, data, 0o644)
	if out, err := run("cp", src, "gd2fs://local/models/org/m/w.bin"); err != nil {
		t.Fatalf("cp: %v\n%s", err, out)
	}
	mnt := filepath.Join(dir, "mnt")
	os.Mkdir(mnt, 0o755)
	start := func() (*exec.Cmd, *testutil.SyncBuffer) {
		cmd := exec.Command(bin, "mount", "--cache", filepath.Join(dir, "cache"), "gd2fs://local/models", mnt)
		cmd.Env = env
		var logb testutil.SyncBuffer
		cmd.Stdout, cmd.Stderr = &logb, &logb
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			cmd.Process.Kill()
			cmd.Wait()
			run("umount", "--lazy", mnt)
			if t.Failed() {
				t.Logf("gd2fs mount:\n%s", logb.String())
			}
		})
		testutil.Eventually(t, 30*time.Second, func() (bool, string) {
			return strings.Contains(logb.String(), "msg=mounted"), logb.String()
		})
		return cmd, &logb
	}
	d, logb := start()
	if !strings.Contains(logb.String(), "passthrough=") {
		t.Fatalf("the log does not say whether passthrough is on:\n%s", logb.String())
	}
	t.Logf("%s", strings.TrimSpace(logb.String()))
	if b, err := os.ReadFile(filepath.Join(mnt, "org/m/w.bin")); err != nil || !bytes.Equal(b, data) {
		t.Fatalf("read through the mount: %v", err)
	}
	if err := os.WriteFile(filepath.Join(mnt, "org/m/new.bin"), data[:1<<20], 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := run("cat", "gd2fs://local/models/org/m/new.bin"); err != nil || out != string(data[:1<<20]) {
		t.Fatalf("cat of a file written through the mount: %v (%d bytes)", err, len(out))
	}
	if out, err := run("umount", mnt); err != nil {
		t.Fatalf("umount: %v\n%s", err, out)
	}
	if err := d.Wait(); err != nil {
		t.Fatalf("the daemon after umount: %v\n%s", err, logb.String())
	}

	// SIGHUP (the daemon's terminal closed), like SIGTERM and SIGINT,
	// unmounts before the daemon exits: it used to kill the daemon and
	// leave the mount in the mount table.
	d, logb = start()
	if err := d.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	if err := d.Wait(); err != nil {
		t.Fatalf("the daemon after SIGHUP: %v\n%s", err, logb.String())
	}
	if b, _ := os.ReadFile("/proc/mounts"); bytes.Contains(b, []byte(" "+mnt+" ")) {
		t.Fatal("still mounted after the daemon's SIGHUP")
	}

	// --background returns once mounted, saying the daemon's pid.
	out, err := run("mount", "--background", "--log-file", filepath.Join(dir, "bg.log"), "gd2fs://local/models", mnt)
	if err != nil {
		t.Fatalf("mount --background: %v\n%s", err, out)
	}
	var pid int
	if _, err := fmt.Sscanf(out[strings.Index(out, "pid "):], "pid %d", &pid); err != nil {
		t.Fatalf("mount --background said %q", out)
	}
	t.Cleanup(func() { syscall.Kill(pid, syscall.SIGKILL); run("umount", "--lazy", mnt) })
	if b, err := os.ReadFile(filepath.Join(mnt, "org/m/w.bin")); err != nil || !bytes.Equal(b, data) {
		t.Fatalf("read through the background mount: %v", err)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 10*time.Second, func() (bool, string) {
		// Gone, or a zombie nobody reaps (its parent, mount --background, exited).
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		return err != nil || strings.Contains(string(b), ") Z "), "the killed daemon is still there"
	})
	if _, err := os.ReadDir(mnt); err == nil {
		t.Fatal("a mount whose daemon was killed still answers")
	}
	if out, err := run("umount", mnt); err != nil {
		t.Fatalf("umount after kill -9: %v\n%s", err, out)
	}
	if b, _ := os.ReadFile("/proc/mounts"); bytes.Contains(b, []byte(" "+mnt+" ")) {
		t.Fatal("still mounted after umount")
	}
}
