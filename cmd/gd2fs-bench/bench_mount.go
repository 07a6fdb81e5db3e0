package main

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/gd2fs/gd2fs/client"
	"github.com/gd2fs/gd2fs/internal/cluster"
	"github.com/gd2fs/gd2fs/internal/mount"
	"github.com/gd2fs/gd2fs/internal/weights"
	"github.com/gd2fs/gd2fs/safetensors"
)

func newBenchMount() *cobra.Command {
	var size string
	var readers int
	cmd := &cobra.Command{
		Use:   "mount",
		Short: "gd2fs mount: sequential read cold/hot vs gd2fs cat and fio, 8 mmap readers, tensor load vs a local folder",
		Long: `Benchmarks of the FUSE mount (docs/mount.md), each beside its reference: a sequential read
of one file through the mount from the servers beside the SDK's read (what gd2fs cat does) to
/dev/null; the same from the local hot cache (passthrough where the kernel has it) beside fio
on the same disk; random 4 KiB reads of a hot file through mmap beside mmap of the local copy;
N processes mapping one file (bytes from servers / file size); the time to load every tensor
of a safetensors file with torch through the mount beside the same from a local folder. The
page cache is dropped before each read (needs root; said when it cannot be). Needs /dev/fuse.`,
		Example: `  gd2fs-bench mount                 # a 1 GiB file
  gd2fs-bench mount --size 256MiB --readers 8`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			total, err := parseSize(size)
			if err != nil {
				return err
			}
			return benchMount(total, readers)
		},
	}
	cmd.Flags().StringVar(&size, "size", "1GiB", "file size")
	cmd.Flags().IntVar(&readers, "readers", 8, "processes mapping one file")
	// The reader processes of the mmap test run this hidden command.
	cmd.AddCommand(&cobra.Command{Use: "mmap-reader FILE", Hidden: true, Args: cobra.ExactArgs(1),
		RunE: func(_ *cobra.Command, args []string) error { return mmapTouch(args[0]) }})
	return cmd
}

