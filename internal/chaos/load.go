package chaos

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gd2fs/gd2fs/client"
	"github.com/gd2fs/gd2fs/errs"
)

// fileRec is a file whose write was acknowledged (Close returned nil).
type fileRec struct {
	path     string
	pool     string
	size     int64
	removing atomic.Bool // a remove was asked: absence is no longer a loss
}

// model is what the harness knows was acknowledged: paths only, since
// content is a function of the path.
type model struct {
	mu     sync.Mutex
	files  map[string][]*fileRec // by pool
	kvKeys []string              // acknowledged KV puts (a bounded ring)
	kvNext int
	acked  [2]atomic.Int64 // HA, perf files acknowledged over the run
}

const kvRing = 4096

func newModel() *model { return &model{files: map[string][]*fileRec{}} }

func (m *model) add(f *fileRec) {
	m.mu.Lock()
	m.files[f.pool] = append(m.files[f.pool], f)
	m.mu.Unlock()
}

func (m *model) pick(r *rand.Rand, pool string) *fileRec {
	m.mu.Lock()
	defer m.mu.Unlock()
	fs := m.files[pool]
	if len(fs) == 0 {
		return nil
	}
	return fs[r.IntN(len(fs))]
}

func (m *model) drop(f *fileRec) {
	m.mu.Lock()
	defer m.mu.Unlock()
	fs := m.files[f.pool]
	for i, g := range fs {
		if g == f {
			m.files[f.pool] = append(fs[:i:i], fs[i+1:]...)
			return
		}
	}
}

func (m *model) all() []*fileRec {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []*fileRec
	for _, fs := range m.files {
		out = append(out, fs...)
	}
	return out
}

func (m *model) addKey(k string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.kvKeys) < kvRing {
		m.kvKeys = append(m.kvKeys, k)
		return
	}
	m.kvKeys[m.kvNext] = k
	m.kvNext = (m.kvNext + 1) % kvRing
}

func (m *model) pickKey(r *rand.Rand) string {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.kvKeys) == 0 {
		return ""
	}
	return m.kvKeys[r.IntN(len(m.kvKeys))]
}

// load runs the workers of the mixed load.
type load struct {
	cfg    *Config
	cl     *client.Client
	st     *Stats
	m      *model
	seed   uint64
	linked string // path of the linked file
	lsize  int64  // its size; its content is fill(seed, linkedKey, ...)
	phase  int    // startLoad's count: names of one phase never repeat another's
}

const (
	linkedKey  = "s3:chaos/model.bin"
	chunkSize  = 256 << 10
	kvMax      = 16 << 10 // largest KV value
	keepFiles  = 24       // files each writer keeps; older ones are removed
	layoutName = "chaos-llm"
)

func (l *load) opCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, l.cfg.OpTimeout)
}

// writer writes new files of pool, each once, and removes its oldest ones
// so the data stays bounded.
func (l *load) writer(ctx context.Context, pool string, id int) {
	kind, idx := HAWrite, 0
	if pool == "perf" {
		kind, idx = PerfWrite, 1
	}
	var mine []*fileRec
	buf := make([]byte, 1536<<10)
	for n := 0; ctx.Err() == nil; n++ {
		p := fmt.Sprintf("/chaos/%s/w%d/%d-%06d", pool, id, l.phase, n)
		size := sizeOf(l.seed, p, 16<<10, int64(len(buf)))
		data := buf[:size]
		fill(l.seed, p, 0, data)
		start := time.Now()
		octx, cancel := l.opCtx(ctx)
		err := writeFile(octx, l.cl, p, pool, data)
		cancel()
		if ctx.Err() != nil && err != nil {
			return // the run ended under it: not an outcome
		}
		o := classify(err, false)
		l.st.record(kind, o, start, err, "")
		if o == OK {
			f := &fileRec{path: p, pool: pool, size: size}
			l.m.add(f)
			l.m.acked[idx].Add(1)
			mine = append(mine, f)
		}
		if l.cfg.KeepFiles > 0 && len(mine) > l.cfg.KeepFiles {
			old := mine[0]
			mine = mine[1:]
			old.removing.Store(true)
			octx, cancel := l.opCtx(ctx)
			if err := l.cl.Remove(octx, old.path); err == nil || errors.Is(err, errs.ErrNotFound) {
				l.m.drop(old)
			}
			cancel()
		}
	}
}

