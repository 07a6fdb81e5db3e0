package mount

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/gd2fs/gd2fs/client"
	"github.com/gd2fs/gd2fs/errs"
	"github.com/gd2fs/gd2fs/internal/cluster"
	"github.com/gd2fs/gd2fs/internal/cold"
	"github.com/gd2fs/gd2fs/internal/s3test"
	"github.com/gd2fs/gd2fs/internal/testutil"
	"github.com/gd2fs/gd2fs/internal/weights"
	"github.com/gd2fs/gd2fs/safetensors"
)

// needFUSE skips, saying why, where a FUSE mount cannot be made.
func needFUSE(t *testing.T) {
	t.Helper()
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skipf("no /dev/fuse (%v): FUSE tests need it (.ci/run installs fuse3; containers need --device /dev/fuse)", err)
	}
	if os.Geteuid() != 0 {
		if _, err := exec.LookPath("fusermount3"); err != nil {
			t.Skip("not root and no fusermount3: cannot mount FUSE")
		}
	}
}

type env struct {
	c   *cluster.Cluster
	cl  *client.Client // writes and checks
	s3  *s3test.Server
	src *cold.Source
}

func setup(t *testing.T, cold *cold.Config) *env {
	t.Helper()
	needFUSE(t)
	c, err := cluster.Start(context.Background(), cluster.Config{Dir: t.TempDir(), MemBytes: 256 << 20, Cold: cold})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	cl := c.Client()
	t.Cleanup(func() { cl.Close() })
	return &env{c: c, cl: cl}
}

