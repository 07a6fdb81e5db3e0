package mount

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/gd2fs/gd2fs/client"
	"github.com/gd2fs/gd2fs/errs"
	"github.com/gd2fs/gd2fs/internal/testutil"
	"github.com/gd2fs/gd2fs/internal/weights"
)

// sdkBytes reads p whole through the SDK.
func (e *env) sdkBytes(t *testing.T, p string) []byte {
	t.Helper()
	f, err := e.cl.Open(context.Background(), p)
	if err != nil {
		t.Fatalf("open %s through the SDK: %v", p, err)
	}
	var b bytes.Buffer
	if _, err := f.WriteTo(&b); err != nil {
		t.Fatalf("read %s through the SDK: %v", p, err)
	}
	return b.Bytes()
}

// hfDownload is huggingface_hub's download, as file_download.py does it:
// the bytes go to <blob>.incomplete opened "ab", then _chmod_and_replace
// touches a temporary file two levels up for its mode, chmods the
// incomplete file, and shutil.move()s it over the blob (os.rename, which
// replaces a blob already there).
const hfDownload = `
import os, shutil, stat, sys, uuid
from pathlib import Path
dst, data = sys.argv[1], open(sys.argv[2], "rb").read()
incomplete = dst + ".incomplete"
with open(incomplete, "ab") as f:
    for i in range(0, len(data), 1 << 20):
        f.write(data[i:i + (1 << 20)])
tmp = Path(dst).parent.parent / f"tmp_{uuid.uuid4()}"
try:
    tmp.touch()
    mode = tmp.stat().st_mode
    os.chmod(incomplete, stat.S_IMODE(mode))
finally:
    tmp.unlink()
shutil.move(incomplete, dst)
assert not os.path.exists(incomplete)
os.replace(dst, dst + ".replaced")
os.replace(dst + ".replaced", dst)
`