func benchMount(total int64, readers int) error {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "gd2fs-benchmount-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	c, err := cluster.Start(ctx, cluster.Config{Dir: filepath.Join(dir, "cluster"), MemBytes: total + 256<<20, DiskBytes: 4 * total})
	if err != nil {
		return err
	}
	defer c.Close()
	cl := c.Client()
	defer cl.Close()
	// A safetensors file of four tensors.
	var ts []safetensors.Tensor
	var data [][]byte
	per := total / 4 / 4 * 4
	for i := 0; i < 4; i++ {
		b := make([]byte, per)
		r := rand.New(rand.NewPCG(uint64(i), 1))
		for j := 0; j+8 <= len(b); j += 8 {
			v := r.Uint64()
			for k := 0; k < 8; k++ {
				b[j+k] = byte(v >> (8 * k))
			}
		}
		ts = append(ts, safetensors.Tensor{Name: fmt.Sprintf("layer.%d.weight", i), DType: "F32", Shape: []int64{per / 4}})
		data = append(data, b)
	}
	st, err := safetensors.Build(ts, data, nil)
	if err != nil {
		return err
	}
	data = nil
	const remote = "/models/org/m/model.safetensors"
	f, err := cl.Create(ctx, remote, client.CreateOptions{Pool: "perf"})
	if err != nil {
		return err
	}
	if _, err := f.Write(st); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	local := filepath.Join(dir, "local", "model.safetensors")
	os.MkdirAll(filepath.Dir(local), 0o755)
	if err := os.WriteFile(local, st, 0o644); err != nil {
		return err
	}
	size := int64(len(st))
	st = nil
	dropped := dropCaches()
	fmt.Printf("bench mount: one %s safetensors file, 3 local servers (DRAM), page cache dropped before each read: %v\n", human(size), dropped)

	newMount := func(name string, cache *weights.Cache) (*mount.FS, *client.Client, func(), error) {
		mc, _ := client.New(client.Config{Master: c.Master.URL()})
		mp := filepath.Join(dir, name)
		os.MkdirAll(mp, 0o755)
		m, err := mount.Mount(mp, mount.Options{Client: mc, Root: "/models", Cache: cache})
		if err != nil {
			mc.Close()
			return nil, nil, nil, err
		}
		done := make(chan struct{})
		go func() { m.Wait(); close(done) }()
		return m, mc, func() {
			if m.Unmount(false) != nil {
				m.Unmount(true)
			}
			<-done
			mc.Close()
		}, nil
	}
	mib := func(n int64, d time.Duration) float64 { return float64(n) / d.Seconds() / (1 << 20) }

	// 1. From the servers: the SDK (gd2fs cat) vs the mount.
	var catT time.Duration
	{
		t := time.Now()
		g, err := cl.Open(ctx, remote)
		if err != nil {
			return err
		}
		if _, err := g.CopyTo(ctx, io.Discard, nil); err != nil {
			return err
		}
		catT = time.Since(t)
	}
	m, mc, closeM, err := newMount("plain", nil)
	if err != nil {
		return err
	}
	rel := "org/m/model.safetensors"
	dropCaches()
	t := time.Now()
	if err := readFile(filepath.Join(m.Dir(), rel)); err != nil {
		closeM()
		return err
	}
	mountT := time.Since(t)
	fmt.Printf("\nsequential read from the servers:\n  SDK read to /dev/null (gd2fs cat): %7.0f MiB/s\n  through the mount:                 %7.0f MiB/s  (%.2fx; target >= 0.85x; %.2fx the file from servers)\n",
		mib(size, catT), mib(size, mountT), catT.Seconds()/mountT.Seconds(), float64(mc.ReadStats().FromServers)/float64(size))
	closeM()

	// 2. N processes mapping one file through a fresh mount.
	m, mc, closeM, err = newMount("shared", nil)
	if err != nil {
		return err
	}
	dropCaches()
	t = time.Now()
	var wg sync.WaitGroup
	errc := make(chan error, readers)
	for i := 0; i < readers; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if out, err := exec.Command(os.Args[0], "mount", "mmap-reader", filepath.Join(m.Dir(), rel)).CombinedOutput(); err != nil {
				errc <- fmt.Errorf("mmap reader: %v: %s", err, out)
			}
		}()
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		closeM()
		return err
	}
	fmt.Printf("\n%d processes mapping the file at once: %.2fs, %.3fx the file from servers (target <= 1.05x)\n",
		readers, time.Since(t).Seconds(), float64(mc.ReadStats().FromServers)/float64(size))
	closeM()

	// 3. Tensor load through the mount (from the servers) vs a local folder.
	if py, err := exec.LookPath("/usr/bin/python3"); err == nil && exec.Command(py, "-c", "import torch").Run() == nil {
		m, _, closeM, err = newMount("tensors", nil)
		if err != nil {
			return err
		}
		dropCaches()
		tm, err1 := pyTensorLoad(py, filepath.Join(m.Dir(), rel))
		dropCaches()
		tl, err2 := pyTensorLoad(py, local)
		closeM()
		if err1 != nil || err2 != nil {
			fmt.Printf("\ntensor load: %v %v\n", err1, err2)
		} else {
			fmt.Printf("\nload every tensor with torch (mmap):\n  through the mount (from the servers): %.2fs\n  from a local folder:                  %.2fs  (%.2fx)\n", tm.Seconds(), tl.Seconds(), tl.Seconds()/tm.Seconds())
		}
	} else {
		fmt.Println("\ntensor load: /usr/bin/python3 with torch not found: skipped")
	}

	// 4. Hot: from the local cache (passthrough where the kernel has it).
	cache := &weights.Cache{Dir: filepath.Join(dir, "cache")}
	m, mc, closeM, err = newMount("hot", cache)
	if err != nil {
		return err
	}
	defer closeM()
	pt, why := m.Passthrough()
	if err := readFile(filepath.Join(m.Dir(), rel)); err != nil { // fills the cache
		return err
	}
	fi, _ := cl.Stat(ctx, remote)
	deadline := time.Now().Add(10 * time.Minute)
	for {
		if _, ok := cache.BlobPath(fi); ok {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the hot cache did not fill")
		}
		time.Sleep(50 * time.Millisecond)
	}
	blob, _ := cache.BlobPath(fi)
	before := mc.ReadStats().FromServers
	dropCaches()
	t = time.Now()
	if err := readFile(filepath.Join(m.Dir(), rel)); err != nil {
		return err
	}
	hotT := time.Since(t)
	mode := "passthrough"
	if !pt {
		mode = "plain FUSE path (" + why + ")"
	}
	fmt.Printf("\nsequential read from the local cache, %s:\n  through the mount: %7.0f MiB/s (%d bytes from servers)\n", mode, mib(size, hotT), mc.ReadStats().FromServers-before)
	if bw, err := fioSeqRead(filepath.Join(dir, "cache"), size); err != nil {
		fmt.Printf("  fio: %v\n", err)
	} else {
		fmt.Printf("  fio, same disk:    %7.0f MiB/s  (%.2fx; target >= 0.95x)\n", bw/(1<<20), mib(size, hotT)*(1<<20)/bw)
	}
	dropCaches()
	rm, err := mmapRandom(filepath.Join(m.Dir(), rel), 20000)
	if err != nil {
		return err
	}
	dropCaches()
	rl, err := mmapRandom(blob, 20000)
	if err != nil {
		return err
	}
	fmt.Printf("random 4 KiB reads through mmap (20000, page cache dropped):\n  through the mount: %.0f reads/s\n  the local copy:    %.0f reads/s  (%.2fx; target >= 0.9x)\n", rm, rl, rm/rl)
	return nil
}

