package server

import (
	"context"
	"errors"
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
	held := s.held
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
	if reply.Reconciled {
		s.mu.Lock()
		s.held = nil
		s.mu.Unlock()
	}
	var done []uint64
	for _, id := range reply.Delete {
		if err := s.store.Delete(id); err == nil || errors.Is(err, errs.ErrNotFound) {
			done = append(done, id)
		}
	}
	s.mu.Lock()
	s.deleted = append(s.deleted, done...)
	s.mu.Unlock()
	return nil
}
