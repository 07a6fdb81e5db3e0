package master

import (
	"context"
	"time"

	"github.com/gd2fs/gd2fs/errs"
	"github.com/gd2fs/gd2fs/internal/api"
)

// loop marks silent servers down and repairs HA chunks of long-dead ones.
func (m *Master) loop(ctx context.Context) {
	t := time.NewTicker(m.cfg.DownAfter / 5)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := m.tryLead(ctx); err != nil {
			m.log.Warn("leadership check failed", "err", err)
		}
		if !m.leader.Load() {
			continue
		}
		if m.warming() {
			continue
		}
		m.checkLiveness(ctx)
		if m.cfg.RepairAfter > 0 {
			m.repair(ctx)
		}
		if now := time.Now(); m.cfg.UnsealedTTL > 0 && now.Sub(m.expiredAt) >= expireEvery {
			m.expiredAt = now
			if _, err := m.ExpireUnsealed(ctx, now); err != nil {
				m.log.Warn("removing abandoned unsealed files failed (tried again in a minute)", "err", err)
			}
		}
	}
}

// tryLead takes leadership when it is free and notices when it was lost. A
// master that becomes leader reloads the servers and the epoch from the
// store, which the old leader kept current, and warms up: it waits for the
// servers' heartbeats (Config.LeadWarmup) before it places chunks or
// declares the silent ones down.
func (m *Master) tryLead(ctx context.Context) error {
	ok, err := m.meta.Lead(ctx, m.url)
	if err != nil {
		ok = false
	}
	was := m.leader.Load()
	switch {
	case ok && !was:
		svs, err := m.meta.Servers(ctx)
		if err != nil {
			return err
		}
		epoch, err := m.meta.BumpEpoch(ctx)
		if err != nil {
			return err
		}
		// Drain marks and earlier member lists, as the last leader saved them.
		if err := m.loadKVHistory(ctx); err != nil {
			return err
		}
		m.mu.Lock()
		m.servers = map[string]*liveServer{}
		now := time.Now()
		for _, s := range svs {
			m.servers[s.ID] = &liveServer{info: api.ServerInfo{ID: s.ID, Addr: s.Addr, MemCap: s.MemCap, DiskCap: s.DiskCap, State: "unknown"}, downAt: now, presumed: true}
		}
		m.epoch = epoch
		m.warmUntil = time.Time{}
		if len(svs) > 0 && m.cfg.LeadWarmup > 0 {
			m.warmUntil = now.Add(m.cfg.LeadWarmup)
		}
		m.mu.Unlock()
		m.leader.Store(true)
		m.leadershipChanged()
		m.log.Info("leading", "url", m.url, "epoch", epoch)
	case !ok && was:
		m.leader.Store(false)
		m.leadershipChanged()
		m.log.Warn("lost leadership: now a standby", "url", m.url)
	case !ok && !was:
		m.log.Debug("standby", "url", m.url)
	}
	return err
}

// Leader reports whether this master leads.
func (m *Master) Leader() bool { return m.leader.Load() }

// warming reports whether the master still waits for heartbeats after
// taking over; the first call after the warm-up declares the servers not
// heard from down.
func (m *Master) warming() bool {
	m.mu.Lock()
	if m.warmUntil.IsZero() {
		m.mu.Unlock()
		return false
	}
	now := time.Now()
	waiting := 0
	for _, s := range m.servers {
		if s.presumed {
			waiting++
		}
	}
	if waiting > 0 && now.Before(m.warmUntil) {
		m.mu.Unlock()
		return true
	}
	m.warmUntil = time.Time{}
	for _, s := range m.servers {
		if s.presumed {
			s.presumed, s.downAt, s.info.State = false, now, "down"
			m.log.Warn("server down: no heartbeat since this master took over", "id", s.info.ID, "addr", s.info.Addr)
		}
	}
	m.mu.Unlock()
	if waiting > 0 {
		m.bumpEpoch(context.Background())
	}
	return false
}

// errWarming is placement's answer during the warm-up.
func (m *Master) errWarming() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	heard := 0
	for _, s := range m.servers {
		if !s.presumed {
			heard++
		}
	}
	return errs.New(errs.ErrUnavailable, "master %s has just taken over and waits for the servers' heartbeats before placing chunks (%d of %d reported): %w",
		m.url, heard, len(m.servers), api.ErrRetryLater)
}
