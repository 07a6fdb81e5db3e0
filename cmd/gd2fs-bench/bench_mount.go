package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
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
	var size, only, profDir string
	var readers, rounds int
	cmd := &cobra.Command{
		Use:   "mount",
		Short: "gd2fs mount: sequential read cold/hot vs gd2fs cat and fio, 8 mmap readers, tensor load vs a local folder",
		Long: `Benchmarks of the FUSE mount (docs/mount.md), each beside its reference: a sequential read
of one file through the mount from the servers beside the SDK's read (what gd2fs cat does) to
/dev/null; the same from the local hot cache (passthrough where the kernel has it) beside the
local copy; random 4 KiB reads of a hot file through mmap beside mmap of the local copy;
N processes mapping one file (bytes from servers / file size); the time to load every tensor
of a safetensors file with torch through the mount beside the same from a local folder. The
page cache is dropped before each read (needs root; said when it cannot be). Needs /dev/fuse.

Each read and its reference alternate, --rounds times, and the ratio is that of the medians:
on a busy machine the ratio within one run is what counts, not the MiB/s. The hot read is one
fio command (1 MiB buffered reads) run on the file through the mount and on its local copy in
the cache: the same bytes on the same disk, page cache dropped before each, fio's fadvise hint
off (on a passthrough file it would reach the FUSE file, not the local file the kernel reads).`,
		Example: `  gd2fs-bench mount                 # a 1 GiB file
  gd2fs-bench mount --size 256MiB --readers 8
  gd2fs-bench mount --size 256MiB --only cold,hot --rounds 5
  gd2fs-bench mount --size 512MiB --only cold --cpuprofile /tmp/p   # go tool pprof -top /tmp/p/mount-1.pprof`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			total, err := parseSize(size)
			if err != nil {
				return err
			}
			parts := map[string]bool{}
			for _, p := range strings.Split(only, ",") {
				switch p = strings.TrimSpace(p); p {
				case "cold", "mmap", "torch", "hot":
					parts[p] = true
				default:
					return fmt.Errorf("--only %q: the parts are cold, mmap, torch and hot, comma-separated", p)
				}
			}
			if rounds < 1 {
				return fmt.Errorf("--rounds %d: at least 1", rounds)
			}
			return benchMount(total, readers, rounds, parts, &caseProfiler{dir: profDir})
		},
	}
	cmd.Flags().StringVar(&size, "size", "1GiB", "file size")
	cmd.Flags().IntVar(&readers, "readers", 8, "processes mapping one file")
	cmd.Flags().StringVar(&profDir, "cpuprofile", "", "write a CPU profile of each cold read, gd2fs cat's and the mount's, into this folder (cat-<round>.pprof, mount-<round>.pprof); the servers, the SDK and the mount daemon run in this process, so each profile holds them all")
	cmd.Flags().IntVar(&rounds, "rounds", 3, "times each read and its reference run, alternating (their medians are compared)")
	cmd.Flags().StringVar(&only, "only", "cold,mmap,torch,hot", "parts to run: cold (from servers, vs gd2fs cat), mmap (N mappers), torch (tensor load), hot (local cache, vs the local copy)")
	// The reader processes of the mmap test run this hidden command.
	cmd.AddCommand(&cobra.Command{Use: "mmap-reader FILE", Hidden: true, Args: cobra.ExactArgs(1),
		RunE: func(_ *cobra.Command, args []string) error { return mmapTouch(args[0]) }})
	return cmd
}

// benchEnv is a cluster holding one safetensors file, its local copy, and
// mounts of it.
type benchEnv struct {
	dir, local string
	c          *cluster.Cluster
	cl         *client.Client
	size       int64
	prof       *caseProfiler
}

const (
	benchRemote = "/models/org/m/model.safetensors"
	benchRel    = "org/m/model.safetensors" // under the mount of /models
)