// TestRename: renames through a real mount are renames on the cluster
// (nothing copied): write x.incomplete and rename it, huggingface_hub's
// download in Python over an existing blob, a folder with its files, and
// the refusals (a file being written, RENAME_NOREPLACE, RENAME_EXCHANGE).
func TestRename(t *testing.T) {
	e := setup(t, nil)
	ctx := context.Background()
	old := testutil.RandomBytes(3<<20+7, 1)
	e.put(t, "/r/m/blobs/abc", old)
	m, _ := e.mountFS(t, Options{Root: "/r"})
	d := m.Dir()
	is := func(what string, err, want error) {
		t.Helper()
		if !errors.Is(err, want) {
			t.Errorf("%s: %v, want %v", what, err, want)
		}
	}

	// Written through the mount, renamed, read through the SDK.
	data := testutil.RandomBytes(5<<20+3, 2)
	if err := os.WriteFile(filepath.Join(d, "x.incomplete"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	st, err := e.cl.Stat(ctx, "/r/x.incomplete")
	if err != nil {
		t.Fatal(err)
	}
	is("rename a closed file", os.Rename(filepath.Join(d, "x.incomplete"), filepath.Join(d, "x")), nil)
	if got := e.sdkBytes(t, "/r/x"); !bytes.Equal(got, data) {
		t.Fatal("the renamed file reads other bytes through the SDK")
	}
	if now, err := e.cl.Stat(ctx, "/r/x"); err != nil || now.ID != st.ID {
		t.Fatalf("the renamed file is %+v %v, want file %d (a rename, not a copy)", now, err, st.ID)
	}
	if _, err := e.cl.Stat(ctx, "/r/x.incomplete"); !errors.Is(err, errs.ErrNotFound) {
		t.Fatalf("the old name on the cluster: %v", err)
	}
	_, err = os.Stat(filepath.Join(d, "x.incomplete"))
	is("stat the old name", err, syscall.ENOENT)
	if got, err := os.ReadFile(filepath.Join(d, "x")); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("the renamed file through the mount: %v", err)
	}

	// huggingface_hub's download, over a blob a process here read before.
	blob := filepath.Join(d, "m", "blobs", "abc")
	if got, err := os.ReadFile(blob); err != nil || !bytes.Equal(got, old) {
		t.Fatalf("the old blob: %v", err)
	}
	newer := testutil.RandomBytes(len(old), 3) // the same size: only the bytes tell them apart
	src := filepath.Join(t.TempDir(), "download")
	if err := os.WriteFile(src, newer, 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("/usr/bin/python3", "-c", hfDownload, blob, src).CombinedOutput(); err != nil {
		t.Fatalf("huggingface_hub's download pattern through the mount: %v\n%s", err, out)
	}
	if got := e.sdkBytes(t, "/r/m/blobs/abc"); !bytes.Equal(got, newer) {
		t.Fatal("after the download, the SDK reads other bytes")
	}
	if got, err := os.ReadFile(blob); err != nil || !bytes.Equal(got, newer) {
		t.Fatalf("after the download, the mount reads other bytes (%v)", err)
	}

	// A folder moves with its files, nothing copied.
	is("rename a folder", os.Rename(filepath.Join(d, "m"), filepath.Join(d, "m2")), nil)
	if got, err := os.ReadFile(filepath.Join(d, "m2", "blobs", "abc")); err != nil || !bytes.Equal(got, newer) {
		t.Fatalf("a file of the moved folder through the mount: %v", err)
	}
	if got := e.sdkBytes(t, "/r/m2/blobs/abc"); !bytes.Equal(got, newer) {
		t.Fatal("a file of the moved folder through the SDK")
	}
	// A file created in the moved folder lands under its new path.
	if err := os.WriteFile(filepath.Join(d, "m2", "blobs", "new"), []byte("n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := e.sdkBytes(t, "/r/m2/blobs/new"); string(got) != "n" {
		t.Fatalf("a file made in a moved folder: %q", got)
	}

	// Refusals.
	f, err := os.Create(filepath.Join(d, "w"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write([]byte("partial")); err != nil {
		t.Fatal(err)
	}
	is("rename a file being written here", os.Rename(filepath.Join(d, "w"), filepath.Join(d, "w2")), syscall.EBUSY)
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	other, err := e.cl.Create(ctx, "/r/elsewhere", client.CreateOptions{Pool: "perf"})
	if err != nil {
		t.Fatal(err)
	}
	is("rename a file another client is writing", os.Rename(filepath.Join(d, "elsewhere"), filepath.Join(d, "e2")), syscall.EBUSY)
	other.Close()
	is("RENAME_NOREPLACE onto a file", unix.Renameat2(unix.AT_FDCWD, filepath.Join(d, "w"), unix.AT_FDCWD, filepath.Join(d, "x"), unix.RENAME_NOREPLACE), syscall.EEXIST)
	is("RENAME_EXCHANGE", unix.Renameat2(unix.AT_FDCWD, filepath.Join(d, "w"), unix.AT_FDCWD, filepath.Join(d, "x"), unix.RENAME_EXCHANGE), syscall.EINVAL)
	// unix.Rename: os.Rename answers EEXIST itself when the target is a folder.
	is("rename a file onto a folder", unix.Rename(filepath.Join(d, "w"), filepath.Join(d, "m2")), syscall.EISDIR)
	if err := os.MkdirAll(filepath.Join(d, "full", "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	is("rename a folder onto a folder with entries", unix.Rename(filepath.Join(d, "m2"), filepath.Join(d, "full")), syscall.ENOTEMPTY)
	is("rename a folder onto an empty folder", unix.Rename(filepath.Join(d, "m2"), filepath.Join(d, "full", "sub")), nil)
	if got := e.sdkBytes(t, "/r/full/sub/blobs/abc"); !bytes.Equal(got, newer) {
		t.Fatal("a file of a folder moved onto an empty folder")
	}
	is("rename a file over a file", os.Rename(filepath.Join(d, "w"), filepath.Join(d, "x")), nil)
	if got, err := os.ReadFile(filepath.Join(d, "x")); err != nil || string(got) != "partial" {
		t.Fatalf("the file renamed over x: %q %v", got, err)
	}
}

// TestReplacedUnderKernel: a file replaced on the cluster by another
// client (a rename over it) while the kernel still has the old inode and
// part of its pages: an open must not fill the rest of the old inode's
// page cache from the new file (a mix of two files). The mount answers
// ESTALE, the kernel looks the name up again and reads the new file.
func TestReplacedUnderKernel(t *testing.T) {
	e := setup(t, nil)
	ctx := context.Background()
	old := testutil.RandomBytes(4<<20, 4)
	e.put(t, "/s/f", old)
	m, _ := e.mountFS(t, Options{Root: "/s"})
	p := filepath.Join(m.Dir(), "f")
	fd, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fd.Read(make([]byte, 1<<20)); err != nil { // the first MiB (and the kernel's readahead) in the page cache
		t.Fatal(err)
	}
	// Keep the first MiB, drop the rest.
	if err := unix.Fadvise(int(fd.Fd()), 1<<20, 0, unix.FADV_DONTNEED); err != nil {
		t.Fatal(err)
	}
	fd.Close()
	newer := testutil.RandomBytes(len(old), 5)
	e.put(t, "/s/f.incomplete", newer)
	if _, err := e.cl.Rename(ctx, "/s/f.incomplete", "/s/f", client.RenameOptions{}); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(p) // within --attr-timeout: the kernel still knows the old inode
	if err != nil {
		t.Fatal(err)
	}
	switch {
	case bytes.Equal(got, newer), bytes.Equal(got, old):
	case bytes.Equal(got[:1<<20], old[:1<<20]) && bytes.Equal(got[1<<20:], newer[1<<20:]):
		t.Fatal("read the old file's cached first MiB and the new file's rest: two files mixed")
	default:
		t.Fatal("read bytes of neither file")
	}
}

// TestFillOfReplacedFile: a hot-tier fill started for a file whose name
// another file took since (renamed over it) must cache nothing, nor record
// the new file's sha256 as the old one's: the old inode would read the new
// bytes from the cache.
func TestFillOfReplacedFile(t *testing.T) {
	e := setup(t, nil)
	ctx := context.Background()
	e.put(t, "/h/org/m/w.bin", testutil.RandomBytes(2<<20, 6))
	fi, err := e.cl.Stat(ctx, "/h/org/m/w.bin")
	if err != nil {
		t.Fatal(err)
	}
	e.put(t, "/h/org/m/w.bin.incomplete", testutil.RandomBytes(2<<20, 7))
	if _, err := e.cl.Rename(ctx, "/h/org/m/w.bin.incomplete", "/h/org/m/w.bin", client.RenameOptions{}); err != nil {
		t.Fatal(err)
	}
	cache := &weights.Cache{Dir: t.TempDir(), Quota: 1 << 30}
	f := cache.StartFill(ctx, e.cl, fi)
	<-f.Done()
	if blob, err := f.Result(); err == nil {
		t.Fatalf("a fill of a replaced file cached %s", blob)
	}
	if now, err := e.cl.Stat(ctx, "/h/org/m/w.bin"); err != nil || now.Attrs["sha256"] != "" {
		t.Fatalf("the new file got a sha256 from the old one's fill: %v %v", now.Attrs, err)
	}
}

// TestChangesIgnoreInterrupts: the kernel interrupts a FUSE request when
// the calling thread takes any signal (a Go program's threads take SIGURG
// many times a second), and go-fuse then cancels the request's context. A
// change to the namespace must still be made and answered as made: an
// EINTR for a rename the master already did sends os.Rename's retry to
// ENOENT. Each change here runs with its request's context already
// cancelled.
func TestChangesIgnoreInterrupts(t *testing.T) {
	e := setup(t, nil)
	ctx := context.Background()
	e.put(t, "/i/a", []byte("a"))
	e.put(t, "/i/gone", []byte("g"))
	m, _ := e.mountFS(t, Options{Root: "/i"})
	interrupted, cancel := context.WithCancel(ctx)
	cancel()
	if _, errno := m.root.Mkdir(interrupted, "d", 0o755, &fuse.EntryOut{}); errno != 0 {
		t.Fatalf("mkdir, interrupted: %v", errno)
	}
	if errno := m.root.Rename(interrupted, "a", m.root, "b", 0); errno != 0 {
		t.Fatalf("rename, interrupted: %v", errno)
	}
	if errno := m.root.Unlink(interrupted, "gone"); errno != 0 {
		t.Fatalf("unlink, interrupted: %v", errno)
	}
	if errno := m.root.Rmdir(interrupted, "d"); errno != 0 {
		t.Fatalf("rmdir, interrupted: %v", errno)
	}
	if got := e.sdkBytes(t, "/i/b"); string(got) != "a" {
		t.Fatalf("the renamed file reads %q", got)
	}
	for _, p := range []string{"/i/a", "/i/gone", "/i/d"} {
		if _, err := e.cl.Stat(ctx, p); !errors.Is(err, errs.ErrNotFound) {
			t.Errorf("%s after the interrupted changes: %v, want not found", p, err)
		}
	}
}