func writeFile(ctx context.Context, cl *client.Client, p, pool string, data []byte) error {
	f, err := cl.Create(ctx, p, client.CreateOptions{Pool: pool, ChunkSize: chunkSize})
	if err != nil {
		return err
	}
	if _, err := f.WriteAtContext(ctx, data, 0); err != nil {
		return err
	}
	return f.Close()
}

// reader reads acknowledged files of pool, whole or a random range, and
// checks every byte.
func (l *load) reader(ctx context.Context, pool string, id int) {
	r := rand.New(rand.NewPCG(l.seed, uint64(id)*13+5))
	kind := HARead
	if pool == "perf" {
		kind = PerfRead
	}
	buf := make([]byte, 1536<<10)
	for ctx.Err() == nil {
		f := l.m.pick(r, pool)
		if f == nil {
			sleepCtx(ctx, 50*time.Millisecond)
			continue
		}
		off, n := int64(0), f.size
		if r.IntN(2) == 0 {
			off = r.Int64N(f.size)
			n = 1 + r.Int64N(f.size-off)
		}
		start := time.Now()
		octx, cancel := l.opCtx(ctx)
		o, err, detail := l.readCheck(octx, f, off, buf[:n])
		cancel()
		if ctx.Err() != nil && o != OK && o != WrongBytes {
			return
		}
		if f.removing.Load() {
			if o != WrongBytes {
				continue // removed under the read: nothing to count
			}
			detail += " [its writer was removing this file: the read raced a remove]"
		}
		l.st.record(kind, o, start, err, detail)
	}
}

// readCheck reads f at off into dst and checks size and bytes.
func (l *load) readCheck(ctx context.Context, f *fileRec, off int64, dst []byte) (Outcome, error, string) {
	g, err := l.cl.Open(ctx, f.path)
	if err != nil {
		if errors.Is(err, errs.ErrNotFound) && f.pool == "ha" {
			// The final sweep decides whether this acknowledged file is
			// lost; one not-found in flight is an error to read.
			return Other, err, "acknowledged HA file not found (the final sweep decides)"
		}
		return classify(err, f.pool != "ha"), err, ""
	}
	if g.Size() != f.size {
		return WrongBytes, nil, fmt.Sprintf("%s: size %d, acknowledged %d", f.path, g.Size(), f.size)
	}
	n, err := g.ReadAtContext(ctx, dst, off)
	if err != nil {
		return classify(err, f.pool != "ha"), err, ""
	}
	if n != len(dst) {
		return WrongBytes, nil, fmt.Sprintf("%s: short read %d of %d at %d", f.path, n, len(dst), off)
	}
	if i := firstDiff(l.seed, f.path, off, dst); i >= 0 {
		return WrongBytes, nil, fmt.Sprintf("%s: byte %d differs (read of %d at %d): %s; %s", f.path, off+int64(i), len(dst), off,
			diffDetail(l.seed, f.path, off, dst, i), l.diagnose(f, off, len(dst)))
	}
	l.st.addVerified(len(dst))
	return OK, nil, ""
}