// mount mounts /models at dir/name with its own client (its read counters
// are the mount's alone); stop unmounts.
func (e *benchEnv) mount(name string, cache *weights.Cache) (m *mount.FS, mc *client.Client, stop func(), err error) {
	mc, err = client.New(client.Config{Master: e.c.Master.URL()})
	if err != nil {
		return nil, nil, nil, err
	}
	mp := filepath.Join(e.dir, name)
	if err := os.MkdirAll(mp, 0o755); err != nil {
		mc.Close()
		return nil, nil, nil, err
	}
	m, err = mount.Mount(mp, mount.Options{Client: mc, Root: "/models", Cache: cache})
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

func benchMount(total int64, readers, rounds int, parts map[string]bool, prof *caseProfiler) error {
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
	f, err := cl.Create(ctx, benchRemote, client.CreateOptions{Pool: "perf"})
	if err != nil {
		return err
	}
	if _, err := f.Write(st); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	e := &benchEnv{dir: dir, local: filepath.Join(dir, "local", "model.safetensors"), c: c, cl: cl, size: int64(len(st)), prof: prof}
	if err := os.MkdirAll(filepath.Dir(e.local), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(e.local, st, 0o644); err != nil {
		return err
	}
	st = nil
	dropped := dropCaches()
	fmt.Printf("bench mount: one %s safetensors file, 3 local servers (DRAM), page cache dropped before each read: %v; %d rounds\n", human(e.size), dropped, rounds)
	if parts["cold"] {
		if err := e.cold(ctx, rounds); err != nil {
			return err
		}
	}
	if parts["mmap"] {
		if err := e.mappers(readers); err != nil {
			return err
		}
	}
	if parts["torch"] {
		if err := e.torch(); err != nil {
			return err
		}
	}
	if parts["hot"] {
		return e.hot(ctx, rounds)
	}
	return nil
}

func mib(n int64, secs float64) float64 { return float64(n) / secs / (1 << 20) }

// cold reads the file from the servers: the SDK (gd2fs cat) and the mount,
// alternating. The page cache is dropped before each mount read, and the
// mount's reader keeps no block once the file is closed: each is cold.
func (e *benchEnv) cold(ctx context.Context, rounds int) error {
	m, mc, stop, err := e.mount("plain", nil)
	if err != nil {
		return err
	}
	defer stop()
	// One read through the mount first, untimed. Its client is new (its
	// connections to the servers are made by its first read, which the
	// SDK's warm reference does not pay), and on this VM the first use of
	// memory the guest never touched runs at 0.14-0.27 GB/s (docs/
	// benchmarks.md, issue 26): the first read into an empty page cache
	// measured that, 0.23-0.38x gd2fs cat in every run, the rounds after
	// it 0.5-1.8x.
	if err := readFile(filepath.Join(m.Dir(), benchRel)); err != nil {
		return err
	}
	dropCaches()
	fmt.Println("\nsequential read from the servers:")
	var catTs, mountTs, fromServers []float64
	for r := 0; r < rounds; r++ {
		e.prof.start("cat", r)
		t := time.Now()
		g, err := e.cl.Open(ctx, benchRemote)
		if err != nil {
			return err
		}
		if _, err := g.CopyTo(ctx, io.Discard, nil); err != nil {
			return err
		}
		catT := time.Since(t).Seconds()
		e.prof.stop()
		dropCaches()
		before := mc.ReadStats().FromServers
		e.prof.start("mount", r)
		t = time.Now()
		if err := readFile(filepath.Join(m.Dir(), benchRel)); err != nil {
			return err
		}
		mountT := time.Since(t).Seconds()
		e.prof.stop()
		x := float64(mc.ReadStats().FromServers-before) / float64(e.size)
		fmt.Printf("  round %d: gd2fs cat %6.0f MiB/s, the mount %6.0f MiB/s (%.2fx), %.3fx the file from servers\n", r+1, mib(e.size, catT), mib(e.size, mountT), catT/mountT, x)
		catTs, mountTs, fromServers = append(catTs, catT), append(mountTs, mountT), append(fromServers, x)
	}
	st := m.Stats()
	ct, mt := median(catTs), median(mountTs)
	fmt.Printf("  medians: SDK read to /dev/null (gd2fs cat) %6.0f MiB/s, through the mount %6.0f MiB/s: %.2fx (target >= 0.85x); %.3fx the file from servers (the most %.3fx; target <= 1.05x)\n",
		mib(e.size, ct), mib(e.size, mt), ct/mt, median(fromServers), slices.Max(fromServers))
	fmt.Printf("  kernel read requests: %d, %d KiB on average, the largest %d KiB, %d waited for a block being fetched; %d blocks fetched, %d fetches failed (fetched again); %d bytes dropped before the kernel had them; %d bytes fetched again because the kernel asked again (its page cache dropped them)\n",
		st.Reads, st.ReadBytes/max(st.Reads, 1)>>10, st.LargestRead>>10, st.Waited, st.Blocks, st.FetchErrors, st.DroppedUnread, st.Reasked)
	return nil
}

// mappers has N processes map the file through a fresh mount at once.
func (e *benchEnv) mappers(readers int) error {
	m, mc, stop, err := e.mount("shared", nil)
	if err != nil {
		return err
	}
	defer stop()
	dropCaches()
	t := time.Now()
	var wg sync.WaitGroup
	errc := make(chan error, readers)
	for i := 0; i < readers; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if out, err := exec.Command(os.Args[0], "mount", "mmap-reader", filepath.Join(m.Dir(), benchRel)).CombinedOutput(); err != nil {
				errc <- fmt.Errorf("mmap reader: %v: %s", err, out)
			}
		}()
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		return err
	}
	fmt.Printf("\n%d processes mapping the file at once: %.2fs, %.3fx the file from servers (target <= 1.05x)\n",
		readers, time.Since(t).Seconds(), float64(mc.ReadStats().FromServers)/float64(e.size))
	return nil
}