// mountFS mounts root with its own client (so its read counters are the
// mount's alone) and unmounts at the end of the test.
func (e *env) mountFS(t *testing.T, o Options) (*FS, *client.Client) {
	t.Helper()
	cl, err := client.New(client.Config{Master: e.c.Master.URL(), MasterRetry: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	o.Client = cl
	dir := t.TempDir()
	m, err := Mount(dir, o)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { m.Wait(); close(done) }()
	t.Cleanup(func() {
		if err := m.Unmount(false); err != nil {
			t.Errorf("unmount: %v", err)
			m.Unmount(true)
		}
		<-done
	})
	return m, cl
}

func (e *env) put(t *testing.T, p string, b []byte) {
	t.Helper()
	f, err := e.cl.Create(context.Background(), p, client.CreateOptions{ChunkSize: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(b); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestReadSealedFiles(t *testing.T) {
	e := setup(t, nil)
	files := map[string][]byte{
		"/m/org/a/small.json":         []byte(`{"x": 1}`),
		"/m/org/a/big.bin":            testutil.RandomBytes(13<<20+12345, 1),
		"/m/org/a/sub/exact.bin":      testutil.RandomBytes(4<<20, 2),
		"/m/org/a/empty":              {},
		"/m/other/not-under-the-root": []byte("x"),
	}
	for p, b := range files {
		e.put(t, p, b)
	}
	m, _ := e.mountFS(t, Options{Root: "/m/org", BlockSize: 1 << 20, ReadAhead: 4 << 20})
	for p, want := range files {
		rel, ok := strings.CutPrefix(p, "/m/org/")
		if !ok {
			continue
		}
		local := filepath.Join(m.Dir(), rel)
		st, err := os.Stat(local)
		if err != nil {
			t.Fatal(err)
		}
		fi, _ := e.cl.Stat(context.Background(), p)
		if st.Size() != int64(len(want)) || !st.ModTime().Equal(fi.Modified) || st.Mode().Perm() != 0o444 {
			t.Fatalf("%s: stat %d bytes %v %v, want %d bytes %v 0444", rel, st.Size(), st.ModTime(), st.Mode(), len(want), fi.Modified)
		}
		got, err := os.ReadFile(local)
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("%s: %d bytes read (%v), want %d, equal %v", rel, len(got), err, len(want), bytes.Equal(got, want))
		}
	}
	var sfs unix.Statfs_t
	if err := unix.Statfs(m.Dir(), &sfs); err != nil || sfs.Blocks == 0 || sfs.Bavail > sfs.Blocks {
		t.Fatalf("statfs: %+v %v, want the cluster's capacity", sfs, err)
	}
	ents, err := os.ReadDir(filepath.Join(m.Dir(), "a"))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if strings.Join(names, ",") != "big.bin,empty,small.json,sub" {
		t.Fatalf("readdir: %v", names)
	}
	if _, err := os.Stat(filepath.Join(m.Dir(), "other")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a folder outside the root is visible: %v", err)
	}
	// Random reads at unaligned offsets across block boundaries.
	f, err := os.Open(filepath.Join(m.Dir(), "a/big.bin"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	want := files["/m/org/a/big.bin"]
	for _, r := range [][2]int{{0, 1}, {1<<20 - 7, 20}, {5<<20 + 3, 3 << 20}, {len(want) - 10, 10}, {len(want) - 1, 100}} {
		buf := make([]byte, r[1])
		n, _ := f.ReadAt(buf, int64(r[0]))
		end := min(r[0]+r[1], len(want))
		if !bytes.Equal(buf[:n], want[r[0]:end]) {
			t.Fatalf("ReadAt(%d, %d): %d bytes, wrong", r[0], r[1], n)
		}
	}
}

// pyLoad maps a safetensors file (mmap, as vLLM's loader does), makes a
// torch tensor of each entry straight over the mapped bytes, and prints
// each tensor's sha256 (checked against numpy's view of the same bytes).
const pyLoad = `
import sys, json, hashlib, mmap, numpy as np, torch
path = sys.argv[1]
dtypes = {"F32": torch.float32, "BF16": torch.bfloat16, "U8": torch.uint8}
with open(path, "rb") as f:
    mm = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
print("mapped", flush=True)
sys.stdin.readline()  # every loader has mapped the file: go
n = int.from_bytes(mm[:8], "little")
hdr = json.loads(mm[8:8+n])
raw = np.frombuffer(mm, dtype=np.uint8)
out = {}
for k, v in hdr.items():
    if k == "__metadata__":
        continue
    b, e = v["data_offsets"]
    view = raw[8+n+b:8+n+e]
    t = torch.frombuffer(view, dtype=dtypes[v["dtype"]]).reshape(v["shape"])
    h = hashlib.sha256(t.contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()
    if h != hashlib.sha256(view.tobytes()).hexdigest():
        print("numpy and torch disagree on", k, file=sys.stderr); sys.exit(1)
    out[k] = h
print(json.dumps(out))
`

// safetensorsFile builds a model file of about size bytes and the sha256
// of each tensor.
func safetensorsFile(t *testing.T, size int) ([]byte, map[string]string) {
	t.Helper()
	var ts []safetensors.Tensor
	var data [][]byte
	sums := map[string]string{}
	per := size / 4
	for i, dt := range []string{"F32", "BF16", "U8", "F32"} {
		el := map[string]int{"F32": 4, "BF16": 2, "U8": 1}[dt]
		n := per / el / 3 * 3
		b := testutil.RandomBytes(n*el, uint64(10+i))
		name := fmt.Sprintf("layer.%d.weight", i)
		ts = append(ts, safetensors.Tensor{Name: name, DType: dt, Shape: []int64{int64(n / 3), 3}})
		data = append(data, b)
		s := sha256.Sum256(b)
		sums[name] = hex.EncodeToString(s[:])
	}
	st, err := safetensors.Build(ts, data, map[string]string{"format": "pt"})
	if err != nil {
		t.Fatal(err)
	}
	return st, sums
}

func python(t *testing.T) string {
	t.Helper()
	const py = "/usr/bin/python3"
	if err := exec.Command(py, "-c", "import numpy, torch").Run(); err != nil {
		t.Skipf("%s lacks numpy or torch: %v", py, err)
	}
	return py
}

// loadTensors runs pyLoad in n processes at once and checks every tensor.
// All map the file before any reads it, as tensor-parallel workers do, so
// the loads overlap.
func loadTensors(t *testing.T, py, path string, n int, want map[string]string) {
	t.Helper()
	type proc struct {
		cmd    *exec.Cmd
		stdin  io.WriteCloser
		stdout *bufio.Reader
		stderr bytes.Buffer
	}
	ps := make([]*proc, n)
	for i := range ps {
		p := &proc{cmd: exec.Command(py, "-c", pyLoad, path)}
		p.cmd.Stderr = &p.stderr
		var err error
		if p.stdin, err = p.cmd.StdinPipe(); err != nil {
			t.Fatal(err)
		}
		out, err := p.cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		p.stdout = bufio.NewReader(out)
		if err := p.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.cmd.Process.Kill(); p.cmd.Wait() })
		ps[i] = p
	}
	for _, p := range ps {
		if line, err := p.stdout.ReadString('\n'); strings.TrimSpace(line) != "mapped" {
			p.cmd.Wait()
			t.Fatalf("loader: %q %v: %s", line, err, p.stderr.String())
		}
	}
	for _, p := range ps {
		io.WriteString(p.stdin, "go\n")
	}
	for _, p := range ps {
		line, rerr := p.stdout.ReadString('\n')
		if err := p.cmd.Wait(); err != nil || rerr != nil {
			t.Fatalf("loader: %v %v: %s", err, rerr, p.stderr.String())
		}
		var got map[string]string
		if err := json.Unmarshal([]byte(line), &got); err != nil {
			t.Fatalf("loader output %q: %v", line, err)
		}
		for k, v := range want {
			if got[k] != v {
				t.Fatalf("tensor %s: sha256 %s, want %s", k, got[k], v)
			}
		}
	}
}

// TestMmapEightProcesses: eight Python processes mmap one safetensors file
// through the mount at once, load every tensor with torch and numpy, see
// the right bytes, and the mount reads the file from the servers once.
func TestMmapEightProcesses(t *testing.T) {
	py := python(t)
	e := setup(t, nil)
	st, sums := safetensorsFile(t, 24<<20)
	e.put(t, "/models/org/m/model.safetensors", st)
	m, cl := e.mountFS(t, Options{Root: "/models"})
	loadTensors(t, py, filepath.Join(m.Dir(), "org/m/model.safetensors"), 8, sums)
	got := cl.ReadStats().FromServers
	ratio := float64(got) / float64(len(st))
	t.Logf("8 processes: %d bytes from servers for a %d-byte file (%.3fx)", got, len(st), ratio)
	if ratio > 1.1 {
		t.Fatalf("8 processes read %.2fx the file from servers: the page cache is not shared", ratio)
	}
	// A new open keeps the pages (FOPEN_KEEP_CACHE): mincore sees them
	// resident through a fresh mapping, and reading it all costs the
	// servers nothing.
	p := filepath.Join(m.Dir(), "org/m/model.safetensors")
	// (Not all: the kernel may reclaim clean pages on this shared machine;
	// an open that dropped them would leave none.)
	r := resident(t, p)
	t.Logf("after a new open, %.1f%% of the file is in the page cache", 100*r)
	if r < 0.5 {
		t.Fatalf("after a new open %.0f%% of the file is in the page cache: it was dropped", 100*r)
	}
	if b, err := os.ReadFile(p); err != nil || !bytes.Equal(b, st) {
		t.Fatalf("read after the loads: %v", err)
	}
}

// resident is the fraction of p's pages in the page cache, seen through a
// new open and mapping (mincore does not fault pages in).
func resident(t *testing.T, p string) float64 {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	st, _ := f.Stat()
	mm, err := unix.Mmap(int(f.Fd()), 0, int(st.Size()), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(mm)
	vec := make([]byte, (len(mm)+4095)/4096)
	if _, _, e := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&mm[0])), uintptr(len(mm)), uintptr(unsafe.Pointer(&vec[0]))); e != 0 {
		t.Fatal(e)
	}
	in := 0
	for _, v := range vec {
		in += int(v & 1)
	}
	return float64(in) / float64(len(vec))
}

// TestMmapWhileFilling: with the hot tier, processes map a file while its
// local copy is still being filled: they see the right bytes, and the fill
// and the readers share one read from the servers.
func TestMmapWhileFilling(t *testing.T) {
	py := python(t)
	e := setup(t, nil)
	st, sums := safetensorsFile(t, 24<<20)
	e.put(t, "/models/org/m/model.safetensors", st)
	cache := &weights.Cache{Dir: t.TempDir(), Quota: 1 << 30}
	m, cl := e.mountFS(t, Options{Root: "/models", Cache: cache})
	loadTensors(t, py, filepath.Join(m.Dir(), "org/m/model.safetensors"), 3, sums)
	got := cl.ReadStats().FromServers
	t.Logf("3 processes during the fill: %d bytes from servers for a %d-byte file (%.3fx)", got, len(st), float64(got)/float64(len(st)))
	if float64(got) > 1.1*float64(len(st)) {
		t.Fatalf("the fill and the readers read %.2fx the file from servers", float64(got)/float64(len(st)))
	}
}

// TestWriteThenReadSDK writes through the mount (os.WriteFile, cp-like
// io.Copy, torch.save) and reads each file back through the SDK.
func TestWriteThenReadSDK(t *testing.T) {
	e := setup(t, nil)
	if err := e.cl.Mkdir(context.Background(), "/w"); err != nil {
		t.Fatal(err)
	}
	m, _ := e.mountFS(t, Options{Root: "/w"})
	want := testutil.RandomBytes(40<<20+77, 3) // several write buffers
	p := filepath.Join(m.Dir(), "sub/out.bin")
	if err := os.Mkdir(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, want, 0o644); err != nil {
		t.Fatal(err)
	}
	fi, err := e.cl.Stat(context.Background(), "/w/sub/out.bin")
	if err != nil || !fi.Sealed || fi.Size != int64(len(want)) {
		t.Fatalf("after close: %+v %v, want sealed, %d bytes", fi, err, len(want))
	}
	f, err := e.cl.Open(context.Background(), "/w/sub/out.bin")
	if err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(want))
	if _, err := f.ReadAt(got, 0); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("SDK read of a file written through the mount differs (%v)", err)
	}
	// Read back through the mount too, and stat shows the sealed size.
	if b, err := os.ReadFile(p); err != nil || !bytes.Equal(b, want) {
		t.Fatalf("mount read-back differs: %v", err)
	}
	if py, err := exec.LookPath("/usr/bin/python3"); err == nil && exec.Command(py, "-c", "import torch").Run() == nil {
		out, err := exec.Command(py, "-c", `
import sys, torch
t = torch.arange(100000, dtype=torch.float32)
torch.save({"t": t}, sys.argv[1])
u = torch.load(sys.argv[1])["t"]
assert torch.equal(t, u)
`, filepath.Join(m.Dir(), "ckpt.pt")).CombinedOutput()
		if err != nil {
			t.Fatalf("torch.save through the mount: %v\n%s", err, out)
		}
		if fi, err := e.cl.Stat(context.Background(), "/w/ckpt.pt"); err != nil || !fi.Sealed || fi.Size == 0 {
			t.Fatalf("torch.save result: %+v %v", fi, err)
		}
	}
}

