package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
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
	var readers, rounds, hotRounds int
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
off (on a passthrough file it would reach the FUSE file, not the local file the kernel reads).
It runs --hot-rounds times, the pair's order swapped each round, with the local copy read
twice more as an A/A control (on a VM that hands freed memory back to its host, a read into
a dropped page cache runs at 0.4 or 4 GB/s by chance); the best of the rounds, and the same
pairs from the page cache and with O_DIRECT (no page cache), are printed beside the medians,
with how many opens the kernel served by passthrough and how many reads the mount process
served.
A SIGINT, SIGTERM or SIGHUP unmounts what the bench mounted before it exits.`,
		Example: `  gd2fs-bench mount                 # a 1 GiB file
  gd2fs-bench mount --size 256MiB --readers 8
  gd2fs-bench mount --size 256MiB --only cold,hot --rounds 5
  gd2fs-bench mount --size 256MiB --only hot --hot-rounds 15
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
			if rounds < 1 || hotRounds < 1 {
				return fmt.Errorf("--rounds %d, --hot-rounds %d: at least 1", rounds, hotRounds)
			}
			return benchMount(total, readers, rounds, hotRounds, parts, &caseProfiler{dir: profDir})
		},
	}
	cmd.Flags().StringVar(&size, "size", "1GiB", "file size")
	cmd.Flags().IntVar(&readers, "readers", 8, "processes mapping one file")
	cmd.Flags().StringVar(&profDir, "cpuprofile", "", "write a CPU profile of each cold read, gd2fs cat's and the mount's, into this folder (cat-<round>.pprof, mount-<round>.pprof); the servers, the SDK and the mount daemon run in this process, so each profile holds them all")
	cmd.Flags().IntVar(&rounds, "rounds", 3, "times each read and its reference run, alternating (their medians are compared)")
	cmd.Flags().IntVar(&hotRounds, "hot-rounds", 9, "rounds of the hot sequential read (short reads on this VM swing 0.1-10x between rounds: more rounds)")
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

	mu     sync.Mutex
	mounts map[string]bool // mountpoints mounted and not yet unmounted
}

const (
	benchRemote = "/models/org/m/model.safetensors"
	benchRel    = "org/m/model.safetensors" // under the mount of /models
)

// envPauseMounted makes the bench print "mounted DIR" and wait once its
// first mount is up, so a test can signal it while a mount is there.
const envPauseMounted = "GD2FS_BENCH_PAUSE_MOUNTED"

// mount mounts /models at dir/name with its own client (its read counters
// are the mount's alone); stop unmounts, and says so when it cannot.
func (e *benchEnv) mount(name string, cache *weights.Cache) (m *mount.FS, mc *client.Client, stop func() error, err error) {
	mc, err = client.New(client.Config{Master: e.c.Master.URL()})
	if err != nil {
		return nil, nil, nil, err
	}
	mp := filepath.Join(e.dir, name)
	if err := os.MkdirAll(mp, 0o755); err != nil {
		mc.Close()
		return nil, nil, nil, err
	}
	e.mu.Lock()
	e.mounts[mp] = true // before the mount: a signal arriving during it unmounts it too
	e.mu.Unlock()
	m, err = mount.Mount(mp, mount.Options{Client: mc, Root: "/models", Cache: cache})
	if err != nil {
		e.forget(mp)
		mc.Close()
		return nil, nil, nil, err
	}
	done := make(chan struct{})
	go func() { m.Wait(); close(done) }()
	if os.Getenv(envPauseMounted) != "" {
		fmt.Println("mounted", mp)
		select {}
	}
	var once sync.Once
	var stopErr error
	return m, mc, func() error {
		once.Do(func() {
			defer mc.Close()
			if err := m.Unmount(false); err != nil {
				// Something still has a file open there (a reader process
				// the kernel has not finished closing): detach now.
				if lerr := m.Unmount(true); lerr != nil {
					stopErr = fmt.Errorf("%v; lazily: %v: fusermount3 -u -z %s clears it", err, lerr, mp)
					return
				}
			}
			<-done
			e.forget(mp)
		})
		return stopErr
	}, nil
}

