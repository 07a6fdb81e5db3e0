package server

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/gd2fs/gd2fs/errs"
	"github.com/gd2fs/gd2fs/internal/api"
)

// heartbeatLoop registers with the master and keeps reporting usage; the
// replies carry the epoch and chunks to delete.
func (s *Server) heartbeatLoop(ctx context.Context) {
	defer s.wg.Done()
	t := time.NewTicker(s.cfg.Heartbeat)
	defer t.Stop()
	warned := false
	for {
		if err := s.heartbeat(ctx); err != nil && !warned && ctx.Err() == nil {
			s.log.Warn("heartbeat to master failed; retrying", "master", s.cfg.Master, "err", err)
			warned = true
		} else if err == nil {
			warned = false
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		s.mu.Lock()
		closed := s.closed
		s.mu.Unlock()
		if closed {
			return
		}
	}
}

func (s *Server) heartbeat(ctx context.Context) error {
	u := s.store.Usage()
	s.mu.Lock()
	acked := s.deleted
	s.deleted = nil
	held, heldGen := s.held[:min(len(s.held), heldBatch)], s.heldGen
	s.mu.Unlock()
	hb := api.Heartbeat{ServerInfo: api.ServerInfo{ID: s.cfg.ID, Addr: s.cfg.Advertise,
		MemCap: u.MemCap, MemUsed: u.MemUsed, DiskCap: u.DiskCap, DiskUsed: u.DiskUsed, Chunks: u.Chunks,
		ServedBytes: s.servedBytes.Load(), ColdBytes: s.coldBytes.Load(), KV: s.kvStats(), Unhealthy: s.unhealthy()},
		Deleted: acked, Held: held}
	var reply api.HeartbeatReply
	seq := s.hbSent.Add(1)
	if err := s.master.Do(ctx, "POST", "/v1/servers/heartbeat", hb, &reply); err != nil {
		s.mu.Lock()
		s.deleted = append(s.deleted, acked...)
		s.mu.Unlock()
		return err
	}
	s.kvMoverInit()
	// The loop's heartbeat and a refresh (refreshMembership, on a client's
	// or a peer's newer epoch) run at once, and their replies may come back
	// in either order: a reply to an earlier heartbeat with an older epoch
	// than the map stored is stale and dropped. Stored, it would take the
	// server back to the old map after kvCatchUp told a peer it had the new
	// one, and it would serve (miss, or take writes of) keys the peer is
	// moving away (TestHeartbeatRepliesOutOfOrder). A later heartbeat's
	// reply is stored even with a lower epoch: a master on a new store.
	s.mu.Lock()
	if cur := s.ms.Load(); seq > s.msSeq || cur == nil || reply.Membership.Epoch >= cur.Epoch {
		s.msSeq = max(s.msSeq, seq)
		s.ms.Store(&reply.Membership)
	}
	s.mu.Unlock()
	s.health.beat(time.Now())
	s.kvMapChanged()
	s.mu.Lock()
	// A refresh's heartbeat may run beside the loop's: only the list this
	// heartbeat sent is done (a newer one waits for its own answer).
	// A long list goes heldBatch ids a heartbeat (the master answers a
	// heartbeat only after it checked them).
	if heldGen == s.heldGen && reply.Reconciled {
		s.held = s.held[len(held):]
		s.heldGen++
	}
	if len(s.held) == 0 {
		s.held = nil
	}
	if s.held == nil && s.cfg.Reconcile > 0 && time.Since(s.recon.last) >= s.cfg.Reconcile {
		s.pruneCopiesLocked()
		s.held = s.recon.next(s.store.IDs(), s.copyBusyLocked)
		s.heldGen++
	}
	s.mu.Unlock()
	var done []uint64
	for _, id := range reply.Delete {
		s.mu.Lock()
		copying := s.copies[id].running > 0
		s.mu.Unlock()
		if copying {
			continue // a tombstone older than this copy: asked again next time
		}
		if err := s.store.Delete(id); err == nil || errors.Is(err, errs.ErrNotFound) {
			done = append(done, id)
		}
	}
	s.mu.Lock()
	s.deleted = append(s.deleted, done...)
	s.mu.Unlock()
	return nil
}

// DefaultReconcile is Config.Reconcile's default.
const DefaultReconcile = 10 * time.Minute

// reconcile picks the chunks a server asks the master about after its
// start: each chunk once, when it has been held for at least one period.
// A chunk is too young to judge before that; one a repair is copying here
// (the master records the copy after it ends) waits for the look after the
// copy's period (copyBusyLocked); and the master's answer for a chunk a
// plan just allocated waits for the allocation's flush (Orphans).
type reconcile struct {
	last    time.Time
	prev    []uint64 // the chunks held at the last look, sorted
	arrived []uint64 // those of prev the look before did not see, and those put off as busy
}

// heldBatch is the most chunk ids one heartbeat reports.
const heldBatch = 1000

// copyState is a chunk being copied here (copyFrom), or copied at ended.
type copyState struct {
	running int
	ended   time.Time
}

func (s *Server) copyBegin(id uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.copies == nil {
		s.copies = map[uint64]copyState{}
	}
	c := s.copies[id]
	c.running++
	s.copies[id] = c
}

func (s *Server) copyEnd(id uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.copies[id]
	c.running--
	c.ended = time.Now()
	s.copies[id] = c
}

// pruneCopiesLocked forgets the copies that ended more than a reconcile
// period ago (s.mu held).
func (s *Server) pruneCopiesLocked() {
	for k, c := range s.copies {
		if c.running == 0 && time.Since(c.ended) > s.cfg.Reconcile {
			delete(s.copies, k)
		}
	}
}

// copyBusyLocked says whether chunk id is being copied here or was in the
// last reconcile period (the master records a copy after it ends) (s.mu
// held).
func (s *Server) copyBusyLocked(id uint64) bool {
	c, ok := s.copies[id]
	return ok && (c.running > 0 || time.Since(c.ended) <= s.cfg.Reconcile)
}

// next takes a look at the chunks held now (sorted) and returns those to
// ask about: the ones that arrived by the last look and are still here.
// A busy one (being copied) is not asked yet: it is asked at the next look.
func (r *reconcile) next(now []uint64, busy func(id uint64) bool) []uint64 {
	var ask, later []uint64
	for _, id := range intersect(r.arrived, now) {
		if busy != nil && busy(id) {
			later = append(later, id)
		} else {
			ask = append(ask, id)
		}
	}
	r.arrived = subtract(now, r.prev)
	if len(later) > 0 {
		r.arrived = append(r.arrived, later...)
		slices.Sort(r.arrived)
	}
	r.prev = now
	r.last = time.Now()
	if len(ask) == 0 {
		return nil // nothing to send: the heartbeat carries no list
	}
	return ask
}

// intersect is the ids in both sorted slices.
func intersect(a, b []uint64) []uint64 {
	var out []uint64
	for i, j := 0, 0; i < len(a) && j < len(b); {
		switch {
		case a[i] < b[j]:
			i++
		case a[i] > b[j]:
			j++
		default:
			out = append(out, a[i])
			i, j = i+1, j+1
		}
	}
	return out
}

// subtract is the ids of sorted a not in sorted b.
func subtract(a, b []uint64) []uint64 {
	var out []uint64
	j := 0
	for _, x := range a {
		for j < len(b) && b[j] < x {
			j++
		}
		if j == len(b) || b[j] != x {
			out = append(out, x)
		}
	}
	return out
}
