package master

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/gd2fs/gd2fs/errs"
	"github.com/gd2fs/gd2fs/internal/api"
	"github.com/gd2fs/gd2fs/internal/meta"
	"github.com/gd2fs/gd2fs/internal/placement"
)

func (m *Master) checkLiveness(ctx context.Context) {
	now := time.Now()
	m.mu.Lock()
	changed := false
	for _, s := range m.servers {
		if s.up && now.Sub(s.lastSeen) > m.cfg.DownAfter {
			s.up, s.downAt, s.info.State = false, now, "down"
			changed = true
			m.log.Warn("server down: no heartbeat", "id", s.info.ID, "addr", s.info.Addr, "silent", now.Sub(s.lastSeen).Round(time.Millisecond))
		}
	}
	m.mu.Unlock()
	if changed {
		m.bumpEpoch(ctx)
	}
}

func (m *Master) bumpEpoch(ctx context.Context) {
	e, err := m.meta.BumpEpoch(ctx)
	if err != nil {
		m.log.Error("bump epoch", "err", err)
		return
	}
	m.mu.Lock()
	m.epoch = max(m.epoch, e) // two bumps may finish in either order
	m.mu.Unlock()
}

// heartbeat records a server's report and answers with the epoch and the
// chunks it must delete.
func (m *Master) heartbeat(ctx context.Context, hb api.Heartbeat) (api.HeartbeatReply, error) {
	if err := checkHeartbeat(hb); err != nil { // validate.go: before any state
		return api.HeartbeatReply{}, err
	}
	if len(hb.Deleted) > 0 {
		if err := m.meta.ClearTombstones(ctx, hb.ID, hb.Deleted); err != nil {
			return api.HeartbeatReply{}, err
		}
	}
	reconciled := false
	if hb.Held != nil {
		// Not on the heartbeat's own path to failing: a server whose list
		// cannot be checked now is still alive (it sends the list again).
		n, err := m.meta.Orphans(ctx, hb.ID, hb.Held)
		switch {
		case err != nil:
			m.log.Warn("could not check the chunks a server reported; it reports them again", "id", hb.ID, "chunks", len(hb.Held), "err", err)
		case n > 0:
			m.log.Info("server holds chunks no file uses; deleting them", "id", hb.ID, "chunks", n)
		}
		reconciled = err == nil
	}
	m.mu.Lock()
	s := m.servers[hb.ID]
	isNew := s == nil || (!s.up && !s.presumed) || s.info.Addr != hb.Addr || s.info.MemCap != hb.MemCap || s.info.DiskCap != hb.DiskCap
	healthChanged := s != nil && s.up && (s.info.Unhealthy == "") != (hb.Unhealthy == "")
	if s == nil {
		s = &liveServer{}
		m.servers[hb.ID] = s
	}
	s.info = hb.ServerInfo
	s.info.State = "up"
	if hb.Unhealthy != "" {
		s.info.State = "unhealthy"
	}
	s.lastSeen = time.Now()
	s.info.LastSeen = s.lastSeen
	s.up = true
	s.presumed = false
	m.mu.Unlock()
	if isNew {
		if err := m.meta.PutServer(ctx, meta.Server{ID: hb.ID, Addr: hb.Addr, MemCap: hb.MemCap, DiskCap: hb.DiskCap}); err != nil {
			return api.HeartbeatReply{}, err
		}
		m.log.Info("server up", "id", hb.ID, "addr", hb.Addr)
		m.bumpEpoch(ctx)
	} else if healthChanged {
		if hb.Unhealthy != "" {
			m.log.Warn("server unhealthy: left out of placement and membership", "id", hb.ID, "reason", hb.Unhealthy)
		} else {
			m.log.Info("server healthy again", "id", hb.ID)
		}
		m.bumpEpoch(ctx)
	}
	del, err := m.meta.Tombstones(ctx, hb.ID, 512)
	if err != nil {
		return api.HeartbeatReply{}, err
	}
	ms, err := m.membership(ctx)
	return api.HeartbeatReply{Membership: ms, Delete: del, Reconciled: reconciled}, err
}

// membership is the epoch, the up servers (sorted by id) and the pools.
func (m *Master) membership(ctx context.Context) (api.Membership, error) {
	ps, err := m.meta.Pools(ctx)
	if err != nil {
		return api.Membership{}, err
	}
	var out api.Membership
	for _, p := range ps {
		out.Pools = append(out.Pools, api.Pool{Name: p.Name, Replicas: p.Replicas})
	}
	m.mu.Lock()
	out.Epoch = m.epoch
	for _, s := range m.servers {
		if (s.serving() || s.presumed) && !m.kvHist.draining[s.info.ID] {
			out.Members = append(out.Members, placement.Member{ID: s.info.ID, Addr: s.info.Addr})
		}
	}
	sort.Slice(out.Members, func(i, j int) bool { return out.Members[i].ID < out.Members[j].ID })
	m.kvHist.note(&out, m.servers)
	dirty := m.kvHist.seq != m.kvHist.savedSeq || m.kvHist.held
	m.mu.Unlock()
	if dirty {
		// A new member list: saved in the background (kvhistory.go), so a
		// slow metadata store never delays heartbeats. A list held back
		// for its epoch bump: the saver makes the bump if it is still owed.
		m.kvSave.kick(m)
	}
	return out, nil
}

// place picks replicas distinct servers for chunk idx of file fileID by
// placement.Weighted over the up servers with need bytes free: a file's
// chunks spread over all servers, the emptier ones take proportionally
// more, and the choice depends only on (file, chunk) and the servers' free
// space, not on which master process makes it.
func (m *Master) place(fileID, idx int64, replicas int, need int64) ([]string, error) {
	return m.placeExcept(fileID, idx, replicas, need, nil)
}

// placeExcept is place over the serving servers not in skip.
func (m *Master) placeExcept(fileID, idx int64, replicas int, need int64, skip map[string]bool) ([]string, error) {
	if m.warming() {
		return nil, m.errWarming()
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	var cs []placement.Candidate
	up := 0
	for id, s := range m.servers {
		if !s.serving() || skip[id] {
			continue
		}
		up++
		if free := s.info.Free(); free >= need {
			cs = append(cs, placement.Candidate{ID: id, Free: free})
		}
	}
	if len(cs) < replicas {
		return nil, errs.New(errs.ErrUnavailable, "placement needs %d servers with %d bytes free, %d of %d up servers have it: start more servers, free space, or use a pool with fewer replicas", replicas, need, len(cs), up)
	}
	return placement.Weighted([]byte(fmt.Sprintf("%d/%d", fileID, idx)), cs, replicas), nil
}

func (m *Master) status(ctx context.Context) (api.Status, error) {
	ps, err := m.meta.Pools(ctx)
	if err != nil {
		return api.Status{}, err
	}
	n, b, err := m.meta.Totals(ctx)
	if err != nil {
		return api.Status{}, err
	}
	st := api.Status{Cluster: m.cfg.Cluster, Files: n, Bytes: b}
	for _, p := range ps {
		st.Pools = append(st.Pools, api.Pool{Name: p.Name, Replicas: p.Replicas})
	}
	m.mu.Lock()
	st.Epoch = m.epoch
	for _, s := range m.servers {
		info := s.info
		info.State = drainState(info.State, m.kvHist.draining[info.ID])
		st.Servers = append(st.Servers, info)
	}
	m.mu.Unlock()
	sort.Slice(st.Servers, func(i, j int) bool { return st.Servers[i].ID < st.Servers[j].ID })
	return st, nil
}