// kv puts fresh keys and gets known ones; pools alternate.
func (l *load) kv(ctx context.Context, id int) {
	r := rand.New(rand.NewPCG(l.seed, uint64(id)*17+3))
	buf := make([]byte, kvMax)
	got := make([]byte, kvMax)
	pools := []string{"perf", "ha"}
	for n := 0; ctx.Err() == nil; n++ {
		pool := pools[n%2]
		key := fmt.Sprintf("chaos/%s/k%d-%d-%07d", pool, id, l.phase, n)
		size := sizeOf(l.seed, key, 256, kvMax)
		fill(l.seed, key, 0, buf[:size])
		start := time.Now()
		octx, cancel := l.opCtx(ctx)
		err := l.cl.KV(pool).Put(octx, key, buf[:size])
		cancel()
		if ctx.Err() != nil && err != nil {
			return
		}
		o := classify(err, false)
		l.st.record(KVPut, o, start, err, "")
		if o == OK {
			l.m.addKey(key)
		}
		k := l.m.pickKey(r)
		if k == "" {
			continue
		}
		pool = "perf"
		if len(k) > 9 && k[6:8] == "ha" {
			pool = "ha"
		}
		want := sizeOf(l.seed, k, 256, kvMax)
		start = time.Now()
		octx, cancel = l.opCtx(ctx)
		m, err := l.cl.KV(pool).GetInto(octx, k, got)
		cancel()
		if ctx.Err() != nil && err != nil {
			return
		}
		o = classify(err, true)
		detail := ""
		if o == OK {
			if int64(m) != want {
				o, detail = WrongBytes, fmt.Sprintf("kv %s: %d bytes, put %d", k, m, want)
			} else if i := firstDiff(l.seed, k, 0, got[:m]); i >= 0 {
				o, detail = WrongBytes, fmt.Sprintf("kv %s: byte %d differs", k, i)
			} else {
				l.st.addVerified(m)
			}
		}
		l.st.record(KVGet, o, start, err, detail)
		sleepCtx(ctx, 10*time.Millisecond) // a steady stream, not a flood: the machine is shared
	}
}

// sessions runs multi-turn explicit sessions: plan, load and check what
// the plan says is stored, write this turn's KV, commit.
func (l *load) sessions(ctx context.Context, id int) {
	r := rand.New(rand.NewPCG(l.seed, uint64(id)*19+7))
	ss := l.cl.Sessions()
	var sid string
	turns, tokens := 0, int64(0)
	for n := 0; ctx.Err() == nil; n++ {
		if sid == "" || turns >= 6 {
			if sid != "" {
				octx, cancel := l.opCtx(ctx)
				ss.Delete(octx, sid)
				cancel()
			}
			sid, turns, tokens = fmt.Sprintf("chaos-%d-%d-%d", id, l.phase, n), 0, 0
		}
		tokens += 32 + r.Int64N(224)
		start := time.Now()
		octx, cancel := l.opCtx(ctx)
		plan, err := ss.Plan(octx, sid, client.PlanRequest{Model: layoutName, TokenIDs: convIDs(sid, tokens)})
		o, detail := classify(err, true), ""
		if o == OK {
			dst := make([]byte, plan.LoadBytes)
			_, err = ss.LoadStored(octx, plan, dst)
			o = classify(err, true)
			if o == OK {
				o, detail = l.checkRanges(plan.Stored, dst)
			}
		}
		cancel()
		if ctx.Err() != nil && o != OK && o != WrongBytes {
			return
		}
		if o == OK && plan.Shortened != "" {
			// Its own outcome: a server holding stored bytes is down, so
			// the master kept the engine off it. The turn goes on.
			l.st.record(SessionPlan, Shortened, start, err, plan.Shortened)
		} else {
			l.st.record(SessionPlan, o, start, err, detail)
		}
		if o != OK {
			sid = "" // start over: this session's history is uncertain
			continue
		}
		var kv []byte
		for _, fr := range plan.Fresh {
			b := make([]byte, fr.KVLength)
			if p, perr := client.ParseURI(fr.KVURI); perr == nil {
				fill(l.seed, p.Path, fr.KVStart, b)
			}
			kv = append(kv, b...)
		}
		start = time.Now()
		octx, cancel = l.opCtx(ctx)
		err = ss.WriteFresh(octx, plan, kv)
		if err == nil {
			_, err = ss.Commit(octx, sid, plan.PlanID)
		}
		cancel()
		if ctx.Err() != nil && err != nil {
			return
		}
		o = classify(err, false)
		l.st.record(SessionCommit, o, start, err, "")
		if o != OK {
			sid = ""
			continue
		}
		turns++
	}
}

