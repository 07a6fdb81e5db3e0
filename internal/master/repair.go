package master

import (
	"context"
	"errors"
	"time"

	"github.com/gd2fs/gd2fs/errs"
	"github.com/gd2fs/gd2fs/internal/meta"
)

// repair restores the replica count of HA chunks held by servers that have
// been down longer than RepairAfter: a surviving replica is copied to a live
// server that holds none, then the replica list is updated.
func (m *Master) repair(ctx context.Context) {
	m.mu.Lock()
	var dead []string
	for id, s := range m.servers {
		if !s.up && time.Since(s.downAt) > m.cfg.RepairAfter {
			dead = append(dead, id)
		}
	}
	m.mu.Unlock()
	for _, id := range dead {
		cs, err := m.meta.ChunksOn(ctx, id)
		if err != nil {
			return
		}
		for _, c := range cs {
			p, err := m.pool(ctx, c.Pool)
			if err != nil || p.Replicas < 2 {
				continue // perf data is recomputable: it is not repaired
			}
			if err := m.repairChunk(ctx, c, id); err != nil {
				// Try again next round; meanwhile the other chunks go on (one
				// that cannot be copied must not hold back the rest).
				m.log.Warn("repair chunk", "chunk", c.ID, "dead", id, "err", err)
				m.metrics.repairs.WithLabelValues("failed").Inc()
				if ctx.Err() != nil {
					return
				}
				continue
			}
			m.metrics.repairs.WithLabelValues("ok").Inc()
		}
	}
}

func (m *Master) repairChunk(ctx context.Context, c meta.Placed, dead string) error {
	m.mu.Lock()
	var srcs []string
	holds := map[string]bool{}
	for _, r := range c.Replicas {
		holds[r] = true
		if s := m.servers[r]; s != nil && s.serving() && r != dead {
			srcs = append(srcs, s.info.Addr)
		}
	}
	var target *liveServer
	for id, s := range m.servers {
		if s.serving() && !holds[id] && s.info.Free() >= c.Length && (target == nil || s.info.Free() > target.info.Free()) {
			target = s
		}
	}
	var targetID, targetAddr string
	if target != nil {
		targetID, targetAddr = target.info.ID, target.info.Addr
	}
	m.mu.Unlock()
	if len(srcs) == 0 {
		return errs.New(errs.ErrUnavailable, "chunk %d: no live replica left to copy from", c.ID)
	}
	if target == nil {
		return errs.New(errs.ErrUnavailable, "chunk %d: no live server without a replica", c.ID)
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	var err error
	missing := 0
	for _, src := range srcs {
		if err = m.peers.CopyChunk(cctx, targetAddr, c.ID, src); err == nil {
			return m.meta.ReplaceReplica(ctx, c.ID, dead, targetID)
		}
		if errors.Is(err, errs.ErrNotFound) {
			missing++
		}
	}
	if missing == len(srcs) && c.Length == 0 {
		// Allocated, never committed, and no live replica has a byte of it
		// (its write failed): nothing to copy. The new replica starts
		// empty, as the others are.
		return m.meta.ReplaceReplica(ctx, c.ID, dead, targetID)
	}
	return err
}