// torch loads every tensor through the mount (from the servers) and from
// the local folder.
func (e *benchEnv) torch() error {
	py, err := exec.LookPath("/usr/bin/python3")
	if err != nil || exec.Command(py, "-c", "import torch").Run() != nil {
		fmt.Println("\ntensor load: /usr/bin/python3 with torch not found: skipped")
		return nil
	}
	m, _, stop, err := e.mount("tensors", nil)
	if err != nil {
		return err
	}
	dropCaches()
	tm, err1 := pyTensorLoad(py, filepath.Join(m.Dir(), benchRel))
	stop()
	dropCaches()
	tl, err2 := pyTensorLoad(py, e.local)
	if err1 != nil || err2 != nil {
		fmt.Printf("\ntensor load: %v %v\n", err1, err2)
		return nil
	}
	fmt.Printf("\nload every tensor with torch (mmap):\n  through the mount (from the servers): %.2fs\n  from a local folder:                  %.2fs  (%.2fx)\n", tm.Seconds(), tl.Seconds(), tl.Seconds()/tm.Seconds())
	return nil
}

// hot reads the file from the local cache through the mount (passthrough
// where the kernel has it) and its local copy, with one fio command each,
// alternating; then random 4 KiB reads through mmap of both.
func (e *benchEnv) hot(ctx context.Context, rounds int) error {
	cache := &weights.Cache{Dir: filepath.Join(e.dir, "cache")}
	m, mc, stop, err := e.mount("hot", cache)
	if err != nil {
		return err
	}
	defer stop()
	pt, why := m.Passthrough()
	p := filepath.Join(m.Dir(), benchRel)
	if err := readFile(p); err != nil { // fills the cache
		return err
	}
	fi, err := e.cl.Stat(ctx, benchRemote)
	if err != nil {
		return err
	}
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
	mode := "passthrough"
	if !pt {
		mode = "plain FUSE path (" + why + ")"
	}
	fmt.Printf("\nsequential read from the local cache, %s; fio --rw=read --bs=1M (buffered) on both:\n", mode)
	if _, err := exec.LookPath("fio"); err != nil {
		fmt.Println("  fio not found: install it (apt-get install -y fio) for this part")
		return nil
	}
	var mountBW, localBW []float64
	servers, reads := mc.ReadStats().FromServers, m.Stats().Reads
	for r := 0; r < rounds; r++ {
		dropCaches()
		bm, err := fioRead(p)
		if err != nil {
			return err
		}
		dropCaches()
		bl, err := fioRead(blob)
		if err != nil {
			return err
		}
		fmt.Printf("  round %d: through the mount %6.0f MiB/s, the local copy %6.0f MiB/s (%.2fx)\n", r+1, bm/(1<<20), bl/(1<<20), bm/bl)
		mountBW, localBW = append(mountBW, bm), append(localBW, bl)
	}
	fmt.Printf("  medians: through the mount %6.0f MiB/s, the local copy %6.0f MiB/s: %.2fx (target >= 0.95x); %d bytes from servers, %d reads served by the mount process (0: the kernel read the local copy itself)\n",
		median(mountBW)/(1<<20), median(localBW)/(1<<20), median(mountBW)/median(localBW), mc.ReadStats().FromServers-servers, m.Stats().Reads-reads)
	dropCaches()
	rm, err := mmapRandom(p, 20000)
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

// fioRead reads file p once with fio (1 MiB buffered sequential reads,
// the file left as it is); bytes per second. fio's fadvise hint is off: on
// a passthrough file it reaches the FUSE file, not the backing file the
// kernel reads, so it would double the read-ahead of the local copy only.
func fioRead(p string) (float64, error) {
	out, err := exec.Command("fio", "--name=seq", "--filename="+p, "--readonly", "--rw=read", "--bs=1M", "--ioengine=psync", "--fadvise_hint=0", "--output-format=json").Output()
	if err != nil {
		return 0, fmt.Errorf("fio %s: %v", p, err)
	}
	var res struct {
		Jobs []struct {
			Read struct {
				BW int64 `json:"bw_bytes"`
			} `json:"read"`
		} `json:"jobs"`
	}
	if err := json.Unmarshal(out, &res); err != nil || len(res.Jobs) == 0 || res.Jobs[0].Read.BW == 0 {
		return 0, fmt.Errorf("fio %s: output: %v: %s", p, err, out)
	}
	return float64(res.Jobs[0].Read.BW), nil
}

// median of xs (not empty); xs is sorted.
func median(xs []float64) float64 {
	slices.Sort(xs)
	if n := len(xs); n%2 == 0 {
		return (xs[n/2-1] + xs[n/2]) / 2
	}
	return xs[len(xs)/2]
}

var sink atomic.Uint64

// readFile reads p sequentially in 1 MiB reads, as cat does.
func readFile(p string) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	return readAll(f)
}

// readAll reads r to its end in 1 MiB reads. Not io.Copy to io.Discard:
// io.Discard's ReadFrom reads in 8 KiB pieces whatever buffer is given,
// and the mount's read was measured in 8 KiB read(2) calls, 128 times as
// many system calls as cat's.
func readAll(r io.Reader) error {
	buf := make([]byte, 1<<20)
	for {
		_, err := r.Read(buf)
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
	}
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