// TestErrnoTable checks each row of the table in doc.go.
func TestErrnoTable(t *testing.T) {
	e := setup(t, nil)
	e.put(t, "/e/sealed.bin", []byte("sealed bytes"))
	e.put(t, "/e/dir/inside", []byte("x"))
	m, _ := e.mountFS(t, Options{Root: "/e"})
	d := m.Dir()
	sealed := filepath.Join(d, "sealed.bin")
	is := func(what string, err, want error) {
		t.Helper()
		if !errors.Is(err, want) {
			t.Errorf("%s: %v, want %v", what, err, want)
		}
	}
	_, err := os.OpenFile(sealed, os.O_WRONLY, 0)
	is("open a sealed file for writing", err, syscall.EPERM)
	_, err = os.OpenFile(sealed, os.O_RDWR, 0)
	is("open a sealed file read-write", err, syscall.EPERM)
	_, err = os.OpenFile(sealed, os.O_WRONLY|os.O_TRUNC, 0)
	is("O_TRUNC of a sealed file", err, syscall.EPERM)
	is("truncate a sealed file", os.Truncate(sealed, 3), syscall.EPERM)
	is("rename (on the cluster; more in TestRename)", os.Rename(sealed, filepath.Join(d, "moved")), nil)
	is("rename back", os.Rename(filepath.Join(d, "moved"), sealed), nil)
	is("hard link", os.Link(sealed, filepath.Join(d, "hard")), syscall.EPERM)
	is("symlink", os.Symlink("sealed.bin", filepath.Join(d, "sym")), syscall.EPERM)
	is("mknod", syscall.Mknod(filepath.Join(d, "fifo"), syscall.S_IFIFO|0o644, 0), syscall.EPERM)
	is("setxattr", unix.Setxattr(sealed, "user.x", []byte("1"), 0), syscall.EOPNOTSUPP)
	_, err = os.Stat(filepath.Join(d, "missing"))
	is("stat a missing file", err, syscall.ENOENT)
	is("rmdir a folder with files", os.Remove(filepath.Join(d, "dir")), syscall.ENOTEMPTY)
	is("chmod (accepted, not stored)", os.Chmod(sealed, 0o600), nil)
	is("utimes (accepted, not stored)", os.Chtimes(sealed, time.Now(), time.Now()), nil)
	_, err = os.OpenFile(sealed, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
	is("O_EXCL create of an existing file", err, syscall.EEXIST)

	// A new file: sequential writes only, sealed at close.
	f, err := os.Create(filepath.Join(d, "new.bin"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write([]byte("hello ")); err != nil {
		t.Fatal(err)
	}
	_, err = f.WriteAt([]byte("x"), 100)
	is("write past the end (a hole)", err, syscall.EOPNOTSUPP)
	_, err = f.WriteAt([]byte("H"), 0)
	is("overwrite within a new file", err, syscall.EOPNOTSUPP)
	is("truncate a file being written to another size", f.Truncate(2), syscall.EOPNOTSUPP)
	is("fsync a file being written", f.Sync(), nil)
	if _, err := f.Write([]byte("world")); err != nil {
		t.Fatal(err)
	}
	_, err = unix.Mmap(int(f.Fd()), 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err == nil {
		t.Error("shared writable mmap of a file being written: allowed, want an error")
	}
	is("fallocate", unix.Fallocate(int(f.Fd()), 0, 0, 1<<20), syscall.EOPNOTSUPP)
	dup, err := unix.Dup(int(f.Fd()))
	if err != nil {
		t.Fatal(err)
	}
	is("close seals", f.Close(), nil)
	_, err = unix.Write(dup, []byte("more"))
	is("write through a dup after the first close", err, syscall.EPERM)
	unix.Close(dup)
	rw, err := os.OpenFile(filepath.Join(d, "rw.bin"), os.O_CREATE|os.O_EXCL|os.O_RDWR, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	rw.Write([]byte("abc"))
	_, err = rw.ReadAt(make([]byte, 3), 0)
	is("read through the handle that is writing", err, syscall.EOPNOTSUPP)
	is("close of an O_RDWR create", rw.Close(), nil)
	if b, err := os.ReadFile(filepath.Join(d, "new.bin")); err != nil || string(b) != "hello world" {
		t.Fatalf("new file: %q %v", b, err)
	}
	_, err = os.OpenFile(filepath.Join(d, "new.bin"), os.O_WRONLY|os.O_APPEND, 0)
	is("append to a sealed file", err, syscall.EPERM)
	is("unlink", os.Remove(filepath.Join(d, "new.bin")), nil)
	// The kernel sends the release of ReadFile's close after close(2)
	// returned: until it arrives the file counts as open here, and the
	// unlink removes it on the cluster when it does (unlinkLater).
	testutil.Eventually(t, 10*time.Second, func() (bool, string) {
		_, err := e.cl.Stat(context.Background(), "/e/new.bin")
		return err != nil, "unlink through the mount left the file on the cluster"
	})
	if _, err := os.Stat(filepath.Join(d, "new.bin")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the unlinked name through the mount: %v", err)
	}
	is("mkdir", os.Mkdir(filepath.Join(d, "made"), 0o755), nil)
	is("mkdir of an existing folder", os.Mkdir(filepath.Join(d, "made"), 0o755), syscall.EEXIST)
	is("rmdir an empty folder", os.Remove(filepath.Join(d, "made")), nil)

	// A read-only mount refuses every write with EROFS.
	ro, _ := e.mountFS(t, Options{Root: "/e", ReadOnly: true})
	_, err = os.Create(filepath.Join(ro.Dir(), "x"))
	is("create on a read-only mount", err, syscall.EROFS)
	is("mkdir on a read-only mount", os.Mkdir(filepath.Join(ro.Dir(), "x"), 0o755), syscall.EROFS)
	is("unlink on a read-only mount", os.Remove(filepath.Join(ro.Dir(), "sealed.bin")), syscall.EROFS)
	is("rename on a read-only mount", os.Rename(filepath.Join(ro.Dir(), "sealed.bin"), filepath.Join(ro.Dir(), "x")), syscall.EROFS)
}

// TestLinkedFileDeadServer reads a file linked to S3 through the mount
// while one server is dead: the SDK's failover and refill make it
// invisible.
func TestLinkedFileDeadServer(t *testing.T) {
	s3 := s3test.Start("AKID", "secret")
	t.Cleanup(s3.Close)
	s3.CreateBucket("models")
	want := testutil.RandomBytes(9<<20+5, 4)
	s3.Put("models", "org/m/w.bin", want)
	cc := cold.Config{Endpoint: s3.URL, AccessKey: "AKID", SecretKey: "secret", Region: "us-east-1"}
	src, err := cold.New(cc)
	if err != nil {
		t.Fatal(err)
	}
	e := setup(t, &cc)
	ctx := context.Background()
	if _, err := weights.Link(ctx, e.cl, src, "s3://models/org/m", "/l/org/m", client.LinkOptions{ChunkSize: 1 << 20}); err != nil {
		t.Fatal(err)
	}
	cache := &weights.Cache{Dir: t.TempDir()}
	plain, _ := e.mountFS(t, Options{Root: "/l", BlockSize: 1 << 20})
	hot, _ := e.mountFS(t, Options{Root: "/l", Cache: cache})
	e.c.Servers[0].Close()
	for _, m := range []*FS{plain, hot} {
		got, err := os.ReadFile(filepath.Join(m.Dir(), "org/m/w.bin"))
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("linked file with a dead server: %d bytes, %v (equal %v)", len(got), err, bytes.Equal(got, want))
		}
	}
	// The hot tier's copy of a linked file is checked and its sha256
	// recorded on the master, as warmup does.
	sum := sha256.Sum256(want)
	testutil.Eventually(t, 20*time.Second, func() (bool, string) {
		fi, err := e.cl.Stat(ctx, "/l/org/m/w.bin")
		return err == nil && fi.Attrs["sha256"] == hex.EncodeToString(sum[:]), fmt.Sprint(fi.Attrs, err)
	})
	if b, err := os.ReadFile(filepath.Join(cache.Dir, "models--org--m", "blobs", hex.EncodeToString(sum[:]))); err != nil || !bytes.Equal(b, want) {
		t.Fatalf("the cached copy of a linked file: %v", err)
	}
}

// TestMasterDown: with the master gone, an open that needs it fails with
// EIO after the client's retry window (2s here), never hangs; a file
// already open keeps reading from the servers.
func TestMasterDown(t *testing.T) {
	e := setup(t, nil)
	want := testutil.RandomBytes(3<<20, 5)
	e.put(t, "/d/open.bin", want)
	e.put(t, "/d/later.bin", want)
	m, _ := e.mountFS(t, Options{Root: "/d", BlockSize: 1 << 20, ReadAhead: -1})
	f, err := os.Open(filepath.Join(m.Dir(), "open.bin"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	e.c.Master.Close()
	start := time.Now()
	_, err = os.Stat(filepath.Join(m.Dir(), "later.bin"))
	if !errors.Is(err, syscall.EIO) {
		t.Fatalf("stat with the master down: %v, want EIO", err)
	}
	t.Logf("EIO after %v", time.Since(start).Round(time.Millisecond))
	buf := make([]byte, len(want))
	if _, err := f.ReadAt(buf, 0); err != nil || !bytes.Equal(buf, want) {
		t.Fatalf("an open file with the master down: %v", err)
	}
}

// TestHotCache: with --cache the first read fills the local copy; a later
// open is served from it (passthrough where the kernel allows it: then the
// daemon sees no reads at all), the servers are not asked again, and the
// cache holds the blob under the model's folder.
func TestHotCache(t *testing.T) {
	e := setup(t, nil)
	want := testutil.RandomBytes(11<<20+3, 6)
	e.put(t, "/h/org/m/w.bin", want)
	cache := &weights.Cache{Dir: t.TempDir(), Quota: 1 << 30}
	m, cl := e.mountFS(t, Options{Root: "/h", Cache: cache})
	pt, why := m.Passthrough()
	t.Logf("passthrough %v (%s)", pt, why)
	p := filepath.Join(m.Dir(), "org/m/w.bin")
	cold, err := os.Open(p) // held open (a plain handle) past the fill
	if err != nil {
		t.Fatal(err)
	}
	if b, err := io.ReadAll(cold); err != nil || !bytes.Equal(b, want) {
		t.Fatalf("cold read: %v", err)
	}
	sum := sha256.Sum256(want)
	blob := filepath.Join(cache.Dir, "models--org--m", "blobs", hex.EncodeToString(sum[:]))
	testutil.Eventually(t, 20*time.Second, func() (bool, string) {
		_, err := os.Stat(blob)
		return err == nil, fmt.Sprint(err)
	})
	// The file is hot now, but a plain handle is open: the kernel refuses
	// a passthrough open of the inode then (EIO), so this one must be plain.
	second, err := os.Open(p)
	if err != nil {
		t.Fatalf("open of a hot file while a plain handle is open: %v", err)
	}
	unix.Fadvise(int(second.Fd()), 0, 0, unix.FADV_DONTNEED)
	if b, err := io.ReadAll(second); err != nil || !bytes.Equal(b, want) {
		t.Fatalf("read of a hot file beside a plain handle: %v", err)
	}
	n := m.node(t, "org/m/w.bin")
	n.mu.Lock()
	pts := n.pt
	n.mu.Unlock()
	if pts != 0 {
		t.Fatalf("%d passthrough handles beside a plain one", pts)
	}
	if st := m.Stats(); st.PassthroughOpens != 0 || st.PlainOpens != 2 || (pt && st.PassthroughRefused != 1) {
		t.Fatalf("opens counted: %d passthrough, %d plain, %d kept plain beside a plain handle; want 0, 2, 1 (passthrough %v)",
			st.PassthroughOpens, st.PlainOpens, st.PassthroughRefused, pt)
	}
	second.Close()
	cold.Close()
	// The fill and the reads shared the bytes: at most one extra pass.
	before := cl.ReadStats().FromServers
	if before > 2*int64(len(want)) {
		t.Fatalf("%d bytes from servers for an %d-byte file read once and cached", before, len(want))
	}
	// Drop the mount's page cache, wait for the inode's handles to be
	// released, and read again.
	testutil.Eventually(t, 10*time.Second, func() (bool, string) {
		n := m.node(t, "org/m/w.bin")
		n.mu.Lock()
		defer n.mu.Unlock()
		return n.opens == 0 && n.blobPath != "", fmt.Sprintf("opens %d blob %q", n.opens, n.blobPath)
	})
	for i := 0; i < 2; i++ {
		f, err := os.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED)
		reads := m.stats.reads.Load()
		// Every open of the hot file, the first after the fill too, is a
		// passthrough open where the kernel has it (counted by the time
		// open returns).
		if st := m.Stats(); pt && (st.PassthroughOpens != int64(i+1) || st.PlainOpens != 2) {
			t.Fatalf("hot open %d: %d passthrough opens, %d plain; want %d and 2", i+1, st.PassthroughOpens, st.PlainOpens, i+1)
		}
		got := make([]byte, len(want))
		if _, err := f.ReadAt(got, 0); err != nil || !bytes.Equal(got, want) {
			t.Fatalf("hot read: %v", err)
		}
		mm, err := unix.Mmap(int(f.Fd()), 0, len(want), unix.PROT_READ, unix.MAP_SHARED)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(mm, want) {
			t.Fatal("hot mmap differs")
		}
		unix.Munmap(mm)
		if pt && m.stats.reads.Load() != reads {
			t.Fatalf("passthrough on, yet the daemon served %d reads of a hot file", m.stats.reads.Load()-reads)
		}
		f.Close()
	}
	if after := cl.ReadStats().FromServers; after != before {
		t.Fatalf("hot reads asked the servers for %d bytes", after-before)
	}
}

// node finds the file inode at rel under the mount (already looked up).
func (m *FS) node(t *testing.T, rel string) *fileNode {
	t.Helper()
	in := &m.root.Inode
	for _, part := range strings.Split(rel, "/") {
		if in = in.GetChild(part); in == nil {
			t.Fatalf("%s: not looked up", rel)
		}
	}
	return in.Operations().(*fileNode)
}

// TestBlockMemoryBound: with the read-ahead memory nearly spent, reads
// are still right (blocks a read waits for are fetched regardless), and
// once every handle is closed the mount holds no block bytes.
func TestBlockMemoryBound(t *testing.T) {
	e := setup(t, nil)
	want := [][]byte{testutil.RandomBytes(9<<20+1, 8), testutil.RandomBytes(7<<20, 9)}
	e.put(t, "/b/one", want[0])
	e.put(t, "/b/two", want[1])
	m, _ := e.mountFS(t, Options{Root: "/b", BlockSize: 1 << 20, ReadAhead: 8 << 20, Memory: 2 << 20})
	errc := make(chan error, 2)
	for i, name := range []string{"one", "two"} {
		go func() {
			b, err := os.ReadFile(filepath.Join(m.Dir(), name))
			if err == nil && !bytes.Equal(b, want[i]) {
				err = fmt.Errorf("%s: wrong bytes", name)
			}
			errc <- err
		}()
	}
	for range 2 {
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
	}
	testutil.Eventually(t, 10*time.Second, func() (bool, string) {
		return m.mem.Load() == 0, fmt.Sprintf("%d block bytes held with no file open", m.mem.Load())
	})
}

// TestSequentialReadOnce: cold sequential reads through the mount (cat's
// 1 MiB reads under the kernel's 64 MiB read-ahead) ask the servers for
// every byte of the file once: read-ahead drops no block before the
// kernel has had it, and fetches none twice. One reader over the file, and
// two over its halves at once (a loader reading tensors in parallel).
// (The first reader kept blocks least recently used first, up to a bound
// the kernel's read-ahead outran: one reader 1.0-1.3x, two 1.9-2.4x.)
func TestSequentialReadOnce(t *testing.T) {
	e := setup(t, nil)
	want := testutil.RandomBytes(192<<20+12345, 11)
	f, err := e.cl.Create(context.Background(), "/s/big", client.CreateOptions{Pool: "perf"}) // one copy, the default chunk size (as gd2fs-bench mount)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(want); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	for _, streams := range []int{1, 2} {
		t.Run(fmt.Sprintf("%d readers", streams), func(t *testing.T) {
			m, cl := e.mountFS(t, Options{Root: "/s"}) // a fresh page cache
			errc := make(chan error, streams)
			hs := make([][]byte, streams)
			for s := range streams {
				go func() {
					r, err := os.Open(filepath.Join(m.Dir(), "big"))
					if err != nil {
						errc <- err
						return
					}
					defer r.Close()
					lo, hi := int64(len(want))*int64(s)/int64(streams), int64(len(want))*int64(s+1)/int64(streams)
					h := sha256.New()
					_, err = io.CopyBuffer(h, io.NewSectionReader(r, lo, hi-lo), make([]byte, 1<<20))
					hs[s] = h.Sum(nil)
					if exp := sha256.Sum256(want[lo:hi]); err == nil && !bytes.Equal(hs[s], exp[:]) {
						err = fmt.Errorf("bytes %d-%d: the read through the mount returned other bytes", lo, hi)
					}
					errc <- err
				}()
			}
			for range streams {
				if err := <-errc; err != nil {
					t.Fatal(err)
				}
			}
			// Blocks the kernel asked for again (its page cache dropped
			// them: on a shared machine another process's drop_caches)
			// are fetched again rightly; they are not the reader's.
			got, st := cl.ReadStats().FromServers, m.Stats()
			ratio := float64(got-st.Reasked) / float64(len(want))
			t.Logf("%d bytes from servers for a %d-byte file, %d of them asked again by the kernel (%.3fx without those); %d read requests of %d bytes on average, the largest %d, %d waited for a fetch; %d blocks fetched, %d failed, %d bytes dropped unread",
				got, len(want), st.Reasked, ratio, st.Reads, st.ReadBytes/max(st.Reads, 1), st.LargestRead, st.Waited, st.Blocks, st.FetchErrors, st.DroppedUnread)
			if ratio > 1.05 {
				t.Fatalf("%d sequential readers fetched %.2fx the file from the servers (%d bytes of blocks dropped before the kernel asked for them)", streams, ratio, st.DroppedUnread)
			}
		})
	}
}

// TestUnlinkOpenFile: a file unlinked through the mount while a process
// has it open keeps reading whole (POSIX); the name is gone at once, and
// the file is removed on the cluster when the last descriptor closes.
// (Before, the unlink removed it on the cluster at once, and the servers
// free a removed file's chunks at their next heartbeat: reads then fail.)
func TestUnlinkOpenFile(t *testing.T) {
	e := setup(t, nil)
	want := testutil.RandomBytes(6<<20+5, 21)
	e.put(t, "/u/f.bin", want)
	m, _ := e.mountFS(t, Options{Root: "/u"})
	p := filepath.Join(m.Dir(), "f.bin")
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	head := make([]byte, 4096)
	if _, err := io.ReadFull(f, head); err != nil || !bytes.Equal(head, want[:4096]) {
		t.Fatalf("read before the unlink: %v", err)
	}
	if err := os.Remove(p); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("stat after unlink: %v, want ENOENT", err)
	}
	if es, err := os.ReadDir(m.Dir()); err != nil || len(es) != 0 {
		t.Fatalf("the folder after unlink: %v %v, want empty", es, err)
	}
	if _, err := e.cl.Stat(context.Background(), "/u/f.bin"); err != nil {
		t.Fatalf("the file on the cluster while still open here: %v (removed: its chunks go at the next heartbeat, and the open reader with them)", err)
	}
	rest, err := io.ReadAll(f)
	if err != nil || !bytes.Equal(rest, want[4096:]) {
		t.Fatalf("the open file after its unlink: %d bytes, %v", len(rest), err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	// The kernel sends the release after close returns.
	testutil.Eventually(t, 10*time.Second, func() (bool, string) {
		_, err := e.cl.Stat(context.Background(), "/u/f.bin")
		return errors.Is(err, errs.ErrNotFound), fmt.Sprintf("stat on the cluster after the last close: %v, want not found", err)
	})
	// The name is free again.
	if err := os.WriteFile(p, []byte("new"), 0o644); err != nil {
		t.Fatal(err)
	}
}