var sink atomic.Uint64

// readFile reads p sequentially in 1 MiB reads, as cat does.
func readFile(p string) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = io.CopyBuffer(io.Discard, struct{ io.Reader }{f}, make([]byte, 1<<20))
	return err
}

// mmapTouch maps p and reads a byte of every page (a mmap reader process).
func mmapTouch(p string) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	st, _ := f.Stat()
	mm, err := unix.Mmap(int(f.Fd()), 0, int(st.Size()), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return err
	}
	defer unix.Munmap(mm)
	var x byte
	for i := 0; i < len(mm); i += 4096 {
		x ^= mm[i]
	}
	sink.Add(uint64(x)) // the loads must not be optimised away
	return nil
}

// mmapRandom maps p and reads n random 4 KiB pages; reads per second.
func mmapRandom(p string, n int) (float64, error) {
	f, err := os.Open(p)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	st, _ := f.Stat()
	mm, err := unix.Mmap(int(f.Fd()), 0, int(st.Size()), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return 0, err
	}
	defer unix.Munmap(mm)
	unix.Madvise(mm, unix.MADV_RANDOM)
	r := rand.New(rand.NewPCG(7, 7))
	pages := len(mm) / 4096
	var x byte
	t := time.Now()
	for i := 0; i < n; i++ {
		x ^= mm[r.IntN(pages)*4096]
	}
	sink.Add(uint64(x))
	return float64(n) / time.Since(t).Seconds(), nil
}

// pyTensorLoad times loading every tensor of a safetensors file with torch
// over an mmap (as vLLM's loader does), each copied out once.
func pyTensorLoad(py, p string) (time.Duration, error) {
	const script = `
import sys, json, mmap, torch
with open(sys.argv[1], "rb") as f:
    mm = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
n = int.from_bytes(mm[:8], "little")
hdr = json.loads(mm[8:8+n])
total = 0
for k, v in hdr.items():
    if k == "__metadata__":
        continue
    b, e = v["data_offsets"]
    t = torch.frombuffer(memoryview(mm)[8+n+b:8+n+e], dtype=torch.float32).clone()
    total += t.numel()
print(total)
`
	t := time.Now()
	if out, err := exec.Command(py, "-c", script, p).CombinedOutput(); err != nil {
		return 0, fmt.Errorf("%v: %s", err, out)
	}
	return time.Since(t), nil
}