// convIDs is the token ids of a chaos session's conversation: a function of
// the session and the position, so every turn's prompt extends the last.
func convIDs(sid string, n int64) []uint32 {
	h := fnv.New32a()
	h.Write([]byte(sid))
	base := h.Sum32()
	out := make([]uint32, n)
	for i := range out {
		out[i] = base ^ uint32(i)*2654435761
	}
	return out
}

func (l *load) checkRanges(rs []client.KVRange, dst []byte) (Outcome, string) {
	var off int64
	for _, rg := range rs {
		p, err := client.ParseURI(rg.KVURI)
		if err != nil {
			return Other, "plan names a bad kv_uri " + rg.KVURI
		}
		part := dst[off : off+rg.KVLength]
		off += rg.KVLength
		if i := firstDiff(l.seed, p.Path, rg.KVStart, part); i >= 0 {
			return WrongBytes, fmt.Sprintf("session range %s at %d+%d: byte %d differs", p.Path, rg.KVStart, rg.KVLength, i)
		}
	}
	l.st.addVerified(int(off))
	return OK, ""
}

// linked reads random ranges of the file linked from S3.
func (l *load) linkedReader(ctx context.Context, id int) {
	r := rand.New(rand.NewPCG(l.seed, uint64(id)*23+11))
	buf := make([]byte, 4<<20)
	for ctx.Err() == nil {
		n := 1 + r.Int64N(int64(len(buf)))
		off := r.Int64N(l.lsize - n + 1)
		start := time.Now()
		octx, cancel := l.opCtx(ctx)
		o, detail := OK, ""
		g, err := l.cl.Open(octx, l.linked)
		if err == nil {
			var m int
			m, err = g.ReadAtContext(octx, buf[:n], off)
			switch {
			case err != nil:
				o = classify(err, false)
			case int64(m) != n:
				o, detail = WrongBytes, fmt.Sprintf("linked: short read %d of %d", m, n)
			default:
				if i := firstDiff(l.seed, linkedKey, off, buf[:n]); i >= 0 {
					o, detail = WrongBytes, fmt.Sprintf("linked: byte %d differs (read of %d at %d)", off+int64(i), n, off)
				} else {
					l.st.addVerified(int(n))
				}
			}
		} else {
			o = classify(err, false)
		}
		cancel()
		if ctx.Err() != nil && o != OK && o != WrongBytes {
			return
		}
		l.st.record(LinkedRead, o, start, err, detail)
	}
}

func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// diagnose describes, after a wrong read, what the master says of the
// file's chunks and whether a second read returns the right bytes: enough
// to tell a client-side hole from a server's bad answer.
func (l *load) diagnose(f *fileRec, off int64, n int) string {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := l.cl.Stat(ctx, f.path)
	if err != nil {
		return "stat after: " + err.Error()
	}
	var b strings.Builder
	fmt.Fprintf(&b, "master: size %d sealed %v, chunks", st.Size, st.Sealed)
	for _, c := range st.Chunks {
		fmt.Fprintf(&b, " [#%d id %d len %d on", c.Index, c.ID, c.Length)
		for _, r := range c.Replicas {
			fmt.Fprintf(&b, " %s(up=%v)", r.Server, r.Up)
		}
		b.WriteString("]")
	}
	if len(st.Chunks) == 0 {
		b.WriteString(" none")
	}
	again := make([]byte, n)
	g, err := l.cl.Open(ctx, f.path)
	if err == nil {
		_, err = g.ReadAtContext(ctx, again, off)
	}
	switch {
	case err != nil:
		fmt.Fprintf(&b, "; a second read failed: %v", err)
	case firstDiff(l.seed, f.path, off, again) >= 0:
		b.WriteString("; a second read is wrong too")
	default:
		b.WriteString("; a second read is right")
	}
	return b.String()
}
