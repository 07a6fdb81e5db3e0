package dirlock

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestSecondHolderRefused: a second Acquire (another open file description,
// as another process has) is refused naming the holder's PID; after Release
// the directory can be taken again.
func TestSecondHolderRefused(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	l, err := Acquire(dir)
	if err != nil {
		t.Fatal(err)
	}
	_, err = Acquire(dir)
	if !errors.Is(err, ErrInUse) || !strings.Contains(err.Error(), fmt.Sprintf("process %d", os.Getpid())) {
		t.Fatalf("second Acquire: %v, want ErrInUse naming pid %d", err, os.Getpid())
	}
	if err := l.Release(); err != nil {
		t.Fatal(err)
	}
	l2, err := Acquire(dir)
	if err != nil {
		t.Fatalf("after Release: %v", err)
	}
	l2.Release()
}

// TestLockHeldByAnotherProcess: flock(1) in a child process holds the lock
// file; Acquire is refused while it runs and succeeds once it has exited (a
// killed holder leaves no stale lock).
func TestLockHeldByAnotherProcess(t *testing.T) {
	flock, err := exec.LookPath("flock")
	if err != nil {
		t.Skip("flock(1) not installed")
	}
	dir := t.TempDir()
	p := filepath.Join(dir, Name)
	if err := os.WriteFile(p, []byte("4242\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(flock, p, "sh", "-c", "echo locked; cat >/dev/null")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 7)
	if _, err := out.Read(buf); err != nil { // "locked": the child holds it now
		t.Fatal(err)
	}
	if _, err := Acquire(dir); !errors.Is(err, ErrInUse) || !strings.Contains(err.Error(), "process 4242") {
		t.Fatalf("Acquire while another process holds it: %v", err)
	}
	stdin.Close()
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
	l, err := Acquire(dir)
	if err != nil {
		t.Fatalf("after the holder exited: %v", err)
	}
	b, _ := os.ReadFile(p)
	if strings.TrimSpace(string(b)) != fmt.Sprint(os.Getpid()) {
		t.Fatalf("lock file holds %q, want our pid", b)
	}
	l.Release()
}
