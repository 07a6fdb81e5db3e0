package store

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"testing"

	"github.com/gd2fs/gd2fs/errs"
	"github.com/gd2fs/gd2fs/internal/crc32c"
	"github.com/gd2fs/gd2fs/internal/limits"
	"github.com/gd2fs/gd2fs/internal/tier/memfs"
)

// crashModel is what a chunk may look like after a power loss.
type crashModel struct {
	cur     []byte // what the running store holds
	sealed  bool
	durable []byte // contents as of the last Sync covering every write; nil: never synced
	// durSealed: the seal is durable. dirtyFrom: the first block a write
	// since the last Sync touched, -1 when there was none.
	durSealed bool
	dirtyFrom int
	synced    bool // the store will sync this chunk's Seal (Store.durable)
	maySeal   bool // it, or a deleted chunk of its id whose file may come back, was sealed
	versions  map[int]map[string]bool
	lengths   map[int64]bool
}

func newCrashModel() *crashModel {
	return &crashModel{dirtyFrom: -1, versions: map[int]map[string]bool{}, lengths: map[int64]bool{0: true}}
}

// record notes the contents of blocks [from, to) as one they may be found in.
func (m *crashModel) record(from, to int) {
	for b := from; b < to; b++ {
		bs, be := int64(b)*limits.BlockSize, min(int64(b+1)*limits.BlockSize, int64(len(m.cur)))
		if bs >= be {
			break
		}
		if m.versions[b] == nil {
			m.versions[b] = map[string]bool{}
		}
		m.versions[b][string(m.cur[bs:be])] = true
	}
	m.lengths[int64(len(m.cur))] = true
}

// inherit lets m also be found as old (a deleted chunk's file may come back).
func (m *crashModel) inherit(old *crashModel) {
	for b, vs := range old.versions {
		if m.versions[b] == nil {
			m.versions[b] = map[string]bool{}
		}
		for v := range vs {
			m.versions[b][v] = true
		}
	}
	for l := range old.lengths {
		m.lengths[l] = true
	}
	m.maySeal = m.maySeal || old.maySeal
}

