// Package dirlock keeps two processes from using one data directory: a
// second gd2fs server on a directory in use would take the same server id
// (the master would flip that id's address between the two) and its start-up
// scan could cut the live process's records. Lock takes an exclusive flock on
// DIR/gd2fs.lock and writes the holder's PID into it, so the refusal can name
// the process to stop.
//
// The lock is the kernel's: it goes when the process exits, however it
// exits (SIGKILL included), so a stale lock file never blocks a restart.
package dirlock

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// ErrInUse: another process holds the directory. It never crosses the
// wire (a local start-up failure), so it lives here rather than in errs.
var ErrInUse = errors.New("data directory in use")

// Name is the lock file's name inside a locked directory.
const Name = "gd2fs.lock"

// Lock is a held directory lock.
type Lock struct {
	f   *os.File
	dir string
}

// Acquire locks dir (creating it if needed) for this process. When another
// process holds it, the error wraps ErrInUse and names its PID.
func Acquire(dir string) (*Lock, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("data directory %s: %w", dir, err)
	}
	p := filepath.Join(dir, Name)
	f, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("lock data directory %s: %w", dir, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		defer f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w: %s is held by %s", ErrInUse, dir, holder(f))
		}
		return nil, fmt.Errorf("lock data directory %s: %w", dir, err)
	}
	// Ours: record who holds it, for the next one to name.
	if err := f.Truncate(0); err == nil {
		f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return &Lock{f: f, dir: dir}, nil
}

// holder describes the process named in the lock file.
func holder(f *os.File) string {
	b := make([]byte, 32)
	n, _ := f.ReadAt(b, 0)
	pid := strings.TrimSpace(string(b[:n]))
	if _, err := strconv.Atoi(pid); err != nil || pid == "" {
		return "another process"
	}
	return "process " + pid
}

// Dir is the locked directory.
func (l *Lock) Dir() string { return l.dir }

// Release lets the directory go. The lock file stays (it is only a name to
// lock); the next holder writes its own PID into it.
func (l *Lock) Release() error {
	if l == nil || l.f == nil {
		return nil
	}
	err := l.f.Close() // closing the last descriptor drops the flock
	l.f = nil
	return err
}

// AcquireAll locks every non-empty dir (a server's file and KV disk tiers),
// all or none; release lets them all go.
func AcquireAll(dirs ...string) (release func(), err error) {
	var held []*Lock
	release = func() {
		for _, l := range held {
			l.Release()
		}
	}
	seen := map[string]bool{}
	for _, d := range dirs {
		if d == "" {
			continue
		}
		abs, err := filepath.Abs(d)
		if err != nil {
			release()
			return nil, err
		}
		if seen[abs] {
			continue
		}
		seen[abs] = true
		l, err := Acquire(abs)
		if err != nil {
			release()
			return nil, err
		}
		held = append(held, l)
	}
	return release, nil
}