func (e *benchEnv) forget(mp string) {
	e.mu.Lock()
	delete(e.mounts, mp)
	e.mu.Unlock()
}

// unmountAll detaches every mount still there (lazily: files may be open
// in reader processes the signal did not reach); for a signal's exit.
func (e *benchEnv) unmountAll() {
	e.mu.Lock()
	defer e.mu.Unlock()
	for mp := range e.mounts {
		if err := mount.Unmount(mp, true); err != nil {
			fmt.Fprintf(os.Stderr, "gd2fs-bench: %v\n", err)
		}
		delete(e.mounts, mp)
	}
}

// onSignal unmounts every mount of e and removes its folder when SIGINT,
// SIGTERM or SIGHUP ends the bench (timeout(1), Ctrl-C, a closed
// terminal), which would otherwise leave the mounts in the mount table
// with no daemon behind them ("Transport endpoint is not connected"). The
// returned function stops watching.
func (e *benchEnv) onSignal() func() {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	quit := make(chan struct{})
	go func() {
		select {
		case s := <-sig:
			fmt.Fprintf(os.Stderr, "gd2fs-bench: %v: unmounting and removing %s\n", s, e.dir)
			e.unmountAll()
			os.RemoveAll(e.dir)
			os.Exit(128 + int(s.(syscall.Signal)))
		case <-quit:
		}
	}()
	return func() { signal.Stop(sig); close(quit) }
}

func benchMount(total int64, readers, rounds, hotRounds int, parts map[string]bool, prof *caseProfiler) error {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "gd2fs-benchmount-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	e := &benchEnv{dir: dir, local: filepath.Join(dir, "local", "model.safetensors"), size: total, prof: prof, mounts: map[string]bool{}}
	defer e.onSignal()()
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
	e.c, e.cl, e.size = c, cl, int64(len(st))
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
		if err := e.hot(ctx, hotRounds, rounds); err != nil {
			return err
		}
	}
	if left := mountedUnder(dir); len(left) > 0 {
		return fmt.Errorf("mounts left behind: %v: a bug; fusermount3 -u -z clears them", left)
	}
	return nil
}

// stopped runs a mount's stop and keeps its error when there was none.
func stopped(stop func() error, err *error) {
	if serr := stop(); *err == nil {
		*err = serr
	}
}

// mountedUnder lists the mountpoints in dir or below it.
func mountedUnder(dir string) []string {
	b, _ := os.ReadFile("/proc/self/mounts")
	var left []string
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 1 && strings.HasPrefix(f[1], dir+"/") {
			left = append(left, f[1])
		}
	}
	return left
}

func mib(n int64, secs float64) float64 { return float64(n) / secs / (1 << 20) }