// TestPowerLossModel writes random chunks through a store on memfs.FS, syncs
// and seals some, deletes some, and at random points loses power (memfs
// drops or tears every unsynced write), reopens the store and checks: a
// chunk synced since its last write is there, byte-identical, sealed if it
// was sealed; a chunk synced and then written again keeps, byte-identical,
// every block no later write touched; every other block, and every chunk
// never synced, is absent or reads as some content it once had, or fails
// with a clean checksum error. Never other bytes. The invariants are
// checked after every step.
func TestPowerLossModel(t *testing.T) {
	seeds := uint64(3)
	if n, err := strconv.ParseUint(os.Getenv("GD2FS_POWERLOSS_SEEDS"), 10, 64); err == nil {
		seeds = n // a longer run: GD2FS_POWERLOSS_SEEDS=50
	}
	for seed := uint64(1); seed <= seeds; seed++ {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			mem := int64(0)
			if seed%2 == 0 {
				mem = 1 << 20 // a DRAM tier: zero-copy writes, evictions, promotions
			}
			if err := runPowerLoss(t, seed, mem, false, 300); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestPowerLossModelCatchesNoSync: with fdatasync doing nothing the same
// check finds a lost durable chunk, so the check has teeth.
func TestPowerLossModelCatchesNoSync(t *testing.T) {
	for seed := uint64(1); seed <= 5; seed++ {
		if err := runPowerLoss(t, seed, 0, true, 500); err != nil {
			t.Logf("caught (seed %d): %v", seed, err)
			return
		}
	}
	t.Fatal("a store whose syncs do nothing passed the power-loss check")
}

func runPowerLoss(t *testing.T, seed uint64, mem int64, noSync bool, steps int) error {
	r := rand.New(rand.NewPCG(seed, 77))
	fs := memfs.New()
	fs.NoSync = noSync
	cfg := Config{MemBytes: mem, Dir: "/srv/disk", DiskBytes: 1 << 30, fs: fs}
	s, err := Open(cfg)
	if err != nil {
		return err
	}
	defer func() { s.Close() }()
	models := map[uint64]*crashModel{}
	ghosts := map[uint64]*crashModel{} // deleted: their files may come back
	crashes := 0
	for step := 0; step < steps; step++ {
		id := uint64(1 + r.IntN(6))
		m := models[id]
		switch op := r.IntN(100); {
		case op < 60: // write, synced or not
			if m == nil {
				m = newCrashModel()
				if g := ghosts[id]; g != nil {
					m.inherit(g)
				}
			}
			old := int64(len(m.cur))
			var off int64
			switch k := r.IntN(10); {
			case k < 7 || old == 0:
				off = old
			case k < 9:
				off = r.Int64N(old)
			default:
				off = old + r.Int64N(100<<10)
			}
			n := 1 + r.IntN(150<<10)
			if r.IntN(4) == 0 {
				n = limits.BlockSize * (1 + r.IntN(2))
			}
			if off+int64(n) > 400<<10 {
				continue
			}
			p := rnd(n, r.Uint64())
			err := writeVia(s, r, id, off, p)
			if m.sealed {
				if !errors.Is(err, errs.ErrSealed) {
					return fmt.Errorf("step %d: write to sealed chunk %d: %v", step, id, err)
				}
				continue
			}
			if err != nil {
				return fmt.Errorf("step %d: write chunk %d: %v", step, id, err)
			}
			models[id] = m
			first := int(min(off, old) / limits.BlockSize)
			m.cur = modelWrite(m.cur, int(off), p)
			m.record(first, blocks(int64(len(m.cur))))
			if m.dirtyFrom < 0 || first < m.dirtyFrom {
				m.dirtyFrom = first
			}
			if r.IntN(2) == 0 {
				if err := s.Sync(id); err != nil {
					return fmt.Errorf("step %d: sync chunk %d: %v", step, id, err)
				}
				m.durable, m.durSealed, m.dirtyFrom, m.synced = bytes.Clone(m.cur), m.sealed, -1, true
				if m.durable == nil {
					m.durable = []byte{}
				}
			}
		case op < 70: // seal
			if m == nil || m.sealed {
				continue
			}
			if err := s.Seal(id); err != nil {
				return fmt.Errorf("step %d: seal chunk %d: %v", step, id, err)
			}
			m.sealed, m.maySeal = true, true
			if m.synced { // Seal of a chunk written durably syncs
				m.durable, m.durSealed, m.dirtyFrom = bytes.Clone(m.cur), true, -1
				if m.durable == nil {
					m.durable = []byte{}
				}
			}
		case op < 76: // delete
			if m == nil {
				continue
			}
			if err := s.Delete(id); err != nil {
				return fmt.Errorf("step %d: delete chunk %d: %v", step, id, err)
			}
			g := newCrashModel()
			g.inherit(m)
			if old := ghosts[id]; old != nil {
				g.inherit(old)
			}
			ghosts[id] = g
			delete(models, id)
		case op < 94: // read back, no crash involved: exact
			if m == nil {
				continue
			}
			got, err := readChunk(s, id, 0, int64(len(m.cur)))
			if err != nil || !bytes.Equal(got, m.cur) {
				return fmt.Errorf("step %d: chunk %d reads back wrong (err %v)", step, id, err)
			}
		default: // power loss
			crashes++
			s.Close()
			fs.Crash(r)
			if s, err = Open(cfg); err != nil {
				return fmt.Errorf("step %d: reopen after power loss: %v", step, err)
			}
			if err := checkAfterCrash(s, models, ghosts); err != nil {
				return fmt.Errorf("step %d, power loss %d: %v", step, crashes, err)
			}
			// Carry on from what survived; a torn chunk is deleted, as the
			// master's repair does before it copies a good replica in.
			for id, g := range models {
				if old := ghosts[id]; old != nil {
					g.inherit(old)
				}
			}
			next, nextGhosts := map[uint64]*crashModel{}, map[uint64]*crashModel{}
			for _, info := range s.List() {
				m := newCrashModel()
				if old := models[info.ID]; old != nil {
					m.inherit(old)
				} else if g := ghosts[info.ID]; g != nil {
					m.inherit(g)
				}
				got, err := readChunk(s, info.ID, 0, info.Length)
				if err != nil {
					if err := s.Delete(info.ID); err != nil {
						return err
					}
					nextGhosts[info.ID] = m
					continue
				}
				m.cur, m.sealed, m.synced = got, info.Sealed, true
				m.maySeal = m.maySeal || info.Sealed
				m.durable, m.durSealed = bytes.Clone(got), info.Sealed
				m.record(0, blocks(info.Length))
				next[info.ID] = m
			}
			for id, g := range ghosts { // still deleted: may still come back
				if next[id] == nil {
					if ng := nextGhosts[id]; ng != nil {
						g.inherit(ng)
					}
					nextGhosts[id] = g
				}
			}
			for id, m := range models { // lost, never synced: may come back torn
				if next[id] == nil && nextGhosts[id] == nil {
					nextGhosts[id] = m
				}
			}
			models, ghosts = next, nextGhosts
		}
		if err := s.checkInvariants(); err != nil {
			return fmt.Errorf("step %d: %v", step, err)
		}
	}
	if crashes == 0 {
		return fmt.Errorf("no power loss in %d steps", steps)
	}
	t.Logf("seed %d: %d steps, %d power losses, %d syncs", seed, steps, crashes, fs.Syncs())
	return nil
}

// writeVia writes through Write or, where the store takes it, straight into
// DRAM pages (BeginWrite/Commit, the server's zero-copy path).
func writeVia(s *Store, r *rand.Rand, id uint64, off int64, p []byte) error {
	if r.IntN(2) == 0 {
		if dst, pw, ok := s.BeginWrite(id, off, len(p)); ok {
			q := p
			for _, d := range dst {
				q = q[copy(d, q):]
			}
			return pw.Commit(crc32c.Checksum(p))
		}
	}
	return s.Write(id, off, p)
}

func readChunk(s *Store, id uint64, off, n int64) ([]byte, error) {
	var out []byte
	err := s.Read(id, off, n, func(bufs [][]byte, _ uint32) error {
		for _, b := range bufs {
			out = append(out, b...)
		}
		return nil
	})
	return out, err
}

// checkAfterCrash checks a store reopened after a power loss against what
// each chunk was allowed to become (see TestPowerLossModel).
func checkAfterCrash(s *Store, models, ghosts map[uint64]*crashModel) error {
	present := map[uint64]Info{}
	for _, info := range s.List() {
		present[info.ID] = info
	}
	for id, m := range models {
		if _, ok := present[id]; !ok && m.durable != nil {
			return fmt.Errorf("chunk %d was synced (%d bytes) and is gone", id, len(m.durable))
		}
	}
	for id, info := range present {
		m := models[id]
		if m == nil {
			m = ghosts[id]
		}
		if m == nil {
			return fmt.Errorf("chunk %d was never written and is there", id)
		}
		if m.durable != nil && models[id] == m && m.dirtyFrom < 0 {
			got, err := readChunk(s, id, 0, info.Length)
			if err != nil || !bytes.Equal(got, m.durable) || info.Sealed != m.durSealed {
				return fmt.Errorf("synced chunk %d: %d bytes (want %d), sealed %v (want %v), equal %v, err %v",
					id, info.Length, len(m.durable), info.Sealed, m.durSealed, bytes.Equal(got, m.durable), err)
			}
			continue
		}
		if !m.lengths[info.Length] {
			return fmt.Errorf("chunk %d came back %d bytes long, a length it never had", id, info.Length)
		}
		if info.Sealed && !m.maySeal {
			return fmt.Errorf("chunk %d came back sealed, never was", id)
		}
		if m.durable != nil && models[id] == m && info.Length < int64(len(m.durable)) {
			return fmt.Errorf("synced chunk %d came back shorter: %d of %d bytes", id, info.Length, len(m.durable))
		}
		for b := 0; b < blocks(info.Length); b++ {
			bs, be := int64(b)*limits.BlockSize, min(int64(b+1)*limits.BlockSize, info.Length)
			got, err := readChunk(s, id, bs, be-bs)
			strict := m.durable != nil && models[id] == m && b < m.dirtyFrom
			switch {
			case strict && (err != nil || !bytes.Equal(got, m.durable[bs:be])):
				return fmt.Errorf("chunk %d block %d, synced and not written since, lost: err %v", id, b, err)
			case err != nil && !errors.Is(err, errs.ErrChecksum):
				return fmt.Errorf("chunk %d block %d: an error that is not a clean checksum error: %v", id, b, err)
			case err == nil && !m.versions[b][string(got)]:
				return fmt.Errorf("chunk %d block %d: WRONG BYTES: contents it never had", id, b)
			}
		}
	}
	return nil
}