// cold reads the file from the servers: the SDK (gd2fs cat) and the mount,
// alternating. The page cache is dropped before each mount read, and the
// mount's reader keeps no block once the file is closed: each is cold.
func (e *benchEnv) cold(ctx context.Context, rounds int) (err error) {
	m, mc, stop, err := e.mount("plain", nil)
	if err != nil {
		return err
	}
	defer stopped(stop, &err)
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
func (e *benchEnv) mappers(readers int) (err error) {
	m, mc, stop, err := e.mount("shared", nil)
	if err != nil {
		return err
	}
	defer stopped(stop, &err)
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
	if err := stop(); err != nil {
		return err
	}
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
// where the kernel has it) and its local copy with one fio command each,
// alternating; then random 4 KiB reads through mmap of both.
//
// On this VM a read into a dropped page cache runs at about 0.4 or 4 GB/s
// by chance (the same local file read twice in a row: 692 and 4197
// MiB/s), and by its position in the sequence: freed guest memory is
// handed back to the host (free page reporting), and a read whose page
// cache lands in such memory runs at the speed of the host's first touch.
// So each pair of reads swaps its order every round, the local copy is
// read twice more as an A/A control (what identical reads give), and the
// same pairs run from the page cache (the CPU path alone) and with
// O_DIRECT (the disk alone, no page cache on either side).
func (e *benchEnv) hot(ctx context.Context, rounds, mmapRounds int) (err error) {
	cache := &weights.Cache{Dir: filepath.Join(e.dir, "cache")}
	m, mc, stop, err := e.mount("hot", cache)
	if err != nil {
		return err
	}
	defer stopped(stop, &err)
	pt, why := m.Passthrough()
	p := filepath.Join(m.Dir(), benchRel)
	if err := readFile(p); err != nil { // fills the cache
		return err
	}
	blob, err := waitCached(ctx, func(ctx context.Context) (client.FileInfo, error) { return e.cl.Stat(ctx, benchRemote) }, cache)
	if err != nil {
		return err
	}
	mode := "passthrough"
	if !pt {
		mode = "plain FUSE path (" + why + ")"
	}
	fmt.Printf("\nsequential read from the local cache, %s; fio --rw=read --bs=1M on both:\n", mode)
	if _, err := exec.LookPath("fio"); err != nil {
		fmt.Println("  fio not found: install it (apt-get install -y fio) for this part")
		return nil
	}
	var mountBW, localBW, aaFirst, aaSecond, mountDirect, localDirect, mountCached, localCached []float64
	servers, st0 := mc.ReadStats().FromServers, m.Stats()
	// pair reads a and b with fio, a first in even rounds and b first in
	// odd ones: the position of a read after a drop matters on this VM.
	pair := func(r int, a, b string, how fioMode) (x, y float64, err error) {
		read := func(f string, bw *float64) {
			if err != nil {
				return
			}
			if how == fioDropped {
				dropCaches()
			}
			*bw, err = fioRead(f, how)
		}
		if r%2 == 1 {
			read(b, &y)
			read(a, &x)
		} else {
			read(a, &x)
			read(b, &y)
		}
		return x, y, err
	}
	for r := 0; r < rounds; r++ {
		bm, bl, err := pair(r, p, blob, fioDropped)
		if err != nil {
			return err
		}
		a1, a2, err := pair(0, blob, blob, fioDropped) // A/A: the same read twice
		if err != nil {
			return err
		}
		cm, cl, err := pair(r, p, blob, fioCached) // the blob's pages are cached now
		if err != nil {
			return err
		}
		dm, dl, err := pair(r, p, blob, fioDirect)
		if err != nil {
			return err
		}
		mountBW, localBW, aaFirst, aaSecond = append(mountBW, bm), append(localBW, bl), append(aaFirst, a1), append(aaSecond, a2)
		mountCached, localCached = append(mountCached, cm), append(localCached, cl)
		mountDirect, localDirect = append(mountDirect, dm), append(localDirect, dl)
		fmt.Printf("  round %d: page cache dropped: the mount %5.0f, the local copy %5.0f MiB/s (%.2fx), A/A %5.0f then %5.0f (%.2fx); cached: %5.0f, %5.0f (%.2fx); O_DIRECT: %5.0f, %5.0f (%.2fx)\n",
			r+1, bm/(1<<20), bl/(1<<20), bm/bl, a1/(1<<20), a2/(1<<20), a2/a1, cm/(1<<20), cl/(1<<20), cm/cl, dm/(1<<20), dl/(1<<20), dm/dl)
	}
	st := m.Stats()
	ml, ll := median(mountBW), median(localBW)
	fmt.Printf("  medians, page cache dropped: through the mount %6.0f MiB/s, the local copy %6.0f MiB/s: %.2fx (target >= 0.95x); A/A (the same local read twice): %.2fx, the method's own noise\n",
		ml/(1<<20), ll/(1<<20), ml/ll, median(aaSecond)/median(aaFirst))
	fmt.Printf("  best of %d rounds, page cache dropped: through the mount %6.0f MiB/s, the local copy %6.0f MiB/s: %.2fx (a read slowed by the VM is never faster)\n",
		rounds, slices.Max(mountBW)/(1<<20), slices.Max(localBW)/(1<<20), slices.Max(mountBW)/slices.Max(localBW))
	fmt.Printf("  medians, from the page cache: through the mount %6.0f MiB/s, the local copy %6.0f MiB/s: %.2fx (the CPU path alone)\n",
		median(mountCached)/(1<<20), median(localCached)/(1<<20), median(mountCached)/median(localCached))
	fmt.Printf("  medians, O_DIRECT: through the mount %6.0f MiB/s, the local copy %6.0f MiB/s: %.2fx (the disk alone)\n",
		median(mountDirect)/(1<<20), median(localDirect)/(1<<20), median(mountDirect)/median(localDirect))
	fmt.Printf("  opens of the file: %d passthrough, %d plain (%d of a hot file kept plain beside plain handles); %d reads served by the mount process (0: the kernel read the local copy itself); %d bytes from servers\n",
		st.PassthroughOpens-st0.PassthroughOpens, st.PlainOpens-st0.PlainOpens, st.PassthroughRefused-st0.PassthroughRefused, st.Reads-st0.Reads, mc.ReadStats().FromServers-servers)
	var rm, rl []float64
	for r := 0; r < mmapRounds; r++ {
		for i, side := range []string{p, blob} {
			if r%2 == 1 {
				side = []string{blob, p}[i]
			}
			dropCaches()
			x, err := mmapRandom(side, 20000)
			if err != nil {
				return err
			}
			if side == p {
				rm = append(rm, x)
			} else {
				rl = append(rl, x)
			}
		}
	}
	fmt.Printf("random 4 KiB reads through mmap (20000 a round, page cache dropped, medians of %d rounds):\n  through the mount: %.0f reads/s\n  the local copy:    %.0f reads/s  (%.2fx; target >= 0.9x)\n", mmapRounds, median(rm), median(rl), median(rm)/median(rl))
	return nil
}

// waitCached waits until the mount's fill has put the file in the cache
// and returns the local copy. The file's sha256, which names the blob, is
// recorded on the master by the fill after the copy: stat asks again each
// time (asked once, before the fill recorded it, it waited forever).
func waitCached(ctx context.Context, stat func(context.Context) (client.FileInfo, error), cache *weights.Cache) (string, error) {
	deadline := time.Now().Add(5 * time.Minute)
	for {
		fi, err := stat(ctx)
		if err != nil {
			return "", err
		}
		if blob, ok := cache.BlobPath(fi); ok {
			return blob, nil
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("the hot cache did not fill in 5 minutes (%s)", cache.Dir)
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// fioMode is how fioRead reads.
type fioMode int

const (
	fioDropped fioMode = iota // buffered; the caller dropped the page cache
	fioCached                 // buffered, from the page cache as it is
	fioDirect                 // O_DIRECT: no page cache
)

// fioRead reads file p once with fio (1 MiB sequential reads, the file
// left as it is); bytes per second. fio's fadvise hint is off: on a
// passthrough file it reaches the FUSE file, not the backing file the
// kernel reads, so it would double the read-ahead of the local copy only.
func fioRead(p string, how fioMode) (float64, error) {
	args := []string{"--name=seq", "--filename=" + p, "--readonly", "--rw=read", "--bs=1M", "--ioengine=psync", "--fadvise_hint=0", "--output-format=json"}
	switch how {
	case fioCached:
		args = append(args, "--invalidate=0")
	case fioDirect:
		args = append(args, "--direct=1")
	}
	out, err := exec.Command("fio", args...).Output()
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
